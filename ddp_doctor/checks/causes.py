"""Which finding is the cause and which are its consequences, from what the ranks did: the
ledgers' verdict (checks/collectives.py) explains the errors of the ranks that only waited and the
hang itself (init_process_group's arguments do the same for theirs: checks/init_arguments.py).
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.collectives import ledger_findings
from ddp_doctor.checks.crash_ledgers import INFERRED
from ddp_doctor.checks.rank_endings import ABORT_AT_EXIT, NATIVE_CRASH, RANK_KILLED, STUCK_AT_EXIT
from ddp_doctor.checks.stalls import RANK_HUNG, hang_explained
from ddp_doctor.findings import Finding

# What a rank's own failure or the hang looks like; the ledger may show it was only waiting.
_SYMPTOMS_NOT = {NATIVE_CRASH.id, RANK_KILLED.id, ABORT_AT_EXIT.id,
                 STUCK_AT_EXIT.id}


def with_ledgers(findings: list[Finding], ledgers: dict[int, dict[str, Any]],
                 world_size: int | None = None,
                 branches: dict[str, list[dict[str, Any]]] | None = None) -> list[Finding]:
    """Add what the ranks' ledgers of collectives show (checks/collectives.py) and let it name the
    cause: an error raised on a rank the ledger shows waiting in (or failing in) the collective
    at fault, and the hang itself, become consequences of it. A ledger finding dates from the
    collective it is about, before any timeout it led to. `branches`: the source's rank-conditional
    branches around the call sites (checks/collectives.py)."""
    found = ledger_findings(ledgers, world_size=world_size, branches=branches)
    if not found:
        return findings
    waited: set[int] = set()
    for lf in found:
        per_rank = lf.evidence.get("ranks") or {}
        waited |= {int(r) for r, ev in per_rank.items() if isinstance(ev, dict) and ev.get("consequence")}
        created = [ev.get("entry", {}).get("time_created_ns") for ev in per_rank.values() if isinstance(ev, dict)]
        created = [c for c in created if isinstance(c, int) and c > 0]
        if created:
            lf.time = min(created) / 1e9
    cause = found[0].id
    dumps = {int(r): str(d["path"]) for r, d in ledgers.items()
             if isinstance(d, dict) and d.get("source") == "nccl_dump" and d.get("path")}
    if dumps:  # where NCCL's own dumps are (training/run/nccl_dumps.py)
        for lf in found:
            lf.evidence = {**lf.evidence, "nccl_dumps": {str(r): p for r, p in sorted(dumps.items())}}
    # ranks whose ledger was inferred from their crash inside a collective (checks/crash_ledgers.py)
    # and that a ledger finding names: the crash was the library's answer to what the ledger shows
    named = {int(r) for lf in found for r in (lf.evidence.get("ranks") or {})}
    crashed_in = {int(r) for r, d in ledgers.items() if isinstance(d, dict) and d.get("source") == INFERRED} & named
    for f in findings:
        if f.phase != "training" or f.severity != "error":
            continue
        if f.id == NATIVE_CRASH.id and f.ranks and set(f.ranks) <= crashed_in:
            f.caused_by = cause
            continue
        if f.id in _SYMPTOMS_NOT and not _watchdog_abort(f, waited):
            continue
        if f.id == RANK_HUNG.id:
            hang_explained(f, found[0])
        elif f.ranks and set(f.ranks) <= waited:
            f.caused_by = cause
            if f.id == NATIVE_CRASH.id and f.ranks and f.ranks[0] in dumps:
                f.evidence["nccl_dump"] = dumps[f.ranks[0]]
    return findings + found


def _watchdog_abort(f: Finding, waited: set[int]) -> bool:
    """A rank aborted (SIGABRT) while its ledger shows it waiting in the collective at fault:
    NCCL's watchdog ended it when that collective timed out, a consequence of the cause."""
    return (f.id == NATIVE_CRASH.id and f.evidence.get("signal") == "SIGABRT"
            and bool(f.ranks) and set(f.ranks) <= waited)
