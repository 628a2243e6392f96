"""One rank's view of itself, gathered for the cross-rank checks (ddp_doctor.checks.consistency).

A view is a small JSON-serialisable dict: who this rank is, where it runs, which device it will
use, which library versions and communication settings it has, and which code it runs. Every rank
sends its view to the reporting rank, which compares them. Collecting one is cheap: versions come
from package metadata (never importing transformers & co.), and CUDA is touched only when a GPU
is visible.
"""
from __future__ import annotations

import hashlib
import os
import platform
import socket
import time
from importlib import metadata
from typing import Any

from ddp_doctor.context import RankContext
from ddp_doctor.facts.own_env import user_env
from ddp_doctor.report.redact import redact_env, redact_obj

# Communication settings compared across ranks (as the user set them: facts/own_env.py).
ENV_PREFIXES = ("NCCL_", "FI_", "GLOO_", "TORCH_NCCL_", "SMDATAPARALLEL_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
# Packages whose versions are read from metadata (name in the view -> distribution name).
PACKAGES = {"transformers": "transformers", "accelerate": "accelerate", "numpy": "numpy"}


def collect_view(ctx: RankContext) -> dict[str, Any]:
    """This rank's view: identity, host, device, versions, communication env, entry script."""
    device = _device(ctx)
    view: dict[str, Any] = {
        # a negative value (RANK=-1) is no rank: the launcher_env checks name it, the report keeps null
        "rank": _own(ctx.rank), "local_rank": _own(ctx.local_rank), "node_rank": _own(ctx.node_rank),
        "world_size": ctx.world_size, "local_world_size": ctx.local_world_size,
        "launcher": ctx.launcher.name, "backend": ctx.backend,
        "hostname": ctx.host.hostname or socket.gethostname(),
        "sm_host": ctx.sagemaker.this_host if ctx.sagemaker is not None else None,
        "pid": os.getpid(), "time": time.time(),
        "device": device, "device_uuid": _device_uuid(ctx, device),
        "versions": versions(),
        "env": redact_env(comm_env(user_env(ctx.env))),  # the user's: never ddp-doctor's per-node paths
        "entry_script": script_digest(ctx.entry_script),
    }
    return redact_obj(view)


def _device(ctx: RankContext) -> str:
    # NCCL and SMDDP ranks use the GPU numbered by their local rank (the usual set_device call).
    if ctx.backend in ("nccl", "smddp"):
        return f"cuda:{ctx.local_rank or 0}"
    return "cpu"


def _device_uuid(ctx: RankContext, device: str) -> str | None:
    """The GPU's UUID, so two ranks that reach one GPU by different indices are still caught.
    CUDA is not touched unless the host has a visible GPU (initialising it is slow and pins
    memory)."""
    if not device.startswith("cuda:") or ctx.host.visible_gpus <= 0:
        return None
    try:
        import torch
        index = int(device.split(":", 1)[1])
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # noqa: BLE001 - a driver error is another check's finding, not a reason to lose the view
        return None


def _metadata_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata on disk: the version is unknown
        return None


def versions() -> dict[str, str | None]:
    """Versions that must agree across ranks; None for what is not installed."""
    from ddp_doctor.version import __version__
    out: dict[str, str | None] = {"python": platform.python_version(), "torch": None, "cuda": None,
                                  "nccl": None}
    try:
        import torch
        out["torch"] = str(torch.__version__)
        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - torch missing or broken: the view still travels
        pass
    for key, dist in PACKAGES.items():
        out[key] = _metadata_version(dist)
    out["ddp_doctor"] = __version__
    return out


def comm_env(env: Any) -> dict[str, str]:
    """The communication-related variables of an environment mapping, sorted by name."""
    return {k: env[k] for k in sorted(env)
            if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def script_digest(path: str | None) -> dict[str, str] | None:
    """{"path", "sha256"} of the entry script, or None when there is none or it cannot be read."""
    if not path:
        return None
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return {"path": path, "sha256": h.hexdigest()}


def _own(n: int | None) -> int | None:
    return n if n is None or n >= 0 else None
