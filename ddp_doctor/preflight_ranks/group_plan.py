"""The ranks agree on the group checks before running them (DDP326): those checks are collectives,
called in the same order on every rank, so a rank with another plan (another ddp-doctor version,
another --select / --skip) would leave its peers waiting in a collective it never calls."""
from __future__ import annotations

import hashlib
from typing import Any

from ddp_doctor import checks as catalogue
from ddp_doctor.checks import rendezvous as ev
from ddp_doctor.comm import sweep
from ddp_doctor.findings import Finding


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
    try:
        got = tuple(int(v[0]) for v in sweep.world_comm(group).gather_floats([float(mine)]))
    except Exception as e:  # noqa: BLE001 - a peer gone or in another collective: the gather fails its own way
        return ev.plans_differ_finding(ev.PlanExchange(tuple(plan), __version__, None, type(e).__name__,
                                                       str(e)[:200]), rank)
    return ev.plans_differ_finding(ev.PlanExchange(tuple(plan), __version__, got), rank)
