"""A test double for a throttled link, loaded into real ranks through DDP_DOCTOR_CHECK_MODULES:
every all_reduce of a float32 tensor of 1 MiB or more takes THROTTLE_S seconds (default 0.05)
longer on every rank, as a degraded NIC or a link renegotiated to a lower speed would make it.
The collective itself runs unchanged (its results stay correct). Registers no check."""
from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

DELAY = float(os.environ.get("THROTTLE_S", "0.05"))
BIG = 1 << 20


class _SlowWork:
    def __init__(self, work: Any) -> None:
        self._work = work

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs) if self._work is not None else True
        time.sleep(DELAY)
        return out


def _slow(original: Any) -> Any:
    def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        work = original(tensor, *args, **kwargs)
        if tensor.dtype != torch.float32 or tensor.numel() * 4 < BIG:
            return work
        if work is None:
            time.sleep(DELAY)
            return None
        return _SlowWork(work)
    return all_reduce


if not getattr(dist.all_reduce, "_throttled", False):
    dist.all_reduce = _slow(dist.all_reduce)
    dist.all_reduce._throttled = True  # type: ignore[attr-defined]
