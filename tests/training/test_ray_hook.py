"""Ray's runtime-environment hook (training/probes/ray_hook.py), as ray.init() calls it in the
driver: the job's workers get ddp-doctor's setup hook and variables, the script's own settings
win or run too, and nothing breaks without a run directory. The e2e use is in
tests/training/test_ray_train_e2e.py (a cluster the script joins)."""
from __future__ import annotations

import os
import sys
import types

import pytest

from ddp_doctor.facts.own_env import OWN_ENV, set_own
from ddp_doctor.training.probes import ray_hook
from ddp_doctor.training.probes.children import PROBE_DIR_ENV


@pytest.fixture
def driver(monkeypatch):
    """The environment `ddp-doctor run` gives the script: the run directory, the flight
    recorder's size as ddp-doctor's own value, the hook named."""
    for name in (PROBE_DIR_ENV, OWN_ENV, ray_hook.HOOK_ENV, ray_hook.USER_HOOK_ENV, "TORCH_FR_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ[PROBE_DIR_ENV] = "/tmp/run-x"
    set_own(os.environ, "TORCH_FR_BUFFER_SIZE", "2000")
    ray_hook.hook_env(os.environ)
    return os.environ


def test_the_workers_get_the_setup_hook_and_ddp_doctors_variables_and_the_scripts_own_win(driver):
    assert driver[ray_hook.HOOK_ENV] == ray_hook.HOOK
    got = ray_hook.runtime_env({"env_vars": {"TORCH_FR_BUFFER_SIZE": "50", "MINE": "1"}, "pip": ["x"]})
    assert callable(got["worker_process_setup_hook"]) and got["pip"] == ["x"]
    assert got["env_vars"]["TORCH_FR_BUFFER_SIZE"] == "50" and got["env_vars"]["MINE"] == "1"  # the script's
    assert got["env_vars"][PROBE_DIR_ENV] == "/tmp/run-x" and ray_hook.HOOK_ENV not in got["env_vars"]
    assert ray_hook.runtime_env(None)["env_vars"]["TORCH_FR_BUFFER_SIZE"] == "2000"  # no runtime env of its own


def test_the_scripts_setup_hook_runs_after_ours_and_a_function_is_left_alone(driver, monkeypatch):
    named = ray_hook.runtime_env({"worker_process_setup_hook": "mypkg.setup"})
    assert callable(named["worker_process_setup_hook"])
    assert named["env_vars"][ray_hook.USER_SETUP_ENV] == "mypkg.setup"
    calls = []
    monkeypatch.setitem(sys.modules, "mypkg", types.SimpleNamespace(setup=lambda: calls.append("theirs")))
    monkeypatch.setattr("ddp_doctor.training.probes.install.install_in_child", lambda: calls.append("ours"))
    monkeypatch.setitem(driver, ray_hook.USER_SETUP_ENV, "mypkg.setup")
    ray_hook.setup()
    assert calls == ["ours", "theirs"]

    def theirs() -> None:
        return None
    given = {"worker_process_setup_hook": theirs}
    assert ray_hook.runtime_env(given) == given  # one hook per job: the script's function


def test_a_hook_the_user_had_runs_first_and_nothing_changes_without_a_run_directory(driver, monkeypatch):
    monkeypatch.setitem(sys.modules, "userhook", types.SimpleNamespace(
        hook=lambda env: {**(env or {}), "env_vars": {"FROM_USER_HOOK": "1"}}))
    env = {ray_hook.HOOK_ENV: "userhook.hook"}
    ray_hook.hook_env(env)
    assert env[ray_hook.HOOK_ENV] == ray_hook.HOOK and env[ray_hook.USER_HOOK_ENV] == "userhook.hook"
    monkeypatch.setitem(driver, ray_hook.USER_HOOK_ENV, "userhook.hook")
    got = ray_hook.runtime_env({})
    assert got["env_vars"]["FROM_USER_HOOK"] == "1" and callable(got["worker_process_setup_hook"])
    del driver[PROBE_DIR_ENV]
    assert ray_hook.runtime_env({"a": 1}) == {"a": 1, "env_vars": {"FROM_USER_HOOK": "1"}}  # the user's hook alone


def test_a_worker_without_ddp_doctor_starts_unprobed_and_runs_the_scripts_hook(driver, monkeypatch):
    # Ray ends a worker whose setup hook fails: where ddp-doctor is not installed, the hook Ray
    # pickles (exec of a text, builtins only) runs the script's own hook and nothing else
    pickle = pytest.importorskip("ray.cloudpickle", reason="Ray pickles the hook with its cloudpickle")
    hook = pickle.loads(pickle.dumps(ray_hook.runtime_env({})["worker_process_setup_hook"]))
    calls = []
    monkeypatch.setattr("ddp_doctor.training.probes.install.install_in_child", lambda: calls.append("ours"))
    monkeypatch.setitem(sys.modules, "mypkg", types.SimpleNamespace(setup=lambda: calls.append("theirs")))
    monkeypatch.setitem(driver, ray_hook.USER_SETUP_ENV, "mypkg.setup")
    hook()
    assert calls == ["ours", "theirs"]
    monkeypatch.setitem(sys.modules, ray_hook.__name__, None)  # as if not installed: its import fails
    calls.clear()
    hook()
    assert calls == ["theirs"]
