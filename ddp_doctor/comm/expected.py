"""The all_reduce busbw an instance type should reach (expected_busbw, read from the one
instance table, ddp_doctor.sagemaker.instances) and what usually makes it low (likely_causes).
"""
from __future__ import annotations

from typing import Mapping

from ddp_doctor.comm.arithmetic import MIB

# Below this largest size a busbw figure says more about latency than about the links.
MIN_JUDGED_BYTES = 32 * MIB
DEFAULT_MIN_FRACTION = 0.5


def expected_busbw(instance_type: str | None, scope: str) -> float | None:
    """The busbw a healthy instance reaches for scope "intra-node" or "inter-node", or None
    (unknown type, or no sourced figure for it)."""
    from ddp_doctor.sagemaker import instances  # when asked: the command line only reads the defaults
    known = instances.lookup(instance_type) if instance_type else None
    return known.expected_busbw(scope) if known else None


def likely_causes(scope: str, env: Mapping[str, str], instance_type: str | None) -> list[str]:
    """What usually makes a healthy instance's busbw low, quoting the settings seen."""
    def seen(name: str) -> str:
        return f"{name}={env[name]}" if name in env else f"{name} unset"
    from ddp_doctor.sagemaker import instances
    known = instances.lookup(instance_type) if instance_type else None
    if scope == "intra-node":
        causes = [f"peer-to-peer disabled ({seen('NCCL_P2P_DISABLE')}, {seen('NCCL_P2P_LEVEL')})",
                  "a PCIe-only path between the GPUs (check `nvidia-smi topo -m` for NV# links)"
                  + (" - this instance type has no NVLink" if known and known.nvlink is False else ""),
                  "GPUs throttled or shared with other processes (`nvidia-smi -q -d PERFORMANCE`)"]
        if env.get("NCCL_SHM_DISABLE"):
            causes.append(seen("NCCL_SHM_DISABLE"))
        return causes
    return [f"EFA not in use: {seen('FI_PROVIDER')} (EFA instances need FI_PROVIDER=efa and the "
            "aws-ofi-nccl plugin; with NCCL_DEBUG=INFO NCCL must log `NET/OFI`, not `NET/Socket`)",
            f"{seen('NCCL_SOCKET_IFNAME')}: the interface must be the instance's network interface",
            f"{seen('NCCL_IB_DISABLE')}, {seen('NCCL_NET')}",
            "a security group or subnet that routes node-to-node traffic the slow way"]
