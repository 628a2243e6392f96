"""What the rules over in-training probe records share: one record per rank (`by_rank`), a finding
stamped with the time of the event behind it (`finding_at`), and " at <file:line>" (`where`).

Records are the plain dicts the probes write, one per process (ddp_doctor/training/probes/recorder.py).
"""
from __future__ import annotations

from typing import Any, Iterable

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding


def by_rank(records: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """One record per rank: the process that formed the process group as that rank wins over a
    process that only carries the rank in its environment (a spawn parent, a launcher), and a
    rank's own final record over the copy it shared through the store before it ended."""
    out: dict[int, dict[str, Any]] = {}
    for rec in records:
        r = rec.get("rank")
        if r is None:
            continue
        old = out.get(int(r))
        if old is None or _completeness(rec) > _completeness(old):
            out[int(r)] = rec
    return out


def _completeness(rec: dict[str, Any]) -> tuple[bool, int, int, bool]:
    return (bool(rec.get("pg")), int(rec.get("steps") or 0), len(rec.get("loaders") or []), bool(rec.get("ended")))


def finding_at(entry: Any, message: str, *, rank: int | None, ranks: list[int] | None = None,
               evidence: dict[str, Any] | None = None, phase: str = "training", at: float | None = None,
               severity: str | None = None) -> Finding:
    """An event finding of the training phase; `at`: when the recorded event happened."""
    f = event_finding(entry, message, rank=rank, ranks=ranks, evidence=evidence, phase=phase, severity=severity)
    if at is not None:
        f.time = at
    return f


def where(e: dict[str, Any]) -> str:
    """" at file:line" of a recorded event, empty when its call site is unknown."""
    return f" at {e['site']}" if e.get("site") else ""
