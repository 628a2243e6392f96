"""A test double for a rank whose init_process_group returns late, loaded into real ranks through
DDP_DOCTOR_CHECK_MODULES. Registers no check.

Importing it wraps torch.distributed's init_process_group and destroy_process_group. On the rank
named by LATE_INIT_RANK (default 1) init_process_group returns LATE_INIT_S seconds (default 3) after
torch's own call did: what a rank looks like whose thread wakes late on a loaded host while its
connections are already up (the window where a peer that destroys its group makes that rank's init
fail, "Gloo connectFullMesh failed ... Connection closed by peer"). Every rank appends
"init RANK WALLTIME" when its init returns and "destroy RANK WALLTIME" when it starts to destroy
the group to the file LATE_INIT_LOG: a test reads the order.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import torch.distributed as dist

LATE = int(os.environ.get("LATE_INIT_RANK", "1"))
DELAY = float(os.environ.get("LATE_INIT_S", "3"))
LOG = os.environ.get("LATE_INIT_LOG")


def _note(what: str) -> None:
    if LOG:
        with open(LOG, "a") as f:
            f.write(f"{what} {dist.get_rank() if dist.is_initialized() else -1} {time.time():.6f}\n")


def _wrap_init(orig: Any) -> Any:
    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        if dist.get_rank() == LATE:
            time.sleep(DELAY)
        _note("init")
        return out
    return init_process_group


def _wrap_destroy(orig: Any) -> Any:
    @functools.wraps(orig)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        _note("destroy")
        return orig(*args, **kwargs)
    return destroy_process_group


if not getattr(dist.init_process_group, "_late_init_wrapped", False):
    dist.init_process_group = _wrap_init(dist.init_process_group)
    dist.init_process_group._late_init_wrapped = True  # type: ignore[attr-defined]
    dist.destroy_process_group = _wrap_destroy(dist.destroy_process_group)
