"""The variables ddp-doctor itself sets in its ranks' environment, told apart from the user's.

`ddp-doctor run` and the local launch set NCCL's log (NCCL_DEBUG, NCCL_DEBUG_FILE into a per-node
run directory), the flight recorder's size and dump prefix (TORCH_FR_*, TORCH_NCCL_DEBUG_INFO_TEMP_FILE)
and torch's NCCL watchdog settings, each only where the user left it unset. Each one set that way is
named in OWN_ENV (comma-separated), which travels with the environment to the launcher's workers, so a
rank knows which values are ddp-doctor's rather than the user's: the cross-rank comparison of settings
(DDP706) reads the user's environment only (`user_env`), never ddp-doctor's per-node paths.
"""
from __future__ import annotations

from typing import Any, Mapping, MutableMapping

OWN_ENV = "DDP_DOCTOR_OWN_ENV"


def owned(env: Mapping[str, str]) -> frozenset[str]:
    """The names ddp-doctor set in `env` (and the user did not)."""
    return frozenset(n for n in (env.get(OWN_ENV) or "").split(",") if n)


def set_own(env: MutableMapping[str, str], name: str, value: str) -> None:
    """Set `name` as ddp-doctor's own value. Callers only set names the user left unset."""
    env[name] = value
    names = owned(env)
    if name not in names:
        env[OWN_ENV] = ",".join(sorted(names | {name}))


def default_own(env: MutableMapping[str, str], name: str, value: str) -> None:
    """`env.setdefault(name, value)`, marked as ddp-doctor's when it was unset."""
    if name not in env:
        set_own(env, name, value)


def user_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """`env` without ddp-doctor's own values: what the user set, before ddp-doctor touched it."""
    mine = owned(env) | {OWN_ENV}
    return {k: v for k, v in env.items() if k not in mine}


NO_NUMPY_WARNING = "ignore:Failed to initialize NumPy:UserWarning"  # PYTHONWARNINGS syntax: a prefix


def quiet_missing_numpy(env: MutableMapping[str, str]) -> None:
    """torch built without numpy at hand warns "Failed to initialize NumPy" in every process that
    imports it (the launcher and each rank: three times for a 2-rank preflight). ddp-doctor needs no
    numpy, so on a bare CPU venv this is noise: the processes it starts get that one warning filtered
    (after the user's own PYTHONWARNINGS, which stay as they are). Nothing changes where numpy is."""
    import importlib.util
    if importlib.util.find_spec("numpy") is not None:
        return
    current = env.get("PYTHONWARNINGS")
    if not current:
        set_own(env, "PYTHONWARNINGS", NO_NUMPY_WARNING)
    elif NO_NUMPY_WARNING not in current.split(","):
        env["PYTHONWARNINGS"] = f"{current},{NO_NUMPY_WARNING}"


def ignore_missing_numpy_here() -> None:
    """The same filter in this process (a rank started by an outside launcher), before torch loads."""
    import warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
