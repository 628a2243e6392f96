"""Facts about this host that a RankContext records: hostname, interfaces, GPUs, backends.

Kept apart from the pure context builder so tests can hand in a :class:`HostFacts` of their own
(e.g. a machine with 8 GPUs) while the real one reads this machine.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping

from ddp_doctor.facts import nvml
from ddp_doctor.facts.env_values import visible_devices
from ddp_doctor.facts.nvml import is_unknown


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    interfaces: tuple[str, ...]
    visible_gpus: int            # what torch.cuda.device_count() sees (after CUDA_VISIBLE_DEVICES)
    physical_gpus: int | None    # what NVML counts on the host (None: no NVML)
    backends: tuple[str, ...]    # process-group backends this torch build has


def interfaces() -> tuple[str, ...]:
    try:
        import psutil
        return tuple(sorted(psutil.net_if_addrs()))
    except Exception:  # noqa: BLE001 - psutil missing or the kernel refused: fall back to /sys
        try:
            return tuple(sorted(os.listdir("/sys/class/net")))
        except OSError:
            return ()


def nvml_gpu_count() -> int | None:
    """GPUs NVML counts on this host (ignores CUDA_VISIBLE_DEVICES), None without a driver."""
    with nvml.session() as s:  # the one NVML wrapper: it never raises, a failure is "not ok"
        count = s.device_count() if s.ok else None
    return None if count is None or is_unknown(count) else int(count)


def visible_gpu_count(env: Mapping[str, str] | None = None) -> int:
    """GPUs this process may use, without importing torch when NVML can tell."""
    env = os.environ if env is None else env
    physical = nvml_gpu_count()
    if not physical:
        return 0
    entries = visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    return physical if entries is None else min(len(entries), physical)


def torch_gpu_count() -> int:
    try:
        import torch
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - torch missing, or a driver error: no GPU seen
        return 0


def available_backends() -> tuple[str, ...]:
    out = []
    try:
        import torch.distributed as dist
        if dist.is_available():
            if dist.is_gloo_available():
                out.append("gloo")
            if dist.is_nccl_available():
                out.append("nccl")
            if getattr(dist, "is_mpi_available", lambda: False)():
                out.append("mpi")
    except Exception:  # noqa: BLE001 - torch missing or broken: no backend of its own
        pass
    if smddp_available():
        out.append("smddp")
    return tuple(out)


SMDDP_MODULE = "smdistributed.dataparallel.torch.torch_smddp"  # importing it registers backend "smddp"


def smddp_available() -> bool:
    """Whether the module that registers the smddp backend exists (not only a top-level
    `smdistributed` package, which the model-parallel library or a stub also provides). Finding a
    submodule imports its parent packages; any failure there means it cannot be used."""
    try:
        import importlib.util
        return importlib.util.find_spec(SMDDP_MODULE) is not None
    except Exception:  # noqa: BLE001 - ModuleNotFoundError for a missing parent, or its import failed
        return False


def read_host_facts() -> HostFacts:
    return HostFacts(hostname=socket.gethostname(), interfaces=interfaces(),
                     visible_gpus=torch_gpu_count(), physical_gpus=nvml_gpu_count(),
                     backends=available_backends())


CGROUP_ROOT_ENV = "DDP_DOCTOR_CGROUP_ROOT"  # tests give a directory of their own
UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a page-aligned number near 2**63


def container_memory(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(limit, used) in bytes from this process's memory cgroup (v2: memory.max, memory.current;
    v1: memory/memory.limit_in_bytes, memory.usage_in_bytes), as a container or a Kubernetes pod
    limits it; None without a limit (or no cgroup to read). psutil's figures are the machine's."""
    root = (env if env is not None else os.environ).get(CGROUP_ROOT_ENV) or "/sys/fs/cgroup"
    for limit_file, used_file in (("memory.max", "memory.current"),
                                  ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            with open(os.path.join(root, limit_file), encoding="utf-8") as f:
                raw = f.read().strip()
            if raw == "max":
                return None
            limit = int(raw)
            with open(os.path.join(root, used_file), encoding="utf-8") as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        return (limit, used) if 0 < limit < UNLIMITED else None
    return None

