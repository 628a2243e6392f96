"""What each process passed to init_process_group, written the moment it calls it (init-PID.json in
the run directory), before the call can block: the explicit rank / world_size, the rendezvous
variables at the call and at the script's start, the launcher's own values, and the call site.
A rank that passed rank=0 by hand waits inside init until torch's timeout; the parent reads these
records while it waits and names the problem at once (checks/init_arguments.py).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

from ddp_doctor.training.probes.call_sites import user_site
from ddp_doctor.training.records import init_call_path, write_json

RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# init_process_group(backend, init_method, timeout, world_size, rank, store, ...): positions of
# the arguments read here, as torch (1.x to 2.13) declares them.
_POSITIONS = {"backend": 0, "init_method": 1, "world_size": 3, "rank": 4}

_launcher: dict[str, Any] = {}  # the rank process's own values, set before the script starts


def remember_launcher(launcher_rank: int | None, launcher_world: int | None) -> None:
    """Called by the rank process before it runs the script: what the launcher gave it, and the
    rendezvous variables as they were then (the script may change them)."""
    _launcher.update(pid=os.getpid(), rank=launcher_rank, world_size=launcher_world,
                     env={k: os.environ.get(k) for k in RENDEZVOUS_VARS})


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    pos = _POSITIONS[name]
    return args[pos] if len(args) > pos else None


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def call_record(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    rank_arg, world_arg = _as_int(_argument(args, kwargs, "rank")), _as_int(_argument(args, kwargs, "world_size"))
    init_method = _argument(args, kwargs, "init_method")
    launched = _launcher.get("pid") == os.getpid()  # the rank process itself, not a child it started
    return {
        "pid": os.getpid(), "time": time.time(), "done": False, "site": user_site(),
        "rank_arg": rank_arg if rank_arg is not None and rank_arg >= 0 else None,
        "world_size_arg": world_arg if world_arg is not None and world_arg > 0 else None,
        "init_method": str(init_method) if init_method is not None else None,
        "store_given": kwargs.get("store") is not None,
        "env": {k: os.environ.get(k) for k in RENDEZVOUS_VARS},
        "launched_rank": launched,
        **({"launcher": {k: _launcher.get(k) for k in ("rank", "world_size", "env")}} if launched else {}),
    }


def init_arguments_wrapper(out_dir: Callable[[], str | None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            path = None
            try:
                d = out_dir()
                if d:
                    rec = call_record(args, kwargs)
                    path = init_call_path(d, rec["pid"])
                    write_json(path, rec)
            except Exception:  # noqa: BLE001 - a probe never breaks the call
                path = None
            ok = False
            try:
                result = orig(*args, **kwargs)
                ok = True
                return result
            finally:
                if path:
                    try:
                        rec["done"], rec["ok"], rec["ended"] = True, ok, time.time()
                        write_json(path, rec)
                    except Exception:  # noqa: BLE001
                        pass
        return init_process_group
    return make
