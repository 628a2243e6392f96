"""ddp-doctor's own variables (facts/own_env.py): marked where ddp-doctor sets them, so the
cross-rank comparison (DDP706) reads what the user set, never ddp-doctor's per-node paths."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

from ddp_doctor.facts.efa import nccl_log_env
from ddp_doctor.facts.own_env import (
    NO_NUMPY_WARNING,
    OWN_ENV,
    default_own,
    owned,
    quiet_missing_numpy,
    set_own,
    user_env,
)
from ddp_doctor.training.run.ledger import recorder_env


def test_set_and_default_mark_only_what_ddp_doctor_set() -> None:
    env = {"NCCL_DEBUG_SUBSYS": "ALL"}
    set_own(env, "NCCL_DEBUG", "INFO")
    default_own(env, "NCCL_DEBUG_SUBSYS", "INIT,NET")  # the user's: left alone, not marked
    default_own(env, "TORCH_NCCL_ENABLE_MONITORING", "1")
    set_own(env, "NCCL_DEBUG", "INFO")  # twice: named once
    assert env["NCCL_DEBUG_SUBSYS"] == "ALL"
    assert owned(env) == {"NCCL_DEBUG", "TORCH_NCCL_ENABLE_MONITORING"}
    assert env[OWN_ENV] == "NCCL_DEBUG,TORCH_NCCL_ENABLE_MONITORING"
    assert user_env(env) == {"NCCL_DEBUG_SUBSYS": "ALL"}
    assert owned({}) == frozenset() and user_env({"A": "1"}) == {"A": "1"}


def test_nccl_log_env_marks_its_per_node_path(tmp_path) -> None:
    env: dict[str, str] = {}
    nccl_log_env(env, str(tmp_path))
    assert owned(env) == {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"}
    assert user_env(env) == {}
    env = {"NCCL_DEBUG": "WARN"}  # the user's choice: nothing set, nothing marked
    nccl_log_env(env, str(tmp_path))
    assert env == {"NCCL_DEBUG": "WARN"}


def test_everything_ddp_doctor_run_sets_is_marked(tmp_path) -> None:
    user = {"NCCL_SOCKET_IFNAME": "eth0", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "60"}
    env = dict(user)
    recorder_env(env, str(tmp_path))
    assert set(env) - set(user) - {OWN_ENV} == owned(env)  # every name it added is marked
    assert {"NCCL_DEBUG_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"} <= owned(env)
    assert user_env(env) == user  # the user's values, as before ddp-doctor touched the environment


def test_without_numpy_the_launched_processes_filter_torchs_numpy_warning_after_the_users_own(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    env: dict[str, str] = {}
    quiet_missing_numpy(env)
    assert env["PYTHONWARNINGS"] == NO_NUMPY_WARNING and "PYTHONWARNINGS" in owned(env)
    mine = {"PYTHONWARNINGS": "error::DeprecationWarning"}
    quiet_missing_numpy(mine)
    quiet_missing_numpy(mine)  # once
    assert mine["PYTHONWARNINGS"] == f"error::DeprecationWarning,{NO_NUMPY_WARNING}" and not owned(mine)


def test_with_numpy_nothing_changes(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    env = {"PYTHONWARNINGS": "default"}
    quiet_missing_numpy(env)
    assert env == {"PYTHONWARNINGS": "default"}


def test_the_filter_silences_exactly_torchs_numpy_warning_in_a_real_interpreter() -> None:
    code = ("import warnings; warnings.warn(\"Failed to initialize NumPy: No module named 'numpy' (Triggered "
            "internally at tensor_numpy.cpp:84.)\", UserWarning); warnings.warn('another one', UserWarning)")
    res = subprocess.run([sys.executable, "-c", code], env={"PYTHONWARNINGS": NO_NUMPY_WARNING},
                         capture_output=True, text=True, timeout=60)
    assert "NumPy" not in res.stderr and "another one" in res.stderr, res.stderr
