"""Rule over the in-training probe records about how a script ends (DDP880): the default process
group the script made itself still up when it ended well.

Pure function: records in, findings out (`teardown`).
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
