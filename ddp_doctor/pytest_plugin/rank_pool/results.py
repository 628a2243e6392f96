"""How the ranks of one test ended, as the parent saw them: one RankEnd per rank (wait status from
the forkserver, the result file the rank wrote, its output and stack dump, its ledger of
collectives and where it was when asked), gathered in a RunResult.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.pytest_plugin.rank_pool.wire import output_path, result_path

POOL_LOST = "the rank pool (forkserver) died"
OUTPUT_LIMIT = 200_000  # characters of a rank's stdout/stderr kept for the report


@dataclass
class RankEnd:
    """How one rank ended, as the parent saw it."""
    rank: int
    status: int | None = None          # raw wait status from the forkserver (None: never reaped)
    exit_time: float | None = None
    result: dict[str, Any] | None = None
    stdout: str = ""
    stderr: str = ""
    stack: str = ""
    killed: str | None = None          # "timeout" or "peer": the parent killed it, and why
    ledger: dict[str, Any] | None = None       # ledger-RANK.json (rank_pool/ledgers.py), if it left one
    whereabouts: dict[str, Any] | None = None  # hb-RANK.json: where it was when the parent asked

    @property
    def signal(self) -> int | None:
        if self.status is not None and os.WIFSIGNALED(self.status):
            return os.WTERMSIG(self.status)
        return None

    @property
    def exit_code(self) -> int | None:
        if self.status is not None and os.WIFEXITED(self.status):
            return os.WEXITSTATUS(self.status)
        return None

    def how(self) -> str:
        if self.signal is not None:
            try:
                return f"killed by {signal.Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        if self.exit_code is not None:
            return f"exited with status {self.exit_code}"
        return "was never reaped"


@dataclass
class RunResult:
    world_size: int
    ends: dict[int, RankEnd]
    timed_out: bool = False
    timeout: float = 0.0
    seconds: float = 0.0
    pool_lost: bool = False
    notes: list[str] = field(default_factory=list)


class LeftoverProcessesWarning(UserWarning):
    """A distributed test left processes running after it ended; its rank ended them (DDP816)."""


def leftover_notes(res: RunResult) -> list[str]:
    """What each rank's test left running and the rank ended (DDP816-DDP818, checks/leftover_rules.py), in
    words; the test's outcome stays its own."""
    from ddp_doctor.checks.leftover_rules import rank_leftover_findings
    return [f"{f.id} {f.severity}: {f.message}. Fix: {f.hint}"
            for r, e in sorted(res.ends.items())
            for f in rank_leftover_findings(r, (e.result or {}).get("leftovers"), started_by="test")]


def read_result(d: str, rank: int) -> dict[str, Any] | None:
    """The result file a rank wrote before exiting, or None when it wrote none."""
    try:
        with open(result_path(d, rank), "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def read_text(path: str, limit: int = OUTPUT_LIMIT) -> str:
    """A rank's output file, its first and last limit/2 bytes when it is longer: only those are
    read, so a rank that printed gigabytes costs the parent no more memory than a short one."""
    half = limit // 2
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= limit:
                return f.read(limit).decode("utf-8", errors="replace")
            head = f.read(half)
            f.seek(size - half)
            tail = f.read(half)
    except OSError:
        return ""
    return (head.decode("utf-8", errors="replace") + "\n[... cut ...]\n"
            + tail.decode("utf-8", errors="replace"))


def collect(end: RankEnd, d: str) -> None:
    """Fill in what the rank left in the run directory."""
    end.result = read_result(d, end.rank)
    end.stdout = read_text(output_path(d, "stdout", end.rank))
    end.stderr = read_text(output_path(d, "stderr", end.rank))
    end.stack = read_text(output_path(d, "stack", end.rank))
    from ddp_doctor.training import records
    end.ledger = read_json(records.ledger_path(d, end.rank))
    end.whereabouts = read_json(records.heartbeat_path(d, end.rank))


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
