"""Local launcher checks (DDP101-DDP109): one failing and one passing case per check."""
from __future__ import annotations

from typing import Any

import pytest
from helpers.context import make_ctx, mpirun_env, sm_env, torchrun_env, write_sm_config

from ddp_doctor.check_runner import run_stage
from ddp_doctor.checks import load_catalogue
from ddp_doctor.findings import Finding
from ddp_doctor.registry import parse_sections

LAUNCHER_IDS = [f"DDP10{i}" for i in range(1, 10)]


def run(ctx: Any, check_id: str) -> list[Finding]:
    """Run the local stage for one check; a crash would show up as DDP001."""
    found = run_stage("local", (ctx,), rank=ctx.rank, select=[check_id])
    assert not [f for f in found if f.id in ("DDP001", "DDP002")], found
    return [f for f in found if f.id == check_id]


def one(ctx: Any, check_id: str) -> Finding:
    found = run(ctx, check_id)
    assert len(found) == 1, [f.message for f in found]
    return found[0]


def test_catalogue_has_launcher_ids_with_docs() -> None:
    cat = load_catalogue()
    for cid in LAUNCHER_IDS:
        entry = cat[cid]
        assert entry.category == "launcher_env" and entry.stage == "local"
        sections = parse_sections(entry.doc)
        assert all(sections.get(s) for s in ("What", "Why", "Fix")), cid


# DDP101 rank variables present and integers

def test_ddp101_missing_local_world_size_under_torchrun() -> None:
    env = torchrun_env(rank=1, world_size=2)
    del env["LOCAL_WORLD_SIZE"]
    f = one(make_ctx(env), "DDP101")
    assert f.severity == "error"
    assert "LOCAL_WORLD_SIZE is not set" in f.message and "RANK=1" in f.message and "WORLD_SIZE=2" in f.message


def test_ddp101_non_integer_rank() -> None:
    f = one(make_ctx({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}), "DDP101")
    assert f.severity == "error" and "RANK='x'" in f.message and "not an integer" in f.message


def test_ddp101_env_launcher_without_local_rank_is_a_warning() -> None:
    f = one(make_ctx({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}), "DDP101")
    assert f.severity == "warning" and "LOCAL_RANK is not set" in f.message


def test_ddp101_passes_for_complete_layouts() -> None:
    assert run(make_ctx(torchrun_env(rank=3, world_size=4)), "DDP101") == []
    assert run(make_ctx(mpirun_env(rank=3, world_size=4)), "DDP101") == []
    assert run(make_ctx({}), "DDP101") == []  # no launcher, nothing to check


# DDP102 ranges

@pytest.mark.parametrize("env,needle", [
    (torchrun_env(rank=4, world_size=4, local_rank=0, local_world_size=4, group_rank=0), "RANK=4 is outside 0..3"),
    (torchrun_env(rank=0, world_size=0, local_world_size=1), "WORLD_SIZE=0"),
    (torchrun_env(rank=0, world_size=2, local_rank=2, local_world_size=2), "LOCAL_RANK=2 is outside 0..1"),
    (torchrun_env(rank=0, world_size=2, local_world_size=4, local_rank=0, group_rank=0, nnodes=1),
     "LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2"),
    (torchrun_env(rank=0, world_size=4, local_world_size=2, group_rank=2, nnodes=2), "GROUP_RANK=2 is outside 0..1"),
    (mpirun_env(rank=8, world_size=8), "OMPI_COMM_WORLD_RANK=8 is outside 0..7"),
])
def test_ddp102_out_of_range(env: dict[str, str], needle: str) -> None:
    found = run(make_ctx(env), "DDP102")
    assert found and all(f.severity == "error" for f in found)
    assert any(needle in f.message for f in found), [f.message for f in found]


def test_ddp102_passes_in_range() -> None:
    assert run(make_ctx(torchrun_env(rank=7, world_size=8, local_world_size=4)), "DDP102") == []


# DDP103 layout

def test_ddp103_rank_formula() -> None:
    env = torchrun_env(rank=1, world_size=4, local_world_size=2, local_rank=1, group_rank=1, nnodes=2)
    f = one(make_ctx(env), "DDP103")
    assert f.severity == "error"
    assert "RANK=1 but GROUP_RANK=1 x LOCAL_WORLD_SIZE=2 + LOCAL_RANK=1 = 3" in f.message


def test_ddp103_world_not_nodes_times_local_is_warning_under_torchrun() -> None:
    env = torchrun_env(rank=0, world_size=6, local_world_size=4, group_rank=0, nnodes=2)
    f = one(make_ctx(env), "DDP103")
    assert f.severity == "warning" and "WORLD_SIZE=6 but GROUP_WORLD_SIZE=2 nodes x 4" in f.message


def test_ddp103_slurm_world_mismatch() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "12", "SLURM_STEP_ID": "0",
           "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_NNODES": "2", "SLURM_NODEID": "0"}
    f = one(make_ctx(env), "DDP103")
    assert f.severity == "error" and "SLURM_NTASKS=12 but SLURM_NNODES=2 nodes x 8" in f.message
    env["SLURM_STEP_TASKS_PER_NODE"] = "8,4"  # heterogeneous: nothing to compare
    assert run(make_ctx(env), "DDP103") == []


def test_ddp103_passes() -> None:
    env = torchrun_env(rank=5, world_size=8, local_world_size=4)
    assert run(make_ctx(env), "DDP103") == []


# DDP104 MASTER_ADDR

def test_ddp104_mpirun_multi_node_without_master_addr() -> None:
    f = one(make_ctx(mpirun_env(rank=0, world_size=16, local_world_size=8)), "DDP104")
    assert f.severity == "error" and "WORLD_SIZE=16" in f.message and "mpirun" in f.message
    assert "mpirun -x MASTER_ADDR=" in f.hint


def test_ddp104_single_node_mpirun_uses_default() -> None:
    f = one(make_ctx(mpirun_env(rank=1, world_size=4)), "DDP104")
    assert f.severity == "info" and "127.0.0.1" in f.message


def test_ddp104_env_launcher_single_node_is_still_an_error() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    assert one(make_ctx(env), "DDP104").severity == "error"


def test_ddp104_passes() -> None:
    assert run(make_ctx({**mpirun_env(rank=0, world_size=16, local_world_size=8), "MASTER_ADDR": "node1"}),
               "DDP104") == []
    assert run(make_ctx(mpirun_env(rank=0, world_size=1)), "DDP104") == []
    assert run(make_ctx(torchrun_env(rank=0, world_size=2)), "DDP104") == []


# DDP105 MASTER_PORT

@pytest.mark.parametrize("port,severity,needle", [
    ("http", "error", "MASTER_PORT='http' is not an integer"),
    ("70000", "error", "MASTER_PORT=70000 is outside 1..65535"),
    ("0", "error", "MASTER_PORT=0 is outside"),
    ("80", "warning", "MASTER_PORT=80 is a privileged port"),
])
def test_ddp105_bad_ports(port: str, severity: str, needle: str) -> None:
    env = {**torchrun_env(rank=0, world_size=2), "MASTER_PORT": port}
    f = one(make_ctx(env), "DDP105")
    assert f.severity == severity and needle in f.message


def test_ddp105_passes() -> None:
    assert run(make_ctx(torchrun_env(rank=0, world_size=2, master_port=29500)), "DDP105") == []
    assert run(make_ctx({}), "DDP105") == []


# DDP106 backend

def test_ddp106_nccl_without_gpu() -> None:
    f = one(make_ctx(torchrun_env(world_size=2), backend="nccl"), "DDP106")
    assert f.severity == "error" and "asked for NCCL (from --backend) but no GPU is visible" in f.message


def test_ddp106_unknown_and_unavailable_backend() -> None:
    f = one(make_ctx({"DDP_DOCTOR_BACKEND": "ncl"}), "DDP106")
    assert "backend 'ncl' (from DDP_DOCTOR_BACKEND)" in f.message
    f = one(make_ctx({}, gpus=2, backends=("gloo",), backend="nccl"), "DDP106")
    assert "backend 'nccl'" in f.message and "available: gloo" in f.message
    f = one(make_ctx({}, gpus=2, backends=("gloo", "nccl"), backend="smddp"), "DDP106")
    assert "smdistributed" in f.hint


def test_ddp106_passes() -> None:
    assert run(make_ctx({}), "DDP106") == []                 # gloo on CPU
    assert run(make_ctx({}, gpus=8), "DDP106") == []         # nccl with GPUs


# DDP107 plain process in a distributed SageMaker job

def test_ddp107_single_process_on_two_hosts(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path, hosts=["algo-1", "algo-2"])
    f = one(make_ctx(sm_env(["algo-1", "algo-2"], distribution=None), gpus=8, sm_root=root), "DDP107")
    assert f.severity == "error" and "2 hosts" in f.message and "SM_NUM_GPUS=8" in f.message
    assert "14 of 16 GPUs idle" in f.message and "torch_distributed" in f.hint


def test_ddp107_single_process_on_multi_gpu_host_is_a_warning(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path)
    f = one(make_ctx(sm_env(distribution=None, num_gpus=4), gpus=4, sm_root=root), "DDP107")
    assert f.severity == "warning" and "SM_NUM_GPUS=4" in f.message and "3 of 4 GPUs idle" in f.message


def test_ddp107_passes(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path)
    assert run(make_ctx(sm_env(distribution=None, num_gpus=1), gpus=1, sm_root=root), "DDP107") == []
    assert run(make_ctx({}, gpus=8), "DDP107") == []  # not SageMaker


# DDP108 launcher vs distribution

def test_ddp108_mpirun_under_torch_distributed(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path)
    env = {**sm_env(), **mpirun_env(rank=0, world_size=8)}
    f = one(make_ctx(env, gpus=8, sm_root=root), "DDP108")
    assert f.severity == "warning" and "'torch_distributed' launches ranks with torchrun" in f.message
    assert "started by mpirun" in f.message and "OMPI_COMM_WORLD_SIZE=8" in f.message


def test_ddp108_passes(tmp_path: Any) -> None:
    root = write_sm_config(tmp_path)
    env = {**sm_env(), **torchrun_env(rank=0, world_size=8, master_port=7777)}
    assert run(make_ctx(env, gpus=8, sm_root=root), "DDP108") == []


# DDP109 local ranks vs GPUs

def test_ddp109_more_local_ranks_than_gpus() -> None:
    f = one(make_ctx(torchrun_env(rank=0, world_size=8), gpus=4), "DDP109")
    assert f.severity == "error" and "LOCAL_WORLD_SIZE=8 ranks on this node but only 4 GPU(s)" in f.message


def test_ddp109_local_rank_beyond_gpus() -> None:
    env = torchrun_env(rank=5, world_size=16, local_world_size=8, local_rank=5)
    env["LOCAL_WORLD_SIZE"] = "4"  # wrong per-node size, so the local rank is the one that overflows
    found = run(make_ctx(env, gpus=4), "DDP109")
    assert any("LOCAL_RANK=5 but only 4 GPU(s)" in f.message and f.severity == "error" for f in found)


def test_ddp109_one_gpu_per_rank_binding_is_a_warning() -> None:
    env = {**torchrun_env(rank=3, world_size=8), "CUDA_VISIBLE_DEVICES": "3"}
    f = one(make_ctx(env, gpus=1), "DDP109")
    assert f.severity == "warning" and "CUDA_VISIBLE_DEVICES='3'" in f.message


def test_ddp109_passes() -> None:
    assert run(make_ctx(torchrun_env(rank=7, world_size=8), gpus=8), "DDP109") == []
    assert run(make_ctx(torchrun_env(rank=7, world_size=8)), "DDP109") == []  # gloo on CPU
