"""SLURM local checks (DDP230-DDP231): a failing and a passing case each, and the job's view
(facts/slurm.py: SLURM's compressed host lists). srun for real: tests/slurm/test_srun_e2e.py."""
from __future__ import annotations

import pytest
from helpers.context import make_ctx, torchrun_env

from ddp_doctor.check_runner import run_stage
from ddp_doctor.facts import slurm
from ddp_doctor.findings import Finding

IDS = ("DDP230", "DDP231")


def found(env: dict[str, str]) -> list[Finding]:
    ctx = make_ctx(env)
    out = run_stage("local", (ctx,), rank=ctx.rank, select=list(IDS))
    assert not [f for f in out if f.id in ("DDP001", "DDP002")], [f.message for f in out]
    return [f for f in out if f.id in IDS]


def job(nodes: str = "gpu[01-02]", tasks: int = 2, nnodes: int = 2, node: str = "gpu01") -> dict[str, str]:
    """What srun gives a task of step 0 of job 77 (the variables torchrun under it inherits)."""
    return {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": nodes, "SLURM_STEP_ID": "0", "SLURMD_NODENAME": node,
            "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_STEP_NUM_NODES": str(nnodes), "SLURM_NNODES": str(nnodes)}


@pytest.mark.parametrize("text, hosts", [
    ("vm", ["vm"]),
    ("gpu[01-03,7]", ["gpu01", "gpu02", "gpu03", "gpu7"]),  # each entry keeps its own width
    ("a[1-2],login1,b[9-10]x", ["a1", "a2", "login1", "b9x", "b10x"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
])
def test_host_lists_expand_as_slurm_writes_them(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[3-1]", "n[1-2", "n[a-b]", "", "n[1-100000000]"])
def test_a_host_list_that_cannot_be_read_is_none(text):
    assert slurm.expand_hostlist(text) is None


def test_one_torchrun_per_node_passes():
    env = {**job(), **torchrun_env(rank=0, world_size=4, local_world_size=2, nnodes=2, master_addr="gpu01")}
    assert found(env) == []


def test_torchrun_with_nnodes_1_on_a_two_node_step_is_two_jobs():
    env = {**job(), **torchrun_env(rank=0, world_size=2, local_world_size=2, nnodes=1, master_addr="127.0.0.1")}
    f, loopback = found(env)  # and each node's master is its own loopback
    assert loopback.id == "DDP231"
    assert f.id == "DDP230" and "srun started 2 task(s)" in f.message and "counts 1 node(s)" in f.message
    assert "2 copies of a 1-node job" in f.message


def test_a_torchrun_per_gpu_task_is_many_launchers_per_node():
    env = {**job(nodes="gpu01", tasks=8, nnodes=1), **torchrun_env(rank=3, world_size=8, local_world_size=8, nnodes=1)}
    [f] = found(env)
    assert f.id == "DDP230" and "srun started 8 task(s)" in f.message and "8 copies" in f.message


def test_outside_srun_or_slurm_nothing_is_said():
    env = {**job(), **torchrun_env(rank=0, world_size=2, local_world_size=2, nnodes=1)}
    del env["SLURM_STEP_ID"]  # torchrun started in the batch script itself, not by srun
    assert [f.id for f in found(env)] == []
    assert found(torchrun_env(rank=0, world_size=2, local_world_size=2, nnodes=1)) == []


def srun_rank(master: str, **kw: str) -> dict[str, str]:
    return {**job(tasks=4), "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_NODEID": "1",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "MASTER_ADDR": master, "MASTER_PORT": "29500", **kw}


@pytest.mark.parametrize("master", ["gpu01", "gpu01.cluster.local", "10.1.0.4"])
def test_a_master_among_the_jobs_nodes_or_an_address_passes(master):
    assert found(srun_rank(master)) == []


@pytest.mark.parametrize("master, why", [("localhost", "a master of their own"), ("127.0.0.1", "a master of their own"),
                                         ("login1", "no rank of this job listens there")])
def test_a_master_outside_the_job_is_named(master, why):
    [f] = found(srun_rank(master))
    assert f.id == "DDP231" and f"MASTER_ADDR={master} but SLURM job 77 runs on gpu01, gpu02" in f.message
    assert why in f.message and "scontrol show hostnames" in f.hint


def test_one_node_may_use_loopback():
    env = {**job(nodes="gpu01", tasks=2, nnodes=1), "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
           "SLURM_NODEID": "0", "MASTER_ADDR": "127.0.0.1"}
    assert found(env) == []
