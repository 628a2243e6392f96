"""Loaded through DDP_DOCTOR_CHECK_MODULES in a test: makes ddp-doctor's own view collection fail,
to prove such a failure still ends in a report (DDP005) and exit code 1, not a lost report."""
from __future__ import annotations

from ddp_doctor.preflight_ranks import rank_view as views


def _broken(ctx):
    raise OSError("simulated failure inside ddp-doctor")


views.collect_view = _broken
