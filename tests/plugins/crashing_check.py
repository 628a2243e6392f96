"""A check module for tests, loaded through DDP_DOCTOR_CHECK_MODULES: one check that crashes."""
from __future__ import annotations

from ddp_doctor.registry import check


@check("DDP999", category="host", severity="error", title="Test check that crashes")
def crashes(ctx):
    """
    What: Raises on purpose (tests only).
    Why: Proves a crashing check becomes a DDP001 finding and the others still run.
    Fix: Nothing to fix: remove tests.plugins.crashing_check from DDP_DOCTOR_CHECK_MODULES.
    """
    raise RuntimeError("boom from a test check")
    yield  # pragma: no cover
