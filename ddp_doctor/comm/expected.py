"""The all_reduce busbw an instance type should reach (expected_busbw, read from the one
instance table, ddp_doctor.facts.instances), the share of it one inter-node group gets when
several are swept at once (share_divisor, expected_for), and what usually makes it low (likely_causes).

The inter-node judgement (docs/communication.md, "The inter-node judgement"): the table's inter-node
figure E is a node's: the busbw of nccl-tests all_reduce_perf over all GPUs of 2+ nodes, bounded by
what the node's network cards carry together. DDP401 sweeps the inter-node groups (the ranks sharing
a local rank, one per node) all at once, so the k groups swept together share each node's cards,
and a GPU reaches only its own cards' part of them: each group's busbw is judged against

    E_group = E / max(k, G)        k = inter-node groups swept at once, G = GPUs of the instance type

(a whole-world sweep over several nodes, the figure nccl-tests users quote, is judged against E).
"""
from __future__ import annotations

from typing import Mapping

from ddp_doctor.comm.arithmetic import MIB
from ddp_doctor.facts import instances

# Below this largest size a busbw figure says more about latency than about the links.
MIN_JUDGED_BYTES = 32 * MIB
DEFAULT_MIN_FRACTION = 0.5


def expected_busbw(instance_type: str | None, scope: str) -> float | None:
    """The busbw a healthy instance reaches for scope "intra-node" or "inter-node", or None
    (unknown type, or no sourced figure for it)."""
    known = instances.lookup(instance_type) if instance_type else None
    return known.expected_busbw(scope) if known else None


def share_divisor(instance_type: str | None, sharing: int | None) -> int:
    """Into how many shares the node's inter-node figure is split for one group of a sweep run
    `sharing` groups at once over each node's network cards: max(sharing, GPUs of the type), or 1
    for a figure that is the node's own (sharing None or 0: a whole-world sweep)."""
    if not sharing:
        return 1
    known = instances.lookup(instance_type) if instance_type else None
    return max(int(sharing), known.gpus if known else 1, 1)


def expected_for(instance_type: str | None, scope: str, sharing: int | None = None
                 ) -> tuple[float, float, int] | None:
    """(what this sweep should reach, the instance's figure, the divisor between them) for scope
    "intra-node" or "inter-node"; `sharing` (inter-node only): the groups swept at once. None when
    the type has no figure."""
    node = expected_busbw(instance_type, scope)
    if node is None:
        return None
    divisor = share_divisor(instance_type, sharing) if scope == "inter-node" else 1
    return node / divisor, node, divisor


def likely_causes(scope: str, env: Mapping[str, str], instance_type: str | None) -> list[str]:
    """What usually makes a healthy instance's busbw low, quoting the settings seen."""
    def seen(name: str) -> str:
        return f"{name}={env[name]}" if name in env else f"{name} unset"
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
