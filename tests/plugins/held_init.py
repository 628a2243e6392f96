"""A test double loaded into one real rank through DDP_DOCTOR_CHECK_MODULES: its init_process_group
returns only once the file `release-init` appears in $HELD_CHECK_DIR (or HOLD seconds pass), after
writing `init-held` there. Registers no check.

While it is held, the rank is past its rendezvous and keeps the store it hosts up: a test can let
other processes reach that store, see them there, and only then let the rank go on to its verdict.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import torch.distributed as dist

from tests.plugins.held_check import DIR_ENV, HOLD


def _wrap_init(orig: Any) -> Any:
    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        where = os.environ.get(DIR_ENV)
        if where:
            open(os.path.join(where, "init-held"), "w").close()
            release = os.path.join(where, "release-init")
            end = time.monotonic() + HOLD
            while not os.path.exists(release) and time.monotonic() < end:
                time.sleep(0.1)
        return out
    return init_process_group


dist.init_process_group = _wrap_init(dist.init_process_group)
