"""Launcher detection (launchers.detect / launcher_name) and the RankContext built on top of it."""
from __future__ import annotations

from typing import Any

import pytest

from ddp_doctor.context import RankContext, build_context, choose_backend
from ddp_doctor.facts import launchers
from ddp_doctor.facts.env_values import Invalid
from ddp_doctor.facts.host import HostFacts

NO_SM = "/nonexistent/ddp-doctor-tests/opt-ml"


def facts(gpus: int = 0) -> HostFacts:
    return HostFacts(hostname="h", interfaces=("lo",), visible_gpus=gpus,
                     physical_gpus=gpus or None, backends=("gloo", "nccl") if gpus else ("gloo",))


def torchrun_env(rank: int = 1, local_rank: int = 1, world_size: int = 4, local_world_size: int = 2,
                 group_rank: int = 0, group_world_size: int = 2) -> dict[str, str]:
    """The variables torchrun 2.13 really sets in a worker (observed with --standalone)."""
    return {
        "OMP_NUM_THREADS": "1", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "RANK": str(rank), "GROUP_RANK": str(group_rank), "ROLE_RANK": str(rank), "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(local_world_size), "WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": str(group_world_size), "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "localhost", "MASTER_PORT": "37529", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "ab34c813-9ef0-4bda-adda-9e2871b217d7",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "LOCAL_RANK": str(local_rank),
        "TORCHELASTIC_ERROR_FILE": "/tmp/torchelastic_x/attempt_0/1/error.json",
    }


def ompi_env(rank: int, local_rank: int, size: int, local_size: int) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
            "OMPI_COMM_WORLD_SIZE": str(size), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size)}


# ---------------------------------------------------------------- launcher_name / detect

def test_torchrun_env_as_torchrun_sets_it() -> None:
    env = torchrun_env(rank=3, local_rank=1, world_size=4, local_world_size=2, group_rank=1, group_world_size=2)
    assert launchers.launcher_name(env) == "torchrun"
    info = launchers.detect(env)
    assert info.name == "torchrun"
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (3, 1, 4, 2)
    assert (info.node_rank, info.nnodes) == (1, 2)
    assert info.master_addr == "localhost" and info.master_port == 37529
    assert info.agent_store is True
    assert info.invalid == {}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"):
        assert info.variables[name] == env[name]


def test_torchrun_without_agent_store() -> None:
    env = torchrun_env()
    env["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    assert launchers.detect(env).agent_store is False
    del env["TORCHELASTIC_USE_AGENT_STORE"]
    assert launchers.detect(env).agent_store is False


def test_open_mpi_derives_node_rank_and_nnodes() -> None:
    env = ompi_env(rank=13, local_rank=5, size=16, local_size=8)
    env.update(MASTER_ADDR="algo-2", MASTER_PORT="7777")
    assert launchers.launcher_name(env) == "mpirun"
    info = launchers.detect(env)
    assert info.name == "mpirun"
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (13, 5, 16, 8)
    assert (info.node_rank, info.nnodes) == (1, 2)
    assert info.master_addr == "algo-2" and info.master_port == 7777
    assert info.agent_store is False
    assert info.variables["OMPI_COMM_WORLD_RANK"] == "13"


def test_open_mpi_uneven_layout_leaves_node_rank_unknown() -> None:
    info = launchers.detect(ompi_env(rank=4, local_rank=1, size=7, local_size=3))
    assert info.world_size == 7 and info.local_world_size == 3
    assert info.node_rank is None and info.nnodes is None


def test_mpich_intel_mpi() -> None:
    env = {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
    assert launchers.launcher_name(env) == "mpich"
    info = launchers.detect(env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (5, 1, 8, 4)
    assert (info.node_rank, info.nnodes) == (1, 2)


def test_pmi_rank_without_size_is_not_mpich() -> None:
    assert launchers.launcher_name({"PMI_RANK": "0"}) == "none"


def test_slurm_with_step_tasks_per_node() -> None:
    env = {"SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NTASKS": "8", "SLURM_NNODES": "2",
           "SLURM_NODEID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
           "SLURM_JOB_ID": "1234"}
    assert launchers.launcher_name(env) == "slurm"
    info = launchers.detect(env)
    assert info.name == "slurm"
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (6, 2, 8, 4)
    assert (info.node_rank, info.nnodes) == (1, 2)
    assert info.invalid == {}
    assert info.variables["SLURM_NODEID"] == "1" and info.variables["SLURM_NNODES"] == "2"


@pytest.mark.parametrize("raw,expected", [("8", 8), ("8(x2)", 8), ("8(x2),4", 8), ("3,2", 3)])
def test_slurm_tasks_per_node_forms(raw: str, expected: int) -> None:
    env = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "11", "SLURM_STEP_ID": "0",
           "SLURM_STEP_TASKS_PER_NODE": raw}
    assert launchers.detect(env).local_world_size == expected


@pytest.mark.parametrize("node_id,expected", [(0, 4), (1, 4), (2, 2), (3, 1), (9, 4)])
def test_slurm_uneven_tasks_per_node_picks_this_node(node_id: int, expected: int) -> None:
    # 11 tasks on 4 nodes: "4(x2),2,1"; this node's count is the entry at SLURM_NODEID
    env = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "11", "SLURM_NNODES": "4",
           "SLURM_STEP_ID": "0", "SLURM_NODEID": str(node_id), "SLURM_STEP_TASKS_PER_NODE": "4(x2),2,1"}
    assert launchers.detect(env).local_world_size == expected


def test_slurm_small_node_first_no_false_local_rank_bound() -> None:
    # "2,4": node 1 runs 4 tasks, so SLURM_LOCALID=3 there is fine
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "3", "SLURM_NTASKS": "6", "SLURM_NNODES": "2",
           "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2,4"}
    info = launchers.detect(env)
    assert info.local_world_size == 4 and info.local_rank == 3 and info.node_rank == 1


def test_slurm_garbled_tasks_per_node_is_invalid() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0",
           "SLURM_NTASKS_PER_NODE": "lots"}
    info = launchers.detect(env)
    assert info.local_world_size is None
    assert "SLURM_NTASKS_PER_NODE" in info.invalid


def test_slurm_allocation_without_step_is_not_a_launcher() -> None:
    # sbatch sets SLURM_PROCID in the batch script, but no srun step started the ranks.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "1"}
    assert launchers.launcher_name(env) == "none"


def test_generic_env_rank_and_world_size_only() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert launchers.launcher_name(env) == "env"
    info = launchers.detect(env)
    assert info.name == "env"
    assert (info.rank, info.world_size) == (1, 2)
    assert info.local_rank is None and info.local_world_size is None
    assert info.node_rank is None and info.nnodes is None
    assert info.master_addr == "10.0.0.1" and info.master_port == 29500
    assert info.variables == {"RANK": "1", "LOCAL_RANK": None, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": None}


def test_spawn_explicit_rank_and_world_size() -> None:
    info = launchers.detect({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501"}, rank=1, world_size=2)
    assert info.name == "spawn"
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (1, 1, 2, 2)
    assert info.node_rank == 0 and info.nnodes == 1
    assert info.master_port == 29501
    # spawn wins over whatever launcher variables the parent left behind
    info = launchers.detect(torchrun_env(), rank=0, world_size=3, local_rank=0)
    assert info.name == "spawn" and info.rank == 0 and info.world_size == 3


def test_plain_process() -> None:
    info = launchers.detect({"PATH": "/usr/bin", "HOME": "/root"})
    assert info.name == "none"
    assert info.rank is None and info.world_size is None
    assert info.master_addr is None and info.master_port is None
    assert info.invalid == {}


def test_plain_process_with_master_vars_only() -> None:
    info = launchers.detect({"MASTER_ADDR": "h", "MASTER_PORT": "x"})
    assert info.name == "none"
    assert info.master_addr == "h"
    assert info.master_port is None
    assert "MASTER_PORT" in info.invalid


@pytest.mark.parametrize("env,bad", [
    ({**torchrun_env(), "RANK": "one"}, "RANK"),
    ({**torchrun_env(), "WORLD_SIZE": "2.0"}, "WORLD_SIZE"),
    ({**torchrun_env(), "GROUP_RANK": "zero"}, "GROUP_RANK"),
    ({**torchrun_env(), "MASTER_PORT": "29500abc"}, "MASTER_PORT"),
    ({**ompi_env(0, 0, 2, 2), "OMPI_COMM_WORLD_SIZE": "two"}, "OMPI_COMM_WORLD_SIZE"),
    ({"PMI_RANK": "r", "PMI_SIZE": "2"}, "PMI_RANK"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NODEID": "?", "SLURM_NTASKS": "1"}, "SLURM_NODEID"),
    ({"RANK": "0", "WORLD_SIZE": "[2]"}, "WORLD_SIZE"),
])
def test_non_integer_values_are_invalid_and_never_raise(env: dict[str, str], bad: str) -> None:
    info = launchers.detect(env)
    assert bad in info.invalid
    inv = info.invalid[bad]
    assert isinstance(inv, Invalid) and inv.raw == env[bad] and "integer" in inv.why


def test_invalid_value_reads_as_none() -> None:
    info = launchers.detect({**torchrun_env(), "RANK": "one"})
    assert info.rank is None
    assert info.world_size == 4  # the others still parse


def test_whitespace_is_tolerated_and_empty_is_unset() -> None:
    info = launchers.detect({"RANK": " 2 ", "WORLD_SIZE": "4", "LOCAL_RANK": ""})
    assert info.rank == 2 and info.local_rank is None and info.invalid == {}


def test_torchelastic_wins_over_open_mpi() -> None:
    env = {**ompi_env(0, 0, 16, 8), **torchrun_env(rank=2, world_size=4)}
    assert launchers.launcher_name(env) == "torchrun"
    info = launchers.detect(env)
    assert info.name == "torchrun" and info.rank == 2 and info.world_size == 4


def test_open_mpi_wins_over_generic_rank() -> None:
    env = {**ompi_env(1, 1, 2, 2), "RANK": "0", "WORLD_SIZE": "2"}
    assert launchers.launcher_name(env) == "mpirun"
    assert launchers.detect(env).rank == 1


def test_empty_run_id_is_not_torchrun() -> None:
    assert launchers.launcher_name({"TORCHELASTIC_RUN_ID": "", "RANK": "0", "WORLD_SIZE": "1"}) == "env"


# ---------------------------------------------------------------- context

def test_build_context_shorthands() -> None:
    ctx = build_context(torchrun_env(rank=3, local_rank=1, world_size=4, group_rank=1), facts(),
                        sm_root=NO_SM)
    assert isinstance(ctx, RankContext)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (3, 1, 4, 2)
    assert (ctx.node_rank, ctx.nnodes, ctx.master_addr, ctx.master_port) == (1, 2, "localhost", 37529)
    assert ctx.sagemaker is None
    assert ctx.backend == "gloo" and ctx.device == "cpu"
    assert ctx.env["RANK"] == "3"


def test_build_context_copies_env() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1"}
    ctx = build_context(env, facts(), sm_root=NO_SM)
    env["RANK"] = "5"
    assert ctx.env["RANK"] == "0"


def test_backend_precedence(tmp_path: Any) -> None:
    sm_env = {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1",
              "SM_FRAMEWORK_PARAMS": '{"sagemaker_distributed_dataparallel_enabled": true}'}
    from ddp_doctor.facts import sagemaker_env as sagemaker
    sm = sagemaker.read(sm_env, str(tmp_path))
    assert sm is not None and sm.distribution == "smdistributed"
    # explicit beats everything
    assert choose_backend({"DDP_DOCTOR_BACKEND": "nccl"}, sm, facts(8), "gloo") == ("gloo", "--backend")
    # then the environment variable
    assert choose_backend({"DDP_DOCTOR_BACKEND": "mpi"}, sm, facts(8))[0] == "mpi"
    assert choose_backend({"DDP_DOCTOR_BACKEND": "mpi"}, sm, facts(8))[1] == "DDP_DOCTOR_BACKEND"
    # then SageMaker smdistributed
    backend, source = choose_backend({}, sm, facts(8))
    assert backend == "smddp" and "smdistributed" in source
    # then GPUs
    assert choose_backend({}, None, facts(2))[0] == "nccl"
    # then gloo
    assert choose_backend({}, None, facts(0)) == ("gloo", "no visible GPU")


def test_pytorchddp_distribution_picks_smddp(tmp_path: Any) -> None:
    ctx = build_context({"SM_HOSTS": '["algo-1"]',
                         "SM_FRAMEWORK_PARAMS": '{"sagemaker_pytorch_ddp_enabled": true}'},
                        facts(8), sm_root=str(tmp_path))
    assert ctx.backend == "smddp"


def test_torch_distributed_on_sagemaker_picks_nccl_with_gpus(tmp_path: Any) -> None:
    ctx = build_context({"SM_HOSTS": '["algo-1"]',
                         "SM_FRAMEWORK_PARAMS": '{"sagemaker_torch_distributed_enabled": true}'},
                        facts(8), sm_root=str(tmp_path))
    assert ctx.backend == "nccl"


def test_device_property() -> None:
    env = torchrun_env(rank=3, local_rank=1)
    assert build_context(env, facts(2), sm_root=NO_SM).device == "cuda:1"
    assert build_context(env, facts(2), backend="gloo", sm_root=NO_SM).device == "cpu"
    # nccl asked for on a host without GPUs: still cpu (the checks report the mismatch)
    assert build_context(env, facts(0), backend="nccl", sm_root=NO_SM).device == "cpu"
    # no local rank known: cuda:0
    assert build_context({"RANK": "0", "WORLD_SIZE": "1"}, facts(1), sm_root=NO_SM).device == "cuda:0"


def test_build_context_with_explicit_spawn_layout() -> None:
    ctx = build_context({}, facts(), rank=1, world_size=2, sm_root=NO_SM, entry_script="train.py")
    assert ctx.launcher.name == "spawn" and ctx.rank == 1 and ctx.world_size == 2
    assert ctx.entry_script == "train.py"


# Kubeflow's operators configure torchrun through PET_*; the PyTorchJob also sets the pod's RANK and
# WORLD_SIZE (pods x nprocPerNode when that is a number, else the pods)
@pytest.mark.parametrize("env, expected", [
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1"}, True),  # TrainJob: no RANK
    ({"PET_NPROC_PER_NODE": "2"}, True),
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "RANK": "1", "WORLD_SIZE": "8"}, True),  # PyTorchJob
    ({"PET_NPROC_PER_NODE": "2", "RANK": "0", "WORLD_SIZE": "2"}, True),
    # nprocPerNode "auto": WORLD_SIZE counts pods, `python train.py` is one rank of it
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "RANK": "1", "WORLD_SIZE": "2"}, False),
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "RANK": "1", "WORLD_SIZE": "2"}, False),
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "RANK": "1", "WORLD_SIZE": "2"}, False),  # counts pods
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "TORCHELASTIC_RUN_ID": "x", "RANK": "3"}, False),  # a rank
    ({"PET_NPROC_PER_NODE": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, False),
    ({"RANK": "0", "WORLD_SIZE": "2"}, False),
    ({}, False),
])
def test_torchrun_pod(env: dict[str, str], expected: bool) -> None:
    assert launchers.torchrun_pod(env) is expected
