"""Node layout of a job: which node each rank is on (node_key, layout), the intra-node and
inter-node groups every rank computes alike (node_groups), and their process groups (split_comms).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Sequence

from ddp_doctor.comm.sweep import Comm


def node_key(ctx: Any) -> int:
    """A number naming this rank's node: the launcher's node rank, else a hash of the host name."""
    import zlib
    if ctx.node_rank is not None:
        return int(ctx.node_rank)
    return zlib.crc32((ctx.host.hostname or "").encode()) & 0x7FFFFFFF


def layout(comm: Comm, ctx: Any) -> list[tuple[int, int]]:
    """(node key, local rank) of every rank, gathered (every rank sees the same list)."""
    local = ctx.local_rank if ctx.local_rank is not None else comm.rank
    return [(int(a), int(b)) for a, b in comm.gather_floats([node_key(ctx), local])]


def node_groups(lay: Sequence[tuple[int, int]]) -> tuple[list[list[int]], list[list[int]]]:
    """(intra-node groups: the ranks of each node; inter-node groups: the ranks that share a
    local rank, one per node), each sorted, in a fixed order every rank computes alike."""
    nodes: dict[int, list[int]] = {}
    locals_: dict[int, list[int]] = {}
    for r, (node, local) in enumerate(lay):
        nodes.setdefault(node, []).append(r)
        locals_.setdefault(local, []).append(r)
    intra = [nodes[k] for k in sorted(nodes, key=lambda k: min(nodes[k]))]
    inter = [locals_[k] for k in sorted(locals_)]
    return intra, inter


def concurrent_inter_groups(lay: Sequence[tuple[int, int]]) -> int:
    """How many inter-node groups (of more than one rank) are swept at the same time: each has at
    most one rank per node, so this many ranks of a node share its network cards at once."""
    return sum(1 for members in node_groups(lay)[1] if len(members) > 1)


def split_comms(world: Comm, lay: Sequence[tuple[int, int]]) -> tuple[Comm | None, Comm | None]:
    """Create every intra- and inter-node group (new_group is collective over all ranks, so every
    rank creates every group in the same order) and return this rank's two (None where its
    group has a single rank)."""
    import torch.distributed as dist
    intra, inter = node_groups(lay)
    mine: dict[str, Comm | None] = {"intra-node": None, "inter-node": None}
    for label, groups in (("intra-node", intra), ("inter-node", inter)):
        for members in groups:
            pg = dist.new_group(members, timeout=timedelta(seconds=world.timeout))
            if world.rank in members and len(members) > 1:
                mine[label] = Comm(rank=members.index(world.rank), size=len(members), device=world.device,
                                   timeout=world.timeout, pg=pg, label=label, ranks=list(members))
    return mine["intra-node"], mine["inter-node"]
