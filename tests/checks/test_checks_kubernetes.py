"""Kubernetes local checks (DDP220-DDP222) in the pods Kubeflow's operators make (PyTorchJob and
TrainJob, ddp_doctor.testing.kubeflow_pod_env): a failing and a passing case each, the pod's view
(facts/kubernetes.py) and torchrun_pod, which decides whether `run` launches or is a rank."""
from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from helpers.context import make_ctx, torchrun_env
from helpers.procs import DDP, NO_SWEEP, clean_env

from ddp_doctor.check_runner import run_stage
from ddp_doctor.facts import kubernetes
from ddp_doctor.facts.launchers import torchrun_pod
from ddp_doctor.findings import Finding
from ddp_doctor.testing import kubeflow_pod_env

IDS = ("DDP220", "DDP221", "DDP222")


def found(env: dict[str, str]) -> list[Finding]:
    ctx = make_ctx(env)
    out = run_stage("local", (ctx,), rank=ctx.rank, select=list(IDS))
    assert not [f for f in out if f.id in ("DDP001", "DDP002")], [f.message for f in out]
    return [f for f in out if f.id in IDS]


def rank_of(pod: dict[str, str], *, local_rank: int = 0, per_pod: int = 2, nodes: int = 2, node: int | None = None,
            master: str | None = None, **kw: Any) -> dict[str, str]:
    """A rank torchrun started in that pod: the pod's variables, then torchrun's for its workers."""
    node = int(pod["PET_NODE_RANK"]) if node is None else node
    addr = master or pod.get("PET_MASTER_ADDR", "127.0.0.1")
    return {**pod, **torchrun_env(rank=node * per_pod + local_rank, local_rank=local_rank, world_size=nodes * per_pod,
                                  local_world_size=per_pod, group_rank=node, nnodes=nodes, master_addr=addr, **kw)}


@pytest.mark.parametrize("operator", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("index", [0, 1])
def test_a_launch_that_follows_the_operator_passes(operator, index):
    assert found(rank_of(kubeflow_pod_env(operator, index=index))) == []


def test_outside_kubernetes_nothing_is_said():
    env = rank_of(kubeflow_pod_env("pytorchjob", index=1), nodes=1, node=0, master="localhost")
    del env["KUBERNETES_SERVICE_HOST"]
    assert found(env) == []


@pytest.mark.parametrize("operator", ["pytorchjob", "trainjob"])
def test_a_command_with_nnodes_1_makes_each_pod_a_job_of_its_own(operator):
    # `torchrun --nnodes 1 --nproc-per-node 2 train.py` in a two-pod job: WORLD_SIZE 2, not 4
    [f] = found(rank_of(kubeflow_pod_env(operator, index=0), nodes=1, node=0, master="127.0.0.1"))
    assert f.id == "DDP220" and f.severity == "error"
    assert "WORLD_SIZE=2 but the" in f.message and "2 pod(s) (PET_NNODES) x 2 process(es) per pod" in f.message
    assert "each pod forms a job of its own" in f.message and "torchrun train.py" in f.hint


def test_one_process_per_pod_where_world_size_counts_two_waits_at_the_rendezvous():
    env = kubeflow_pod_env("pytorchjob", index=1)  # `python train.py`: RANK and WORLD_SIZE are the pod's
    [f] = found(env)
    assert f.id == "DDP220" and "this pod runs one process" in f.message and "WORLD_SIZE=4" in f.message
    # nprocPerNode "auto": WORLD_SIZE counts the pods, one process per pod is the job's layout
    assert found(kubeflow_pod_env("pytorchjob", index=1, nproc_per_node="auto")) == []


@pytest.mark.parametrize("operator, source", [("pytorchjob", "the pod name train-worker-0"),
                                              ("trainjob", "JOB_COMPLETION_INDEX")])
def test_a_node_rank_written_into_the_command_is_named(operator, source):
    # `--node-rank 0` in every pod: pod 1 claims node 0 too
    [f] = found(rank_of(kubeflow_pod_env(operator, index=1), node=0))
    assert f.id == "DDP221" and "node 0 (GROUP_RANK) but it is node 1" in f.message and source in f.message


@pytest.mark.parametrize("operator, expected", [("pytorchjob", "train-master-0"),
                                                ("trainjob", "train-node-0-0.train")])
def test_a_master_address_of_its_own_on_a_worker_pod_is_named(operator, expected):
    [f] = found(rank_of(kubeflow_pod_env(operator, index=1), master="localhost"))
    assert f.id == "DDP222" and "MASTER_ADDR=localhost on pod" in f.message and expected in f.message
    assert "wait for a master of their own" in f.message
    # the service's longer names are the same master; the master pod itself may name itself
    assert found(rank_of(kubeflow_pod_env(operator, index=1), master=expected + ".default.svc.cluster.local")) == []
    assert found(rank_of(kubeflow_pod_env(operator, index=0), master="localhost")) == []


def test_an_elastic_job_gives_node_ranks_and_master_by_its_rendezvous():
    pod = {**kubeflow_pod_env("pytorchjob", index=1), "PET_RDZV_BACKEND": "c10d",
           "PET_RDZV_ENDPOINT": "train-worker-0:23456", "PET_NNODES": "1:4"}
    assert found(rank_of(pod, node=0, master="10.0.0.9")) == []


def test_the_pods_view():
    pod = kubernetes.read(kubeflow_pod_env("pytorchjob", index=2, pods=3))
    assert pod is not None and (pod.operator, pod.job, pod.index, pod.nnodes) == ("pytorchjob", "train", 2, 3)
    assert pod.expected_master == "train-master-0"
    pod = kubernetes.read(kubeflow_pod_env("trainjob", job="llm", index=3, pods=4))
    assert pod is not None and (pod.operator, pod.job, pod.index) == ("trainjob", "llm", 3)
    assert pod.expected_master == "llm-node-0-0.llm"
    assert kubernetes.read({"HOSTNAME": "train-master-0"}) is None  # not in a pod
    plain = kubernetes.read({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "web-5d8f"})
    assert plain is not None and plain.operator == ""


@pytest.mark.parametrize("operator, nproc, launches", [("pytorchjob", "2", True), ("trainjob", "2", True),
                                                        ("trainjob", "auto", True), ("pytorchjob", "auto", False)])
def test_run_launches_where_torchrun_would(operator, nproc, launches):
    assert torchrun_pod(kubeflow_pod_env(operator, index=1, nproc_per_node=nproc)) is launches


@pytest.mark.slow
def test_run_in_a_pod_whose_command_sets_its_own_layout_stops_before_training(tmp_path):
    # the master pod of a two-pod PyTorchJob whose command says --nnodes 1: its two ranks would
    # train alone, as would the other pod's; the preflight says so and the script never starts
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    pod = {**kubeflow_pod_env("pytorchjob", pods=2, nproc_per_node="2"), "MASTER_ADDR": "127.0.0.1",
           "PET_MASTER_ADDR": "127.0.0.1"}
    res = subprocess.run([*DDP, "run", "--nnodes", "1", *NO_SWEEP, "--report", str(tmp_path / "r.json"), str(script)],
                         env=clean_env(**pod), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert res.returncode == 3, res.stderr[-3000:]
    assert "trained" not in res.stdout
    cause = json.loads((tmp_path / "r.json").read_text())["root_cause"]
    assert cause["id"] == "DDP220" and cause["ranks"] == [0, 1], cause
    assert (cause["cause_class"], cause["action"]) == ("configuration", "fix_configuration")
    assert "each pod forms a job of its own" in res.stderr
