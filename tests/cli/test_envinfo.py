"""`ddp-doctor env`: the paste-ready summary."""
from __future__ import annotations

import json
from pathlib import Path

from helpers.context import NO_SM_ROOT, sm_env, torchrun_env, write_sm_config

from ddp_doctor.cli.env_summary import collect_env, render_env

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HF = "hf_abcdefghijklmnopqrstuvwxyz0123"
KEYS = ("ddp_doctor", "python", "platform", "os", "torch", "transformers", "accelerate", "lightning", "numpy", "psutil",
        "nvidia_ml_py", "cuda_available", "cpu_count", "memory", "hostname", "launcher", "world",
        "sagemaker", "gpus", "env")


def test_keys_present_and_rendered() -> None:
    data = collect_env({**torchrun_env(rank=1, world_size=2), "NCCL_DEBUG": "INFO",
                        "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/root", "DDP_DOCTOR_SM_ROOT": NO_SM_ROOT})
    for key in KEYS:
        assert key in data, key
    assert data["launcher"] == "torchrun" and data["sagemaker"] is None
    assert data["world"]["rank"] == 1 and data["world"]["world_size"] == 2
    assert data["gpus"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert data["env"]["NCCL_DEBUG"] == "INFO" and "HOME" not in data["env"]
    if data["cuda_available"] is False:
        assert "nccl" not in data  # NCCL is reported only where CUDA works
    assert data["lightning"] != "not installed" and data["os"]  # Lightning's version and the distribution
    json.dumps(data)  # `ddp-doctor env --json` needs plain data
    text = render_env(data)
    assert "- torch: " in text and "- launcher: torchrun" in text
    assert "```\n" in text and "NCCL_DEBUG=INFO" in text and text.rstrip().endswith("```")


def test_planted_secrets_are_redacted_in_dict_and_text() -> None:
    env = {"AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
           "HF_TOKEN": HF, "WANDB_API_KEY": "0123456789abcdef0123", "AWS_REGION": "us-east-1",
           "SM_HP_NOTE": f"quoted {SECRET} here", "DDP_DOCTOR_SM_ROOT": NO_SM_ROOT}
    data = collect_env(env)
    assert data["env"]["AWS_SECRET_ACCESS_KEY"] == "***"
    assert data["env"]["HF_TOKEN"] == "***" and data["env"]["WANDB_API_KEY"] == "***"
    assert data["env"]["AWS_REGION"] == "us-east-1"  # presence and harmless values stay visible
    text = render_env(data)
    for secret in (SECRET, HF, "AKIAIOSFODNN7EXAMPLE", "0123456789abcdef0123"):
        assert secret not in json.dumps(data) and secret not in text, secret
    assert "AWS_SECRET_ACCESS_KEY=***" in text


def test_sagemaker_summary(tmp_path: Path) -> None:
    root = write_sm_config(tmp_path, hosts=("algo-1", "algo-2"), current_host="algo-1",
                           instance_groups=[{"instance_group_name": "homogeneousCluster",
                                             "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-2", "algo-1"]}])
    env = {**sm_env(("algo-1", "algo-2"), "algo-1"), "DDP_DOCTOR_SM_ROOT": root}
    sm = collect_env(env)["sagemaker"]
    assert sm["hosts"] == ["algo-1", "algo-2"] and sm["current_host"] == "algo-1"
    assert sm["master"] == "algo-2"  # instance_groups order decides, not algo-1
    assert sm["instance_type"] == "ml.p4d.24xlarge" and sm["distribution"] == "torch_distributed"
    assert sm["processes_per_host"] == 8 and "errors" not in sm


def test_malformed_sagemaker_env_does_not_raise(tmp_path: Path) -> None:
    env = {**sm_env(("algo-1",), "algo-1"), "SM_HOSTS": "algo-1,algo-2", "SM_NUM_GPUS": "eight",
           "SM_FRAMEWORK_PARAMS": "{not json", "MASTER_PORT": "port", "DDP_DOCTOR_SM_ROOT": str(tmp_path)}
    data = collect_env(env)
    sm = data["sagemaker"]
    assert sm["hosts"] == "algo-1,algo-2"  # shown as found, with the reason beside it
    assert "SM_HOSTS" in sm["errors"] and "JSON list" in sm["errors"]["SM_HOSTS"]
    assert "resourceconfig.json" in sm["errors"]
    assert "MASTER_PORT" in data["world"]["invalid"]
    assert "SM_HOSTS=algo-1,algo-2" in render_env(data)
