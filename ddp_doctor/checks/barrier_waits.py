"""A monitored barrier that timed out (DDP819): torch's monitored_barrier names the ranks that did
not arrive ("Rank 1 failed to pass monitoredBarrier in 3000 ms"), on the rank that waited; those
ranks are the cause, and where each was then comes from its heartbeat or ledger. Pure functions
over the ranks' outcomes and position records.
"""
from __future__ import annotations

import re
from typing import Any

from ddp_doctor.checks.init_late import where_then
from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

LATE_AT_BARRIER = declare(
    "DDP819", category="training_failure", severity="error",
    title="Ranks did not reach a monitored barrier in time",
    doc="""
    What: A rank waited in torch.distributed.monitored_barrier past its timeout, and torch named
    the ranks that did not arrive ("Rank 1 failed to pass monitoredBarrier in 3000 ms"; every late
    rank with wait_all_ranks=True). The finding names those ranks, the barrier's line and how long
    it waited, and where each late rank was then (its last heartbeat or ledger, within a few
    seconds of the timeout); the waiting rank's error is its consequence.
    Why: monitored_barrier exists to say which rank is missing; its error is raised on the rank
    that waited (rank 0), so torch's traceback and a launcher's summary point at the rank that did
    nothing wrong.
    Fix: Look at where the late rank was: make the work before the barrier the same length on
    every rank (a download, a preprocessing step or a checkpoint on one rank only), or give the
    barrier (and the process group) a timeout that covers it.
    """, cause_class="unknown")

_MISSING = re.compile(r"Ranks? (?P<ranks>\d+(?:\s*,\s*\d+)*) failed to pass monitoredBarrier in (?P<ms>\d+) ?ms")


def monitored_barrier_verdict(findings: list[Finding], *, outcomes: dict[int, dict[str, Any]],
                              ledgers: dict[int, dict[str, Any]],
                              heartbeats: dict[int, dict[str, Any]]) -> list[Finding]:
    """`findings` plus DDP819 for each rank whose error is a monitored barrier's timeout naming the
    late ranks; that error becomes its consequence."""
    found: list[Finding] = []
    for f in findings:
        if f.phase != "training" or f.severity != "error" or f.caused_by is not None or len(f.ranks) != 1:
            continue
        waiter = f.ranks[0]
        exc = (outcomes.get(waiter) or {}).get("exception")
        if not isinstance(exc, dict):
            continue
        m = _MISSING.search(str(exc.get("message") or ""))
        if m is None:
            continue
        late = sorted({int(x) for x in re.findall(r"\d+", m["ranks"])} - {waiter})
        if not late:
            continue
        at = float(exc.get("time") or 0) or None
        site = f.evidence.get("raised_at")
        parts = []
        for k in late:
            pos = where_then(k, at, ledgers, heartbeats) if at is not None else None
            parts.append(f"rank {k} was at {pos['where']}" if pos else f"where rank {k} was is not known")
        who = f"rank {late[0]}" if len(late) == 1 else f"ranks {format_ranks(late)}"
        message = (f"{who} did not reach the monitored barrier that rank {waiter} waited in"
                   f"{f' (at {site})' if site else ''} for {int(m['ms']) / 1000:g} s: " + "; ".join(parts))
        cause = event_finding(LATE_AT_BARRIER, message, rank=None, ranks=late, phase="training", time=at,
                              evidence={"waiting_rank": waiter, "barrier_at": site, "timeout_s": int(m["ms"]) / 1000})
        f.caused_by = cause.id
        found.append(cause)
    return findings + found
