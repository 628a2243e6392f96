"""What a launcher printed about the ranks: torchrun's ChildFailedError summary, one block per
failed rank,

    [0]:
      time      : 2026-11-24_21:20:12
      host      : algo-2
      rank      : 1 (local_rank: 1)
      exitcode  : -11 (pid: 561)
      error_file: /tmp/torchelastic_x/.../attempt_0/1/error.json
      traceback : Signal 11 (SIGSEGV) received by PID 561

(its time is the agent's local clock, to the second; its traceback, when the rank's @record error
file held one, is the rank's own), Open MPI's summary of the first process to fail ("Process
name: [[9479,1],1]", "Exit code: 1"), torchelastic's error files
(`{"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}`, written by a
child whose entrypoint uses torch's @record), and the world size some launchers log. Read line by
line; nothing here opens a file.
"""
from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.checks.wrapped_errors import error_file_text

_BLOCK = re.compile(r"^\s*\[\d+\]:\s*$")
_FIELD = re.compile(r"^\s+(?P<key>time|host|rank|exitcode|error_file|traceback)\s*: ?(?P<value>.*?)\s*$")
_RANK = re.compile(r"^(?P<rank>\d{1,18})(?!\d)(?: \(local_rank: (?P<local>\d{1,18})\))?")
_EXIT = re.compile(r"^(?P<code>-?\d{1,18})(?!\d)")
_FAILED = re.compile(r"\bFAILED\s*$")
_RULE = re.compile(r"^\s*(?:-{3,}|={3,})\s*$")
_MPI_PROCESS = re.compile(r"Process name:\s*\[\[\d+,\d+\],(?P<rank>\d{1,18})\]")
_MPI_EXIT = re.compile(r"^\s*Exit code:\s*(?P<code>-?\d{1,18})(?!\d)")
MAX_TRACEBACK_LINES = 400
_WORLD = re.compile(r"\b(?:WORLD_SIZE|world_size)\s*[=:]\s*(?P<n>\d{1,7})\b")
# torchrun's agent logs through torch.distributed.elastic (its banner, its warnings): a console
# holding them is the launcher's, not one process's
_AGENT = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S*torch/distributed/(?:elastic|run)|"
                    r"^Setting OMP_NUM_THREADS environment variable for each process")
# the agent stopped by a signal: "Received 15 death signal, shutting down workers" (older torch:
# "Received Signals.SIGTERM death signal"), then its "SignalException: Process 2210 got signal: 15"
_DEATH = re.compile(r"Received (?:(?P<n>\d{1,9})|Signals\.(?P<name>SIG\w+)) death signal, shutting down workers")
_SIGNALLED = re.compile(r"SignalException: Process (?P<pid>\d{1,18}) got signal: (?P<n>\d{1,9})(?!\d)")


@dataclass
class RankExit:
    """One rank as the launcher's summary gives it."""

    rank: int
    local_rank: int | None = None
    host: str | None = None
    exit_code: int | None = None  # negative: the signal
    time: float | None = None
    error_file: str | None = None
    root_cause: bool = False
    traceback: str | None = None  # the rank's traceback as its error file gave it to the summary


@dataclass
class LauncherText:
    """The launcher's lines of a job, read as they come."""

    exits: dict[int, RankExit] = field(default_factory=dict)
    summaries: int = 0  # ChildFailedError summaries seen (one per failed attempt)
    world_sizes: set[int] = field(default_factory=set)
    launcher: str | None = None  # whose summary it was: "torchrun", "mpirun"
    stopped: tuple[int, int | None] | None = None  # torchrun's agent stopped by a signal: (signo, its pid)
    # lines among the launcher's that are not its own, before any stop: the ranks' output printed
    # without a rank prefix (plain torchrun); how many, and the last one
    unplaced_lines: int = 0
    last_unplaced: str | None = None
    _current: dict[str, str] | None = None
    _root: bool = False
    _tb: list[str] | None = None
    _mpi_rank: int | None = None

    def feed(self, text: str) -> None:
        if self._tb is not None:  # the traceback field goes on, indented, to the block's end
            if text.startswith("  ") and not _RULE.match(text):
                if len(self._tb) < MAX_TRACEBACK_LINES:
                    self._tb.append(text[2:])
                return
            self._close()
        self._mpirun(text)
        self._agent(text)
        self._unplaced(text)
        if _FAILED.search(text) or "ChildFailedError" in text:
            self.summaries += text.rstrip().endswith("FAILED")
        if text.startswith("Root Cause"):
            self._close()
            self._root = True
            return
        if text.startswith("Failures:"):
            self._close()
            self._root = False
            return
        if _BLOCK.match(text):
            self._close()
            self._current = {}
            return
        m = _FIELD.match(text)
        if m and self._current is not None:
            self._current[m.group("key")] = m.group("value")
            if m.group("key") == "traceback":
                self._tb = [m.group("value")]  # the rank's own, when its error file held one
            return
        w = _WORLD.search(text)
        if w:
            self.world_sizes.add(int(w.group("n")))
        if self._current is not None and text.strip() and not m:
            self._close()

    def state(self) -> tuple[int, int, str | None]:
        """What the launcher's lines said so far, to tell whether a file added to it."""
        return len(self.exits), self.summaries, self.launcher

    def _unplaced(self, text: str) -> None:
        """Count a line no launcher wrote (the script's, without its rank's prefix), before a stop."""
        line = text.strip()
        if (self.stopped is None and line and self._current is None and not _AGENT.search(text)
                and not line.startswith(("*****", "Traceback (most recent call last)", "File \"", "[W", "[I"))
                and not _DEATH.search(text) and not _SIGNALLED.search(text) and not text.startswith(" ")):
            self.unplaced_lines += 1
            self.last_unplaced = line[:160]

    def _agent(self, text: str) -> None:
        """torchrun's agent's own lines: it was there, and whether a signal stopped it."""
        if _AGENT.search(text):
            self.launcher = self.launcher or "torchrun"
        m = _DEATH.search(text)
        if m:
            signo = int(m["n"]) if m["n"] else getattr(signal, m["name"], None)
            if signo is not None and self.stopped is None:
                self.stopped = (int(signo), None)
            self.launcher = self.launcher or "torchrun"
            return
        m = _SIGNALLED.search(text)
        if m:
            self.stopped = (int(m["n"]), int(m["pid"]))
            self.launcher = self.launcher or "torchrun"

    def _mpirun(self, text: str) -> None:
        """Open MPI's summary of the first process that failed: "Process name: [[9479,1],1]" then
        "Exit code: 1" (the rank is the last number of the name)."""
        m = _MPI_PROCESS.search(text)
        if m:
            self._mpi_rank = int(m.group("rank"))
            self.launcher = "mpirun"
            return
        m = _MPI_EXIT.search(text)
        if m and self._mpi_rank is not None:
            rank, self._mpi_rank = self._mpi_rank, None
            self.exits.setdefault(rank, RankExit(rank=rank, exit_code=int(m.group("code")), root_cause=True))

    def _close(self) -> None:
        tb, self._tb = self._tb, None
        block, self._current = self._current, None
        if not block or "rank" not in block:
            return
        r = _RANK.match(block["rank"])
        if not r:
            return
        code = _EXIT.match(block.get("exitcode", ""))
        rank = int(r.group("rank"))
        self.exits[rank] = RankExit(
            rank=rank, local_rank=int(r.group("local")) if r.group("local") else None,
            host=block.get("host") or None, exit_code=int(code.group("code")) if code else None,
            time=summary_time(block.get("time", "")),
            error_file=None if block.get("error_file", "<N/A>") in ("<N/A>", "") else block["error_file"],
            root_cause=self._root, traceback="\n".join(tb) + "\n" if tb and tb[0].startswith("Traceback") else None)
        self.launcher = "torchrun"

    def finish(self) -> None:
        self._close()


def summary_time(text: str) -> float | None:
    """torchrun's "2026-11-24_21:20:12" (the agent's local clock) as a Unix time, or None."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%d_%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


@dataclass
class ErrorFile:
    """torchelastic's error file of one rank: its traceback text and when it was written."""

    path: str
    text: str
    time: float | None


def read_error_file(path: str, data: Any) -> ErrorFile | None:
    """An error file's content (parsed JSON): None when the JSON has another shape (no
    {"message": {...}}: not an error file); ValueError, a phrase naming the field, when it has the
    shape but a field of another type than torch writes (a number for the message, a list for
    extraInfo, a py_callstack that is no text, a timestamp that is no time)."""
    if not isinstance(data, dict) or not isinstance(data.get("message"), dict):
        return None
    msg = data["message"]
    if msg.get("message") is not None and not isinstance(msg["message"], str):
        raise ValueError(f"its message.message is {_json_kind(msg['message'])}, not text")
    extra = msg.get("extraInfo")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise ValueError(f"its message.extraInfo is {_json_kind(extra)}, not an object")
    if extra.get("py_callstack") is not None and not isinstance(extra["py_callstack"], str):
        raise ValueError(f"its message.extraInfo.py_callstack is {_json_kind(extra['py_callstack'])}, not text")
    return ErrorFile(path=path, text=error_file_text(data), time=_timestamp(extra.get("timestamp")))


def _timestamp(value: Any) -> float | None:
    """extraInfo.timestamp: torch writes the Unix time in seconds as text ("1764000000")."""
    if value is None:
        return None
    try:
        when = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    except ValueError:
        when = None
    if when is None or not 0 < when < 1e11:  # nan and inf fail the comparison
        raise ValueError(f"its message.extraInfo.timestamp is {_json_kind(value)}, not a Unix time")
    return when


def _json_kind(value: Any) -> str:
    """A JSON value as a message names it: its type, and a short quote of a scalar."""
    kinds = {dict: "an object", list: "a list", bool: "a boolean", type(None): "null"}
    if type(value) in kinds:
        return kinds[type(value)]
    if isinstance(value, (int, float)):
        return f"the number {str(value)[:40]}"
    return f"the text {str(value)[:40]!r}"
