"""`ddp_doctor.check_sampler(loader_or_sampler, epochs=2)`: before training, draw the indices every
rank would draw and check the shards are disjoint, cover the data set, and change between epochs.

It runs in one process: for a DistributedSampler it builds the sampler of every rank (same seed,
rank r of num_replicas); any other sampler is what every rank would draw, since each rank builds
the same one. DistributedSampler's padding (up to num_replicas - 1 repeated indices when
drop_last=False) is by design and not reported as overlap. The IDs it raises (DDP850-DDP852) are
declared in ddp_doctor/checks/sampler.py.
"""
from __future__ import annotations

import copy
import os
from collections import Counter
from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.checks.sampler import NOT_COVERED, OVERLAP, SAME_ORDER
from ddp_doctor.findings import Finding, format_ranks


def _sampler_of(obj: Any) -> Any:
    batch_sampler = getattr(obj, "batch_sampler", None)
    if batch_sampler is not None and getattr(batch_sampler, "sampler", None) is not None:
        return batch_sampler.sampler
    return getattr(obj, "sampler", obj)


def _draw(sampler: Any, epoch: int) -> list[int]:
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    return [int(i) for i in iter(sampler)]


def _actual_world(world_size: int | None) -> int | None:
    """The world the sampler will run in: the argument, else the initialised process group, else
    WORLD_SIZE; None when nothing says."""
    if world_size:
        return int(world_size)
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a broken group is not this check's concern
        pass
    env = os.environ.get("WORLD_SIZE", "")
    return int(env) if env.strip().isdigit() and int(env) > 0 else None


def check_sampler(obj: Any, *, epochs: int = 2, world_size: int | None = None,
                  dataset_size: int | None = None) -> list[Finding]:
    """Findings (empty when the sharding is right) for a DataLoader or a sampler.

    For a DistributedSampler the world is its num_replicas; when the actual world (`world_size`,
    else the initialised process group, else WORLD_SIZE) is smaller, only the ranks that exist
    draw, so the shards of the missing ranks are reported as never drawn (DDP851)."""
    from torch.utils.data.distributed import DistributedSampler
    sampler = _sampler_of(obj)
    distributed = isinstance(sampler, DistributedSampler)
    actual = _actual_world(world_size)
    replicas = int(sampler.num_replicas) if distributed else None
    if distributed:
        world = min(replicas, actual) if actual else replicas
    else:
        world = int(actual or 1)
    n = dataset_size if dataset_size is not None else len(getattr(sampler, "dataset", None) or
                                                          getattr(obj, "dataset", None) or sampler)
    findings: list[Finding] = []
    draws: list[list[list[int]]] = []  # epoch -> rank -> indices
    for e in range(max(1, epochs)):
        per_rank = []
        for r in range(world):
            s = copy.copy(sampler)
            if distributed:
                s.rank = r
            per_rank.append(_draw(s, e))
        draws.append(per_rank)

    first = draws[0]
    counts = Counter(i for shard in first for i in shard)
    repeats = sum(c - 1 for c in counts.values() if c > 1)
    allowed = world - 1 if distributed and not getattr(sampler, "drop_last", False) else 0
    if world > 1 and repeats > allowed:
        shared = sorted(i for i, c in counts.items() if c > 1)
        findings.append(event_finding(OVERLAP, (
            f"{type(sampler).__name__} over {n} samples and {world} ranks: {repeats} index draws repeat "
            f"across ranks in one epoch (padding allows {allowed}); e.g. indices {shared[:5]} are drawn by "
            f"ranks {format_ranks(r for r, shard in enumerate(first) if shared and shared[0] in shard)}"),
            rank=None, ranks=list(range(world)),
            evidence={"sampler": type(sampler).__name__, "repeats": repeats, "allowed": allowed}))
    missing = n - len(counts)
    short = bool(distributed and actual and replicas and replicas > actual)
    if missing > (world - 1 if getattr(sampler, "drop_last", False) else 0):
        why = (f" (DistributedSampler num_replicas={replicas} in a world of {actual}: the shards of "
               f"ranks {format_ranks(range(actual, replicas))} are drawn by no one)") if short else ""
        findings.append(event_finding(NOT_COVERED, (
            f"one epoch over {world} rank(s) draws {len(counts)} of {n} distinct samples: {missing} never "
            f"drawn{why}"), rank=None, evidence={"missing": missing, "dataset_size": n,
                                                  **({"num_replicas": replicas, "world_size": actual}
                                                     if short else {})}))
    shuffled = any(shard != sorted(shard) for shard in first)
    if epochs > 1 and shuffled and draws[0] == draws[1]:
        findings.append(event_finding(SAME_ORDER, (
            f"{type(sampler).__name__} shuffles, but gave the same order in epochs 0 and 1 on every rank"),
            rank=None, evidence={"epochs": epochs}))
    return findings
