"""`ddp_doctor.check_sampler(loader_or_sampler, epochs=2)`: before training, draw the indices every
rank would draw and check the shards are disjoint, cover the data set, and change between epochs.

It runs in one process: for a DistributedSampler it builds the sampler of every rank (same seed,
rank r of num_replicas); any other sampler is what every rank would draw, since each rank builds
the same one. DistributedSampler's padding (up to num_replicas - 1 repeated indices when
drop_last=False) is by design and not reported as overlap. This module only draws; the findings
(DDP850-DDP852) are decided and worded in ddp_doctor/checks/sampler.py (draw_findings).
"""
from __future__ import annotations

import copy
import os
from typing import Any

from ddp_doctor.checks.sampler import SamplerDraws, draw_findings
from ddp_doctor.findings import Finding


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
    draws: list[list[list[int]]] = []  # epoch -> rank -> indices
    for e in range(max(1, epochs)):
        per_rank = []
        for r in range(world):
            s = copy.copy(sampler)
            if distributed:
                s.rank = r
            per_rank.append(_draw(s, e))
        draws.append(per_rank)
    return draw_findings(SamplerDraws(
        sampler=type(sampler).__name__, dataset_size=n, world=world, distributed=distributed,
        drop_last=bool(getattr(sampler, "drop_last", False)), draws=draws, num_replicas=replicas,
        actual_world=actual))
