"""A test double for a rank whose init_process_group fails while its peers' init returned, loaded
into real ranks through DDP_DOCTOR_CHECK_MODULES. Registers no check.

Importing it wraps torch.distributed's init_process_group. On the rank named by FAIL_INIT_RANK
(default 1) torch's own call completes, then the call raises CUDA's "invalid device ordinal": what
NCCL's lazy init looks like when a rank's GPU does not exist. Its peers' init returned, and a
first collective of theirs would wait for a rank that takes no part. The group is left up (the
process's exit ends it): destroyed here, it would close connections a peer's init may still be
completing (init_process_group has no barrier at its end) and fail that peer's init too.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import torch.distributed as dist

FAILING = int(os.environ.get("FAIL_INIT_RANK", "1"))


def _wrap_init(orig: Any) -> Any:
    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        if dist.get_rank() == FAILING:
            raise RuntimeError("CUDA error: invalid device ordinal (a test double: init_fails_on_one_rank)")
        return out
    return init_process_group


if not getattr(dist.init_process_group, "_init_fails_wrapped", False):
    dist.init_process_group = _wrap_init(dist.init_process_group)
    dist.init_process_group._init_fails_wrapped = True  # type: ignore[attr-defined]
