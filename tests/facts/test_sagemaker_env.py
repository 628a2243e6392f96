"""sagemaker.read: SM_* variables and /opt/ml/input/config files, read without raising."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddp_doctor.facts import sagemaker_env as sagemaker

P4D_RC = {"current_group_name": "homogeneousCluster", "current_host": "algo-2",
          "current_instance_type": "ml.p4d.24xlarge", "hosts": ["algo-1", "algo-2"],
          "instance_groups": [{"hosts": ["algo-2", "algo-1"], "instance_group_name": "homogeneousCluster",
                               "instance_type": "ml.p4d.24xlarge"}],
          "network_interface_name": "eth0"}


def write_config(root: Path, *, rc: Any = None, rc_text: str | None = None,
                 hyperparameters: dict[str, str] | None = None, hp_text: str | None = None) -> str:
    cfg = root / "input" / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    if rc_text is not None:
        (cfg / "resourceconfig.json").write_text(rc_text)
    elif rc is not None:
        (cfg / "resourceconfig.json").write_text(json.dumps(rc))
    if hp_text is not None:
        (cfg / "hyperparameters.json").write_text(hp_text)
    elif hyperparameters is not None:
        (cfg / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    return str(root)


def read(env: dict[str, str], root: str) -> sagemaker.SageMakerEnv:
    view = sagemaker.read(env, root)
    assert view is not None
    return view


def test_not_sagemaker(tmp_path: Path) -> None:
    assert sagemaker.read({"PATH": "/bin", "RANK": "0"}, str(tmp_path)) is None
    assert sagemaker.present({}, str(tmp_path)) is False


def test_present_from_file_alone(tmp_path: Path) -> None:
    root = write_config(tmp_path, rc=P4D_RC)
    assert sagemaker.present({}, root) is True
    view = read({}, root)
    assert view.rc_hosts == ["algo-1", "algo-2"] and view.hosts is None


@pytest.mark.parametrize("var", ["SM_HOSTS", "SM_CURRENT_HOST", "SM_TRAINING_ENV"])
def test_present_from_any_marker_variable(tmp_path: Path, var: str) -> None:
    assert sagemaker.present({var: "{}"}, str(tmp_path)) is True


def test_sm_hosts_valid_list(tmp_path: Path) -> None:
    view = read({"SM_HOSTS": '["algo-1","algo-10","algo-2"]', "SM_CURRENT_HOST": "algo-10"}, str(tmp_path))
    assert view.hosts == ["algo-1", "algo-10", "algo-2"]
    assert view.current_host == "algo-10"
    assert "SM_HOSTS" not in view.errors


@pytest.mark.parametrize("raw,words", [
    ("2", ["int", "not a list"]),
    ("algo-1,algo-2", ["not valid JSON", "JSON list"]),
    ('{"a":1}', ["dict", "not a list"]),
    ('["algo-1", 2]', ["list"]),
])
def test_sm_hosts_malformed(tmp_path: Path, raw: str, words: list[str]) -> None:
    view = read({"SM_HOSTS": raw}, str(tmp_path))
    assert view.hosts is None
    err = view.errors["SM_HOSTS"]
    assert raw in err
    for w in words:
        assert w in err


def test_resourceconfig_missing(tmp_path: Path) -> None:
    view = read({"SM_HOSTS": '["algo-1"]'}, str(tmp_path))
    assert view.resource_config is None
    assert "missing" in view.errors["resourceconfig.json"]
    assert view.rc_hosts is None and view.rc_current_host is None


def test_resourceconfig_invalid_json(tmp_path: Path) -> None:
    root = write_config(tmp_path, rc_text='{"hosts": ["algo-1",')
    view = read({"SM_HOSTS": '["algo-1"]'}, root)
    assert view.resource_config is None
    assert "unreadable" in view.errors["resourceconfig.json"]


def test_resourceconfig_is_a_list(tmp_path: Path) -> None:
    root = write_config(tmp_path, rc_text='["algo-1", "algo-2"]')
    view = read({"SM_HOSTS": '["algo-1"]'}, root)
    assert view.resource_config is None
    assert "not a JSON object" in view.errors["resourceconfig.json"]
    assert view.distribution_hosts == ["algo-1"]  # falls back to SM_HOSTS


def test_hyperparameters_json_encoded_values_become_framework_params(tmp_path: Path) -> None:
    root = write_config(tmp_path, rc=P4D_RC, hyperparameters={
        "epochs": "3", "lr": "0.1", "sagemaker_program": '"train.py"',
        "sagemaker_torch_distributed_enabled": "true", "plain": "not json",
        "sagemaker_mpi_num_of_processes_per_host": "4"})
    view = read({"SM_HOSTS": '["algo-1","algo-2"]'}, root)
    hp = view.hyperparameters
    assert hp is not None
    assert hp["epochs"] == 3 and hp["lr"] == 0.1 and hp["sagemaker_program"] == "train.py"
    assert hp["plain"] == "not json"
    assert view.framework_params["sagemaker_program"] == "train.py"
    assert view.framework_params["sagemaker_torch_distributed_enabled"] is True
    assert "epochs" not in view.framework_params
    assert view.distribution == "torch_distributed"
    assert view.expected_launcher == "torchrun"
    assert view.processes_per_host == 4


def test_sm_framework_params_win_over_hyperparameters(tmp_path: Path) -> None:
    root = write_config(tmp_path, rc=P4D_RC, hyperparameters={"sagemaker_instance_type": '"ml.g5.48xlarge"'})
    view = read({"SM_HOSTS": '["algo-1","algo-2"]',
                 "SM_FRAMEWORK_PARAMS": '{"sagemaker_instance_type": "ml.p4d.24xlarge"}'}, root)
    assert view.framework_params["sagemaker_instance_type"] == "ml.p4d.24xlarge"


def test_hyperparameters_broken_file(tmp_path: Path) -> None:
    root = write_config(tmp_path, rc=P4D_RC, hp_text="{nope")
    view = read({"SM_HOSTS": '["algo-1","algo-2"]'}, root)
    assert view.hyperparameters is None
    assert "hyperparameters.json" in view.errors
    # a missing hyperparameters file is normal, not an error
    view = read({"SM_HOSTS": '["algo-1","algo-2"]'}, write_config(tmp_path / "other", rc=P4D_RC))
    assert "hyperparameters.json" not in view.errors and view.hyperparameters is None


@pytest.mark.parametrize("flag,dist,launcher", [
    ("sagemaker_mpi_enabled", "mpi", "mpirun"),
    ("sagemaker_pytorch_ddp_enabled", "pytorchddp", "mpirun"),
    ("sagemaker_distributed_dataparallel_enabled", "smdistributed", "mpirun"),
    ("sagemaker_torch_distributed_enabled", "torch_distributed", "torchrun"),
])
def test_distribution_flags(tmp_path: Path, flag: str, dist: str, launcher: str) -> None:
    view = read({"SM_HOSTS": '["algo-1"]', "SM_FRAMEWORK_PARAMS": json.dumps({flag: True})}, str(tmp_path))
    assert view.distribution == dist
    assert view.expected_launcher == launcher
    off = read({"SM_HOSTS": '["algo-1"]', "SM_FRAMEWORK_PARAMS": json.dumps({flag: False})}, str(tmp_path))
    assert off.distribution == "none" and off.expected_launcher is None


def test_distribution_flag_order_follows_the_toolkit(tmp_path: Path) -> None:
    params = {"sagemaker_torch_distributed_enabled": True, "sagemaker_mpi_enabled": True}
    view = read({"SM_HOSTS": '["algo-1"]', "SM_FRAMEWORK_PARAMS": json.dumps(params)}, str(tmp_path))
    assert view.distribution == "mpi"


@pytest.mark.parametrize("raw,error_words", [("not json", "not valid JSON"), ("[1, 2]", "not an object")])
def test_framework_params_malformed(tmp_path: Path, raw: str, error_words: str) -> None:
    view = read({"SM_HOSTS": '["algo-1"]', "SM_FRAMEWORK_PARAMS": raw}, str(tmp_path))
    assert view.framework_params == {}
    assert error_words in view.errors["SM_FRAMEWORK_PARAMS"]


def test_p4d_distribution_hosts_in_file_order(tmp_path: Path) -> None:
    root = write_config(tmp_path, rc=P4D_RC)
    view = read({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "8",
                 "SM_FRAMEWORK_PARAMS": '{"sagemaker_torch_distributed_enabled":true}'}, root)
    assert view.hosts == ["algo-1", "algo-2"]
    assert view.distribution_hosts == ["algo-2", "algo-1"]
    assert view.master_hostname == "algo-2"  # not algo-1
    assert view.this_host == "algo-2"
    assert view.distribution_hosts.index(view.this_host) == 0
    assert view.instance_type == "ml.p4d.24xlarge"
    assert view.network_interface == "eth0"
    assert view.processes_per_host == 8
    assert view.errors == {}


def test_distribution_hosts_fallbacks(tmp_path: Path) -> None:
    # no instance_groups: training env's distribution_hosts, then resourceconfig hosts, then SM_HOSTS
    rc = {k: v for k, v in P4D_RC.items() if k != "instance_groups"}
    root = write_config(tmp_path, rc=rc)
    view = read({"SM_HOSTS": '["algo-1","algo-2"]',
                 "SM_TRAINING_ENV": json.dumps({"distribution_hosts": ["algo-2", "algo-1"]})}, root)
    assert view.distribution_hosts == ["algo-2", "algo-1"]
    view = read({"SM_HOSTS": '["algo-9"]'}, root)
    assert view.distribution_hosts == ["algo-1", "algo-2"]
    view = read({"SM_HOSTS": '["algo-9"]'}, str(tmp_path / "empty"))
    assert view.distribution_hosts == ["algo-9"] and view.master_hostname == "algo-9"
    view = read({"SM_CURRENT_HOST": "algo-1"}, str(tmp_path / "empty"))
    assert view.distribution_hosts == [] and view.master_hostname is None


def test_heterogeneous_cluster_uses_distribution_groups_only(tmp_path: Path) -> None:
    rc = {"current_host": "algo-3", "current_group_name": "gpus", "hosts": ["algo-1", "algo-2", "algo-3"],
          "instance_groups": [
              {"instance_group_name": "cpus", "instance_type": "ml.c5.18xlarge", "hosts": ["algo-1"]},
              {"instance_group_name": "gpus", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-3", "algo-2"]},
          ]}
    root = write_config(tmp_path, rc=rc)
    env = {"SM_HOSTS": '["algo-1","algo-2","algo-3"]', "SM_IS_HETERO": "true",
           "SM_DISTRIBUTION_INSTANCE_GROUPS": '["gpus"]'}
    view = read(env, root)
    assert view.is_hetero is True
    assert view.distribution_groups == ["gpus"]
    assert view.distribution_hosts == ["algo-3", "algo-2"]
    assert view.master_hostname == "algo-3"
    # without SM_IS_HETERO every group takes part, in file order
    homo = read({**env, "SM_IS_HETERO": "false"}, root)
    assert homo.is_hetero is False
    assert homo.distribution_hosts == ["algo-1", "algo-3", "algo-2"]


def test_processes_per_host_precedence(tmp_path: Path) -> None:
    base = {"SM_HOSTS": '["algo-1"]'}
    assert read(base, str(tmp_path)).processes_per_host == 1
    assert read({**base, "SM_NUM_NEURONS": "16"}, str(tmp_path)).processes_per_host == 16
    assert read({**base, "SM_NUM_NEURONS": "16", "SM_NUM_GPUS": "8"}, str(tmp_path)).processes_per_host == 8
    assert read({**base, "SM_NUM_NEURONS": "16", "SM_NUM_GPUS": "0"}, str(tmp_path)).processes_per_host == 16
    mpi = {**base, "SM_NUM_GPUS": "8",
           "SM_FRAMEWORK_PARAMS": '{"sagemaker_mpi_num_of_processes_per_host": 2}'}
    assert read(mpi, str(tmp_path)).processes_per_host == 2


def test_sm_num_gpus_not_a_number(tmp_path: Path) -> None:
    view = read({"SM_HOSTS": '["algo-1"]', "SM_NUM_GPUS": "eight"}, str(tmp_path))
    assert view.num_gpus is None
    assert "eight" in view.errors["SM_NUM_GPUS"]
    assert view.processes_per_host == 1


def test_this_host_prefers_the_file(tmp_path: Path) -> None:
    # under the MPI runner every rank sees the master's SM_CURRENT_HOST
    root = write_config(tmp_path, rc=P4D_RC)
    view = read({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-1"}, root)
    assert view.current_host == "algo-1"
    assert view.rc_current_host == "algo-2"
    assert view.this_host == "algo-2"
    no_file = read({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-1"}, str(tmp_path / "x"))
    assert no_file.this_host == "algo-1"


def test_config_root_honours_env(tmp_path: Path) -> None:
    assert sagemaker.config_root({}) == "/opt/ml"
    assert sagemaker.config_root({"DDP_DOCTOR_SM_ROOT": str(tmp_path)}) == str(tmp_path)
    write_config(tmp_path, rc=P4D_RC)
    # no root argument: read() must look under DDP_DOCTOR_SM_ROOT
    view = sagemaker.read({"DDP_DOCTOR_SM_ROOT": str(tmp_path)})
    assert view is not None
    assert view.root == str(tmp_path)
    assert view.master_hostname == "algo-2"


def test_instance_type_sources(tmp_path: Path) -> None:
    root = write_config(tmp_path, rc=P4D_RC)
    assert read({"SM_CURRENT_INSTANCE_TYPE": "ml.g5.48xlarge"}, root).instance_type == "ml.g5.48xlarge"
    assert read({"SM_HOSTS": '["a"]', "SM_FRAMEWORK_PARAMS": '{"sagemaker_instance_type":"ml.p5.48xlarge"}'},
                str(tmp_path / "none")).instance_type == "ml.p5.48xlarge"


def test_broken_instance_group_entries_are_skipped(tmp_path: Path) -> None:
    rc = {**P4D_RC, "instance_groups": ["junk", {"instance_group_name": "g", "hosts": "algo-1"},
                                        {"instance_group_name": "h", "hosts": ["algo-2"]}]}
    view = read({"SM_HOSTS": '["algo-1","algo-2"]'}, write_config(tmp_path, rc=rc))
    assert view.distribution_hosts == ["algo-2"]
