"""Processes the training script starts. Forks: a fork after CUDA was initialised is recorded
(`before_fork`), and a forked child starts a record of its own (`after_fork_in_child`). Child
interpreters (torch.multiprocessing.spawn, subprocess): `child_env` puts `site/sitecustomize.py` on
their PYTHONPATH with the run directory in PROBE_DIR_ENV, the way coverage.py measures
subprocesses; the sitecustomize then calls `install.install_in_child`. Ray's workers on a cluster
the script joins are reached through Ray's own hooks instead (ray_hook.py)."""
from __future__ import annotations

import os
import sys
import traceback

from ddp_doctor.training.probes.recorder import current_recorder, renew_after_fork

PROBE_DIR_ENV = "DDP_DOCTOR_PROBE_DIR"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


def after_fork_in_child() -> None:
    renew_after_fork()


def before_fork() -> None:
    rec = current_recorder()
    if rec is None:
        return
    try:
        import torch
        if not torch.cuda.is_initialized():
            return
    except Exception:  # noqa: BLE001 - a probe never breaks the fork
        return
    stack = [f.filename for f in traceback.extract_stack()]
    if any(os.path.join("torch", "utils", "data") in s for s in stack):
        return  # DataLoader workers fork after CUDA by design; they do not touch CUDA
    rec.event("fork_after_cuda")
    rec.flush()


def started_by() -> str:
    """Who started this interpreter, as the report's launcher: "ray" in a Ray worker process (Ray
    Train's workers: Ray's worker module is loaded and connected as a worker, not as the driver),
    else "spawn" (torch.multiprocessing.spawn, multiprocessing, subprocess)."""
    worker = sys.modules.get("ray._private.worker")
    mode = getattr(getattr(worker, "global_worker", None), "mode", None)
    return "ray" if worker is not None and mode == getattr(worker, "WORKER_MODE", object()) else "spawn"


def child_env(env: dict[str, str], out_dir: str) -> None:
    """Make Python processes started with `env` record too (PYTHONPATH + the probe directory)."""
    env[PROBE_DIR_ENV] = out_dir
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *parts])
