"""Rules over the in-training probe records about how a script ends: the default process group the
script made itself still up when it ended well (DDP880), and what kept a rank's process alive
after its script ended (`exit_holders`, the words of DDP806 in rank_endings.py).

Pure functions: records in, findings or words out.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.probe_records import finding_at
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

NO_DESTROY = declare(
    "DDP880", category="teardown", severity="warning", title="Script ended without destroy_process_group",
    doc="""
    What: The script ended successfully while the default process group it created itself was
    still up (groups made by Trainer/accelerate or Lightning are theirs to manage).
    Why: A process group left alive at exit is torn down in static destructors: NCCL warns or hangs
    at exit, and some launchers wait for ranks that never finish.
    Fix: Call dist.destroy_process_group() at the end of training (in a finally block).
    """)


def teardown(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    left = []
    for r, rec in ranks.items():
        ended = rec.get("ended") or {}
        # Only a group the script made itself: Trainer/accelerate and Lightning own the groups they make.
        made = any(e.get("kind") == "init_process_group" and e.get("ok") and not e.get("by_library")
                   for e in rec.get("events", []))
        if made and ended.get("pg_initialized") and ended.get("exit_code", 0) == 0:
            left.append(r)
    if not left:
        return []
    return [finding_at(NO_DESTROY, (
        f"rank(s) {format_ranks(left)} ended the script with the default process group still up "
        f"(destroy_process_group was not called)"), rank=None, ranks=sorted(left), phase="teardown")]


HOLDERS_LISTED = 4  # threads and children named in a message; the evidence keeps what the rank recorded


def _thread_words(t: dict[str, Any]) -> str:
    said = f"thread {t.get('name')!r} (not a daemon)"
    where, user = t.get("where"), t.get("user_where")
    if where:
        said += f" blocked at {where}"
    if t.get("called") and t.get("called") != where:
        said += f" (in {t['called']})"
    if user and user != where:
        said += f", from {user}"
    if t.get("started_at"):
        said += f", started at {t['started_at']}"
    return said


def _child_words(c: dict[str, Any]) -> str:
    said = f"child process pid {c.get('pid')} ({c.get('cmdline') or 'command line not readable'})"
    if c.get("started_at"):
        said += f", started at {c['started_at']}"
    return said


def exit_holders(held: Any) -> str | None:
    """What kept a rank's process alive past its teardown bound, from the "held_by" its outcome
    holds (training/probes/exit_holders.py: threads alive and not daemon, children alive), in
    words: "thread 'metrics-uploader' (not a daemon) blocked at .../threading.py:327 in wait (in
    .../queue.py:171 in get), from train.py:9 in worker, started at train.py:12". None when the
    rank recorded nothing holding it (no record, or only the interpreter's or torch's own
    teardown): then it is not the script's."""
    if not isinstance(held, dict):
        return None
    threads = [t for t in held.get("threads") or [] if isinstance(t, dict)]
    kids = [c for c in held.get("children") or [] if isinstance(c, dict)]
    words = [_thread_words(t) for t in threads] + [_child_words(c) for c in kids]
    if not words:
        return None
    more = f"; and {len(words) - HOLDERS_LISTED} more" if len(words) > HOLDERS_LISTED else ""
    return "; ".join(words[:HOLDERS_LISTED]) + more
