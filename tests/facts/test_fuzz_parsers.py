"""Fuzzing the environment parsers: whatever a launcher, SageMaker or a user puts in
SM_HOSTS, the SM_* numbers, SM_FRAMEWORK_PARAMS, SM_TRAINING_ENV, resourceconfig.json /
hyperparameters.json, OMPI_* / PMI_* / SLURM_* values or torchrun's variables, building the rank's
context never raises, and the local checks over it run without crashing (no DDP001): each bad
value is either parsed cleanly or reported as a finding. Hypothesis, a few hundred examples each,
no deadline (the suite's time matters more than depth here)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
from helpers.context import make_ctx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddp_doctor.check_runner import run_stage
from ddp_doctor.checks import load_catalogue
from ddp_doctor.facts import env_values, launchers
from ddp_doctor.facts import sagemaker_env as sm

load_catalogue()
# DDP_DOCTOR_FUZZ_EXAMPLES=5000 for a deeper run by hand
FAST = settings(max_examples=int(os.environ.get("DDP_DOCTOR_FUZZ_EXAMPLES", "200")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow], database=None)

# ------------------------------------------------------------------------------ value strategies
# Environment values are str without NUL; numbers, near-numbers, JSON of any shape, odd text.
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
number_like = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70).map(str),
    st.sampled_from(["", " ", "0", "-1", "1.5", "1e3", "0x10", "٣", "²", "８", " 7 ", "+3", "nan", "inf",
                     "8(x2)", "8(x2),4", "(x2)", "4,", ",", "2(x0)", "99999999999999999999(x99999999)"]),
    text)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), text),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(text, kids, max_size=4)),
    max_leaves=12)
json_text = st.one_of(json_values.map(lambda v: json.dumps(v)), text,
                      st.sampled_from(['["algo-1","algo-2"]', '["algo-1",2]', "algo-1,algo-2", "[", "{}",
                                       '{"sagemaker_torch_distributed_enabled":"yes"}', "null", "[[]]"]))

SM_NUMBERS = ("SM_NUM_GPUS", "SM_NUM_CPUS", "SM_NUM_NEURONS")
SM_JSON = ("SM_HOSTS", "SM_FRAMEWORK_PARAMS", "SM_TRAINING_ENV", "SM_INSTANCE_GROUPS",
           "SM_DISTRIBUTION_INSTANCE_GROUPS", "SM_IS_HETERO", "SM_HPS", "SM_USER_ARGS")
SM_TEXT = ("SM_CURRENT_HOST", "SM_CURRENT_INSTANCE_TYPE", "SM_CURRENT_INSTANCE_GROUP", "SM_NETWORK_INTERFACE_NAME")
LAUNCHER_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID",
    "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NNODES", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE", "CUDA_VISIBLE_DEVICES", "SMDATAPARALLEL_LOCAL_RANK", "DDP_DOCTOR_BACKEND",
    "NCCL_SOCKET_IFNAME", "FI_PROVIDER", "OMP_NUM_THREADS")


def env_strategy(names: tuple[str, ...], values: Any) -> Any:
    return st.dictionaries(st.sampled_from(names), values, max_size=len(names))


launcher_env = env_strategy(LAUNCHER_VARS, number_like)
sagemaker_env = st.fixed_dictionaries({}, optional={
    **{n: number_like for n in SM_NUMBERS}, **{n: json_text for n in SM_JSON}, **{n: text for n in SM_TEXT}})


def _no_crash(ctx: Any) -> None:
    """The local checks over the context: a parse problem is a finding, never a crashed check."""
    found = run_stage("local", (ctx,), rank=ctx.rank, skip=["host", "gpu", "network"])
    crashed = [f for f in found if f.id == "DDP001"]
    assert not crashed, [(f.message, f.evidence.get("traceback", "")[-1500:]) for f in crashed]


# ------------------------------------------------------------------------------------- the tests
@FAST
@given(launcher_env)
def test_launcher_variables_never_raise(env):
    info = launchers.detect(env)
    assert info.name in launchers.LAUNCHERS
    for v in (info.rank, info.local_rank, info.world_size, info.local_world_size, info.node_rank, info.nnodes,
              info.master_port):
        assert v is None or isinstance(v, int)
    for name in info.invalid:  # an unparseable value is recorded, with what was read
        assert isinstance(info.invalid[name].raw, str)


@FAST
@given(number_like, number_like)
def test_spawn_and_env_ints(a, b):
    env = {"LOCAL_WORLD_SIZE": a, "MASTER_PORT": b}
    launchers.detect(env, rank=0, world_size=2)
    got = env_values.env_int(env, "MASTER_PORT")
    assert got is None or isinstance(got, (int, env_values.Invalid))


@FAST
@given(sagemaker_env)
def test_sagemaker_variables_never_raise(env):
    view = sm.read(env, "/nonexistent/ddp-doctor-fuzz")
    if view is not None:
        assert isinstance(view.errors, dict) and isinstance(view.processes_per_host, int)
        assert all(isinstance(h, str) for h in view.hosts or [])


@pytest.mark.slow
@FAST
@given(launcher_env, sagemaker_env)
def test_context_and_local_checks_never_crash(lenv, senv):
    _no_crash(make_ctx({**senv, **lenv}))


@pytest.mark.slow
@FAST
@given(json_text, json_text, sagemaker_env)
def test_config_files_never_raise(resourceconfig, hyperparameters, senv):
    with tempfile.TemporaryDirectory() as root:
        cfg = os.path.join(root, "input", "config")
        os.makedirs(cfg)
        with open(os.path.join(cfg, "resourceconfig.json"), "w", encoding="utf-8") as f:
            f.write(resourceconfig)
        with open(os.path.join(cfg, "hyperparameters.json"), "w", encoding="utf-8") as f:
            f.write(hyperparameters)
        view = sm.read(senv, root)
        assert view is not None
        if resourceconfig.strip() and not _is_json_object(resourceconfig):
            assert view.errors, "a resourceconfig.json that is no JSON object must be reported"
        _no_crash(make_ctx({**senv, "SM_CURRENT_HOST": "algo-1"}, sm_root=root))


def _is_json_object(raw: str) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


@FAST
@given(st.integers(min_value=-2**40, max_value=2**40), st.integers(min_value=-2**40, max_value=2**40))
def test_counts_are_never_negative_without_a_finding(gpus, ppn):
    # found by fuzzing: SM_NUM_GPUS=-1 and sagemaker_mpi_num_of_processes_per_host=0 passed as clean
    env = {"SM_HOSTS": '["algo-1"]', "SM_NUM_GPUS": str(gpus),
           "SM_FRAMEWORK_PARAMS": json.dumps({"sagemaker_mpi_num_of_processes_per_host": ppn})}
    view = sm.read(env, "/nonexistent/ddp-doctor-fuzz")
    assert view.processes_per_host >= 1
    assert (view.num_gpus is not None and view.num_gpus >= 0) or "SM_NUM_GPUS" in view.errors
    if ppn < 1:
        assert "SM_FRAMEWORK_PARAMS" in view.errors
