from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.context import make_ctx, sm_env, torchrun_env, write_sm_config

import ddp_doctor
from ddp_doctor.preflight_ranks.rank_view import collect_view, comm_env, script_digest, versions
from ddp_doctor.report.redact import MASK

KEYS = {"rank", "local_rank", "node_rank", "world_size", "local_world_size", "launcher", "backend",
        "hostname", "sm_host", "pid", "time", "device", "device_uuid", "versions", "env", "entry_script"}


def test_view_of_a_cpu_torchrun_rank(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = {**torchrun_env(rank=1, world_size=2), "NCCL_DEBUG": "WARN", "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "4", "PATH": "/usr/bin", "HF_TOKEN": "hf_planted"}
    view = collect_view(make_ctx(env, hostname="node-a", entry_script=str(script)))
    assert set(view) == KEYS
    assert (view["rank"], view["local_rank"], view["world_size"], view["local_world_size"]) == (1, 1, 2, 2)
    assert view["launcher"] == "torchrun" and view["backend"] == "gloo"
    assert view["hostname"] == "node-a" and view["sm_host"] is None
    assert view["device"] == "cpu" and view["device_uuid"] is None
    assert view["pid"] == os.getpid()
    assert view["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "4"}
    assert view["entry_script"] == {"path": str(script),
                                    "sha256": hashlib.sha256(script.read_bytes()).hexdigest()}
    json.dumps(view)  # JSON-serialisable


def test_view_of_a_sagemaker_nccl_rank_without_a_gpu_here(tmp_path: Path) -> None:
    root = write_sm_config(tmp_path, hosts=["algo-1", "algo-2"], current_host="algo-2")
    env = {**sm_env(["algo-1", "algo-2"], "algo-2"),
           **torchrun_env(rank=11, world_size=16, local_world_size=8, master_addr="algo-1"),
           "NCCL_SOCKET_IFNAME": "eth0", "FI_PROVIDER": "efa", "SMDATAPARALLEL_SERVER_ADDR": "algo-1",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    # 8 GPUs claimed by the host facts, but torch here has no CUDA: no UUID, no CUDA init.
    view = collect_view(make_ctx(env, gpus=8, sm_root=root))
    assert view["backend"] == "nccl" and view["device"] == "cuda:3" and view["device_uuid"] is None
    assert view["sm_host"] == "algo-2" and view["node_rank"] == 1
    assert set(view["env"]) == {"NCCL_SOCKET_IFNAME", "FI_PROVIDER", "SMDATAPARALLEL_SERVER_ADDR",
                                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES"}
    assert view["entry_script"] is None


def test_view_redacts_secrets_in_comm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "planted-wandb-key-123")
    env = {"NCCL_IB_PASSWORD": "s3cr3t-value", "NCCL_DEBUG_FILE": "/tmp/planted-wandb-key-123.log"}
    view = collect_view(make_ctx(env))
    assert view["env"]["NCCL_IB_PASSWORD"] == MASK
    assert "planted-wandb-key-123" not in json.dumps(view)


def test_versions_use_metadata_and_none_for_missing() -> None:
    v = versions()
    assert set(v) == {"python", "torch", "cuda", "nccl", "transformers", "accelerate", "numpy", "ddp_doctor"}
    import torch
    assert v["torch"] == torch.__version__
    assert v["ddp_doctor"] == ddp_doctor.__version__
    assert v["python"] == ".".join(map(str, sys.version_info[:3]))
    if not torch.cuda.is_available():
        assert v["nccl"] is None


@pytest.mark.slow
def test_collect_view_does_not_import_heavy_libraries() -> None:
    code = ("import sys; from ddp_doctor.preflight_ranks.rank_view import collect_view; "
            "from ddp_doctor.context import current_context; collect_view(current_context()); "
            "print(sorted(m for m in ('transformers', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_comm_env_filters_and_sorts() -> None:
    env = {"NCCL_B": "1", "NCCL_A": "2", "FI_X": "3", "CUDA_VISIBLE_DEVICES": "0", "HOME": "/root",
           "MY_NCCL": "no"}
    assert list(comm_env(env)) == ["CUDA_VISIBLE_DEVICES", "FI_X", "NCCL_A", "NCCL_B"]


def test_script_digest_unreadable(tmp_path: Path) -> None:
    assert script_digest(None) is None
    assert script_digest(str(tmp_path / "missing.py")) is None
    assert script_digest(str(tmp_path)) is None  # a directory
