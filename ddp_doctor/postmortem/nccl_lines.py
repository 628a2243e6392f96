"""What NCCL's watchdog printed on a rank when a collective timed out, read from the rank's log:
which collective it waited in, and how far its process group had come. torch's
ProcessGroupNCCL writes (the forms of torch 1.x to 2.x; the public logs these were read from are
cited in tests/postmortem/test_public_excerpts.py):

    [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE,
        NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.
    [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) detected by
        watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.

("[Rank N]" is the rank in the process group; whose log it is says the global rank.) A collective
completes on every rank of its group or on none, so "last completed NCCL work: 807" on one rank
says every rank of the group completed #807. evidence.py turns these into ledgers of collectives,
judged by the same rules as a flight-recorder dump (checks/collectives.py). Pure functions.
"""
from __future__ import annotations

import re
from typing import Any

_WAIT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d{1,18}), "
                   r"OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel>\d{1,18}))?(?:, NumelOut=\d+)?"
                   r"(?:, Timeout\(ms\)=(?P<timeout>\d{1,18}))?\) ran for (?P<ran>\d{1,18}) milliseconds")
_PROGRESS = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)(?: PG GUID (?P<guid>\d+))?"
                       r"(?:\s*\((?P<name>[^)]*)\)|\((?P<name2>[^)]*)\))?[^\]]*\] "
                       r"Exception \(either an error or timeout\) detected by watchdog at work: (?P<at>\d{1,18}), "
                       r"last enqueued NCCL work: (?P<enq>-?\d{1,18}), "
                       r"last completed NCCL work: (?P<done>-?\d{1,18})(?!\d)")
MARKERS = ("Watchdog caught collective operation timeout", "detected by watchdog at work")


def wait_of(text: str) -> dict[str, Any] | None:
    """A watchdog timeout line: the collective (seq, op, elements) and how long it ran."""
    m = _WAIT.search(text)
    if m is None:
        return None
    return {"seq": int(m.group("seq")), "op": m.group("op"),
            "numel": int(m.group("numel")) if m.group("numel") else None,
            "timeout_ms": int(m.group("timeout")) if m.group("timeout") else None, "ran_ms": int(m.group("ran"))}


def progress_of(text: str) -> dict[str, Any] | None:
    """A watchdog's "detected at work" line: the group, the collective, the last enqueued and
    completed."""
    m = _PROGRESS.search(text)
    if m is None:
        return None
    return {"pg": m.group("pg"), "pg_name": m.group("name") or m.group("name2") or None, "at": int(m.group("at")),
            "enqueued": int(m.group("enq")), "completed": int(m.group("done"))}


_OPS = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "ALLGATHER": "all_gather", "_ALLGATHER_BASE":
        "_allgather_base", "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "_reduce_scatter_base",
        "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all_base", "BARRIER": "barrier", "REDUCE": "reduce",
        "GATHER": "gather", "SCATTER": "scatter", "SEND": "send", "RECV": "recv", "COALESCED": "coalesced"}


def op_name(op: str) -> str:
    """NCCL's OpType as the flight recorder names the collective ("nccl:all_reduce")."""
    return "nccl:" + _OPS.get(op, op.lower())
