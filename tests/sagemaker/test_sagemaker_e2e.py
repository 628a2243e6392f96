"""A two-host SageMaker torch_distributed job simulated on one machine: each host runs in its own
UTS/mount namespace (host name algo-1 / algo-2, /etc/hosts mapping both to loopback addresses),
with its own /opt/ml/input/config and the SM_* variables the training toolkit sets, launched the
way the toolkit launches torchrun (node rank = position in the instance group's host list)."""
from __future__ import annotations

import json

import pytest
from helpers.context import write_sm_config
from helpers.nodes import run_nodes
from helpers.procs import clean_env, ids, load_json, outputs

pytestmark = pytest.mark.slow
HOSTS = ["algo-1", "algo-2"]
# A real p4d layout (docs/facts.md): the instance group lists algo-2 first, so algo-2 is the master.
GROUP_ORDER = ["algo-2", "algo-1"]


def sm_node_env(tmp_path, host: str) -> dict[str, str]:
    root = write_sm_config(tmp_path / host, hosts=HOSTS, current_host=host, instance_type="ml.c5.xlarge",
                           instance_groups=[{"instance_group_name": "homogeneousCluster",
                                             "instance_type": "ml.c5.xlarge", "hosts": GROUP_ORDER}])
    params = {"sagemaker_torch_distributed_enabled": True, "sagemaker_instance_type": "ml.c5.xlarge"}
    return clean_env(
        SM_HOSTS=json.dumps(HOSTS), SM_CURRENT_HOST=host, SM_NUM_GPUS="0", SM_NUM_CPUS="2",
        SM_CURRENT_INSTANCE_TYPE="ml.c5.xlarge", SM_NETWORK_INTERFACE_NAME="lo",
        SM_FRAMEWORK_PARAMS=json.dumps(params),
        SM_TRAINING_ENV=json.dumps({"master_hostname": GROUP_ORDER[0], "job_name": "ddp-doctor-test"}),
        DDP_DOCTOR_SM_ROOT=root, NCCL_SOCKET_IFNAME="lo")


def launch(tmp_path, master: str, node_rank_of) -> tuple[list, dict]:
    report = tmp_path / "report.json"
    results = run_nodes(tmp_path, HOSTS, ["preflight", "--timeout", "20", "--report", str(report)],
                        master=master, node_rank_of=node_rank_of,
                        env_for=lambda host: sm_node_env(tmp_path, host))
    return results, load_json(str(report))


def test_toolkit_launch_with_master_from_instance_group_order_passes(tmp_path):
    results, rep = launch(tmp_path, GROUP_ORDER[0], GROUP_ORDER.index)
    assert all(r.rc == 0 for r in results), outputs(results)
    assert rep["status"] in ("pass", "warn"), rep["findings"]
    assert not ids(rep, "error")
    assert rep["world"]["platform"] == "sagemaker" and rep["world"]["world_size"] == 2
    assert {(r["rank"], r["host"]) for r in rep["ranks"]} == {(0, "algo-2"), (1, "algo-1")}
    assert "DDP206" in ids(rep, "info")  # the master is algo-2, not algo-1: said as info


def test_script_that_assumes_algo_1_is_master_is_caught(tmp_path):
    # A common recipe: MASTER_ADDR=algo-1 and node rank = index in SM_HOSTS. It forms a group, but
    # disagrees with the toolkit's master and node ranks.
    results, rep = launch(tmp_path, "algo-1", HOSTS.index)
    found = ids(rep)
    assert "DDP207" in found and "DDP209" in found, rep["findings"]
    msg = next(f["message"] for f in rep["findings"] if f["id"] == "DDP207")
    assert "algo-1" in msg and "algo-2" in msg
