"""Exceptions that ended a thread of the script (DDP815): Python prints them and the script goes
on, so the rank can end with exit status 0 while a collective failed in that thread.

Pure functions over the in-training probe records (training/probes/recorder.py: `thread_errors`,
kept by the probes' threading.excepthook).
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.probe_records import finding_at
from ddp_doctor.findings import Finding
from ddp_doctor.registry import declare

THREAD_DIED = declare(
    "DDP815", category="training_failure", severity="error",
    title="A thread of the script died with an exception",
    doc="""
    What: A thread the script started (not its main thread) ended with an uncaught exception, as
    the probes' threading.excepthook saw it: the finding names the rank, the thread, the exception
    and the line of the script it came from. An error when the exception was raised inside a
    torch.distributed call and the job did not otherwise fail (a collective failed: the ranks
    did not all do what the script asked, even if every rank exited 0); otherwise a warning.
    Why: Python prints an uncaught exception of a thread and lets the others go on: the script
    ends with exit status 0, and the work of that thread (a metrics reporter, a checkpoint
    uploader, a prefetcher) is silently lost. A collective issued from a second thread also races
    the main thread's: the ranks may pair different calls.
    Fix: Issue the collectives of a process group from one thread (the main one), in the same order
    on every rank; collect the results of worker threads (concurrent.futures: future.result()
    re-raises their errors) so that a failure fails the script.
    """)


def thread_errors(ranks: dict[int, dict[str, Any]], *, failed: bool) -> list[Finding]:
    """DDP815 for each rank's first thread that died with an exception (one finding a rank).
    `failed`: the job already failed (the thread's error is then a warning beside its cause)."""
    out = []
    for r, rec in sorted(ranks.items()):
        errors = [e for e in rec.get("thread_errors") or [] if isinstance(e, dict)]
        if not errors:
            continue
        e = errors[0]
        site = f" at {e['site']}" if e.get("site") else ""
        inside = f", inside torch.distributed.{e['call']}" if e.get("call") else ""
        more = f" ({len(errors) - 1} more thread(s) died too)" if len(errors) > 1 else ""
        message = (f"rank {r}: thread {e.get('thread')!r} died with {e.get('type')}: {e.get('message')}"
                   f"{site}{inside}; the script went on{more}")
        severity = "error" if e.get("call") and not failed else "warning"
        out.append(finding_at(THREAD_DIED, message, rank=r, severity=severity, at=e.get("t"),
                              evidence={"threads": errors}))
    return out
