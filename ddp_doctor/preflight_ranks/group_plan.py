"""The ranks agree on the group checks before running them (DDP326): those checks are collectives,
called in the same order on every rank, so a rank with another plan (another ddp-doctor version,
another --select / --skip) would leave its peers waiting in a collective it never calls."""
from __future__ import annotations

import hashlib
from typing import Any

from ddp_doctor import checks as catalogue
from ddp_doctor.checks import rendezvous as ev
from ddp_doctor.checks.internal import event_finding
from ddp_doctor.comm import sweep
from ddp_doctor.findings import ROOT_CAUSE, Finding, brief_ranks


def group_plan(select: list[str] | None, skip: list[str] | None) -> list[str]:
    """The IDs of the group checks this rank would run, in their order."""
    return [entry.id for entry in catalogue.checks_for("group", select, skip)]


def plan_digest(version: str, plan: list[str]) -> int:
    """48 bits of the plan's digest: exact as the float64 a collective carries."""
    return int(hashlib.sha256("\n".join([version, *plan]).encode()).hexdigest()[:12], 16)


def plans_differ(group: Any, plan: list[str], rank: int | None) -> Finding | None:
    """None when every rank of `group` would run `plan` with this ddp-doctor version; else DDP326
    (the same message on every rank, each rank's plan in its evidence). One all_gather of the
    digest, bounded by the group's timeout (a rank of another version may call another collective
    here: the exchange then fails or gives digests that differ)."""
    from ddp_doctor.version import __version__
    mine = plan_digest(__version__, plan)
    evidence: dict[str, Any] = {"plan": plan, "ddp_doctor": __version__}
    try:
        got = [int(v[0]) for v in sweep.world_comm(group).gather_floats([float(mine)])]
    except Exception as e:  # noqa: BLE001 - a peer gone or in another collective: the gather fails its own way
        # a consequence when something else failed first (a rank whose init failed never comes here)
        return event_finding(
            ev.PLANS_DIFFER, "the ranks could not compare the group checks they would run before running "
            f"them ({type(e).__name__}: {str(e)[:200]}): none ran; a rank whose process group failed, or "
            "one of another ddp-doctor version calling other collectives, leaves the others waiting here",
            rank=rank, evidence={**evidence, "error": str(e)[:200]}, caused_by=ROOT_CAUSE)
    if len(set(got)) == 1:
        return None
    by_digest: dict[int, list[int]] = {}
    for r, digest in enumerate(got):
        by_digest.setdefault(digest, []).append(r)
    plans = sorted(by_digest.values())
    return event_finding(
        ev.PLANS_DIFFER, f"the ranks would run different group checks ({len(plans)} plans: "
        + "; ".join(f"rank(s) {brief_ranks(rs)}" for rs in plans)
        + "), which are collectives every rank must call in the same order: none ran (each plan, its "
        "checks and its ddp-doctor version, is in the evidence by rank)", rank=rank, evidence=evidence)
