"""DDP110: what the script's own init_process_group() (env://) will need, checked under
`ddp-doctor run` (ctx.entry_script) and in the Python API."""
from __future__ import annotations

from typing import Any

from helpers.context import make_ctx, mpirun_env, torchrun_env

from ddp_doctor.check_runner import run_stage
from ddp_doctor.checks import load_catalogue
from ddp_doctor.checks.launcher_env import SCRIPT_FOLLOWS_OPTION, script_env_exports
from ddp_doctor.facts.launchers import detect

load_catalogue()
API = {SCRIPT_FOLLOWS_OPTION: True}


def ddp110(ctx: Any) -> list:
    found = run_stage("local", (ctx,), rank=ctx.rank, select=["DDP110"])
    assert not [f for f in found if f.id in ("DDP001", "DDP002")], found
    return [f for f in found if f.id == "DDP110"]


def test_spawn_worker_without_master_addr_is_an_error():
    (f,) = ddp110(make_ctx({}, rank=1, world_size=2, options=API))
    assert f.severity == "error" and "MASTER_ADDR and MASTER_PORT not set" in f.message
    assert "before torch.multiprocessing.spawn" in f.hint and 'os.environ["MASTER_ADDR"]' in f.hint
    # only the port missing
    (g,) = ddp110(make_ctx({"MASTER_ADDR": "localhost"}, rank=0, world_size=2, options=API))
    assert g.message.startswith("MASTER_PORT not set")


def test_spawn_worker_with_master_addr_and_port_passes():
    assert ddp110(make_ctx({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}, rank=0, world_size=2,
                           options=API)) == []


def test_plain_mpirun_under_the_api_is_an_error_with_the_mapping():
    (f,) = ddp110(make_ctx(mpirun_env(rank=1, world_size=2), options=API))
    assert f.severity == "error"
    assert f.message.startswith("RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK not set under mpirun")
    assert "OMPI_COMM_WORLD_RANK" in f.hint and "ddp-doctor run" in f.hint


def test_mpirun_mapped_by_hand_passes():
    env = {**mpirun_env(rank=1, world_size=2), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert ddp110(make_ctx(env, options=API)) == []


def test_under_ddp_doctor_run_mpirun_is_info_it_exports_them():
    (f,) = ddp110(make_ctx(mpirun_env(rank=1, world_size=2), entry_script="train.py"))
    assert f.severity == "info" and "ddp-doctor run exports RANK, WORLD_SIZE, LOCAL_RANK" in f.message
    assert "MASTER_ADDR=127.0.0.1, MASTER_PORT=29500" in f.message
    assert f.evidence["exported"]["RANK"] == "1"


def test_under_run_across_nodes_master_addr_cannot_be_exported():
    (f,) = ddp110(make_ctx(mpirun_env(rank=9, world_size=16, local_world_size=8), entry_script="train.py"))
    assert f.severity == "error" and f.message.startswith("MASTER_ADDR, MASTER_PORT not set under mpirun")
    assert f.evidence["exported"]["RANK"] == "9"


def test_torchrun_and_a_bare_preflight_are_not_judged():
    assert ddp110(make_ctx(torchrun_env(rank=0, world_size=2), options=API)) == []
    assert ddp110(make_ctx(mpirun_env(rank=0, world_size=2))) == []  # `ddp-doctor preflight`: no script


def test_exports_never_change_a_set_variable():
    env = {**mpirun_env(rank=3, world_size=4), "RANK": "7", "MASTER_PORT": "1234"}
    got = script_env_exports(detect(env), env)
    assert got == {"WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1"}
    assert script_env_exports(detect(torchrun_env(world_size=2)), torchrun_env(world_size=2)) == {}
