"""A test double for a faulty transport, loaded into real ranks through DDP_DOCTOR_CHECK_MODULES.

Importing it wraps torch.distributed's all_reduce, broadcast and all_gather so that, on the rank
named by FAULTY_RANK (default 1), the first element of every float32 result is off by one once
the collective completes - what a corrupting NIC or NCCL transport does to a real job. It
registers no check. Float64 tensors (ddp-doctor's own timing exchange) are left alone.
"""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

FAULTY = int(os.environ.get("FAULTY_RANK", "1"))


class _CorruptingWork:
    def __init__(self, work: Any, tensors: list[Any]) -> None:
        self._work, self._tensors = work, tensors

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs)
        for t in self._tensors:
            if t.dtype == torch.float32 and t.numel():
                t.view(-1)[0] += 1.0
        return out


def _wrap(original: Any, result_of: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        work = original(*args, **kwargs)
        if dist.get_rank() != FAULTY:
            return work
        tensors = result_of(*args, **kwargs)
        if work is None:  # synchronous call: already complete
            _CorruptingWork(type("Done", (), {"wait": lambda self, *a, **k: True})(), tensors).wait()
            return None
        return _CorruptingWork(work, tensors)
    return wrapped


dist.all_reduce = _wrap(dist.all_reduce, lambda t, *a, **k: [t])
dist.broadcast = _wrap(dist.broadcast, lambda t, *a, **k: [t])
dist.all_gather = _wrap(dist.all_gather, lambda out, *a, **k: [out[0]])
