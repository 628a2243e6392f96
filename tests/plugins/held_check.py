"""A check module for tests, loaded through DDP_DOCTOR_CHECK_MODULES: one local check that holds its
rank, so that a test can act on a preflight whose ranks are known to be running (started, not
finished) instead of guessing how long they take to get there.

Each rank leaves a file `rank-N` in $HELD_CHECK_DIR as it enters the check, then stays in it until
the file `release` appears there or HOLD seconds pass (whoever ends the ranks first wins).
"""
from __future__ import annotations

import os
import time

from ddp_doctor.registry import check

DIR_ENV = "HELD_CHECK_DIR"
HOLD = 600.0  # seconds: longer than any test waits; the test ends the ranks (or releases them)


@check("DDP996", category="host", severity="info", title="Test check that holds its rank", timeout=HOLD + 60)
def holds(ctx):
    """
    What: Holds the rank in the local checks until the test releases it (tests only).
    Why: Lets a test stop a preflight while its ranks are known to be running.
    Fix: Nothing to fix: remove tests.plugins.held_check from DDP_DOCTOR_CHECK_MODULES.
    """
    where = os.environ.get(DIR_ENV)
    if where:
        open(os.path.join(where, f"rank-{ctx.rank}"), "w").close()
        release = os.path.join(where, "release")
        end = time.monotonic() + HOLD
        while not os.path.exists(release) and time.monotonic() < end:
            time.sleep(0.1)
    yield from ()
