"""Ray's workers on a cluster the script joins (`ray.init(address=...)`, RAY_ADDRESS, a cluster
`ray start` made): they are started by that cluster's raylets, not from the script's environment,
so the sitecustomize route of children.py never reaches them. Ray's own hooks do, with no change
to the script:

- RAY_RUNTIME_ENV_HOOK names a function `ray.init()` calls in the driver with the job's runtime
  environment and whose result it uses (ray/_private/worker.py). `ddp-doctor run` names
  `runtime_env` below; a hook the user had already set is kept in USER_HOOK_ENV and called first.
- `runtime_env["worker_process_setup_hook"]` is a function every worker process of the job calls
  once as it starts (GUARDED_SETUP: `setup` below where ddp-doctor is installed, the worker starts
  unprobed where it is not); `setup` installs the probes there (install.install_in_child),
  and `env_vars` carry the run directory and ddp-doctor's own variables (the flight recorder's
  size) to the workers. A setup hook the script gave as a name is kept and called after ours; one
  given as a Python function is left alone, and ours is not added (that job's workers on a local
  cluster still inherit the probes).

The workers are probed where ddp-doctor is installed in their environment. A worker on another
node writes its records into the same path on its node: the driver's report
sees only its own node's workers, as one node's run directory does.
"""
from __future__ import annotations

import builtins
import importlib
import os
from typing import Any

from ddp_doctor.facts.own_env import OWN_ENV, owned, set_own
from ddp_doctor.training.probes.children import PROBE_DIR_ENV

HOOK_ENV = "RAY_RUNTIME_ENV_HOOK"
USER_HOOK_ENV = "DDP_DOCTOR_RAY_USER_HOOK"  # the user's RAY_RUNTIME_ENV_HOOK, called first
USER_SETUP_ENV = "DDP_DOCTOR_RAY_USER_SETUP"  # the script's worker_process_setup_hook, called after ours
HOOK = f"{__name__}.runtime_env"
SETUP_KEY = "worker_process_setup_hook"


def hook_env(env: dict[str, str]) -> None:
    """Name `runtime_env` as Ray's runtime-environment hook in `env` (the script's), keeping the
    user's own hook to call first."""
    theirs = env.get(HOOK_ENV)
    if theirs == HOOK:
        return
    if theirs:
        env[USER_HOOK_ENV] = theirs
    set_own(env, HOOK_ENV, HOOK)


def runtime_env(given: Any) -> Any:
    """In the driver, inside ray.init(): the job's runtime environment with ddp-doctor's setup hook
    and variables for every worker. Never raises: a runtime environment it cannot extend is
    returned as it came."""
    theirs = os.environ.get(USER_HOOK_ENV)
    if theirs:
        given = _load(theirs)(given)
    run_dir = os.environ.get(PROBE_DIR_ENV)
    if not run_dir or (given is not None and not isinstance(given, dict)):
        return given
    out = dict(given or {})
    setup_hook = out.get(SETUP_KEY)
    if setup_hook is not None and not isinstance(setup_hook, str):
        return out  # the script's own function: Ray exports it; one hook per job, theirs
    variables = dict(out.get("env_vars") or {})
    if isinstance(setup_hook, str):
        variables[USER_SETUP_ENV] = setup_hook
    mine = {PROBE_DIR_ENV, *owned(os.environ)} - {HOOK_ENV}
    for name in sorted(mine):
        if name in os.environ:
            variables.setdefault(name, os.environ[name])  # the script's own values win
    if OWN_ENV in os.environ:
        variables.setdefault(OWN_ENV, os.environ[OWN_ENV])
    out["env_vars"] = variables
    out[SETUP_KEY] = _guarded_setup()
    return out


# What each worker runs as it starts. Given to Ray as a function it pickles by value (made outside
# any importable module, it needs only builtins to unpickle), not as "module.function": Ray ends a
# worker whose setup hook cannot be imported, and a worker of a cluster without ddp-doctor must
# start, unprobed, with the script's own hook run as Ray would have.
GUARDED_SETUP = f"""
def ddp_doctor_setup():
    import importlib, os
    try:
        from {__name__} import setup
    except ImportError:
        theirs = os.environ.get({USER_SETUP_ENV!r})
        if theirs:
            module, _, name = theirs.rpartition(".")
            getattr(importlib.import_module(module), name)()
    else:
        setup()
"""


def _guarded_setup() -> Any:
    namespace: dict[str, Any] = {"__name__": "ddp_doctor_ray_setup", "__builtins__": builtins}
    exec(GUARDED_SETUP, namespace)  # noqa: S102 - our own text, above
    return namespace["ddp_doctor_setup"]


def setup() -> None:
    """In each worker process of the job, once, as it starts: the probes (from its first torch
    import on), then the script's own setup hook if it named one."""
    try:
        from ddp_doctor.training.probes.install import install_in_child
        install_in_child()
    except Exception:  # noqa: BLE001 - a probe never keeps a worker from starting
        pass
    theirs = os.environ.get(USER_SETUP_ENV)
    if theirs:
        _load(theirs)()


def _load(path: str) -> Any:
    """The function a dotted path names ("package.module.function"), as Ray's load_class reads it."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
