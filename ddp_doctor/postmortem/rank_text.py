"""What one rank's output says of how it ended, read line by line in bounded memory: its last
Python traceback (with the chain Python prints before it), a faulthandler dump, and where its
output stopped.

A traceback is the rank's ending only when little of its own output follows it: a traceback a
library logged and the training survived (logging.exception) is followed by the training's lines.
"""
from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.checks.wrapped_errors import parse_traceback

HEADER = "Traceback (most recent call last):"
_CHAIN = ("The above exception was the direct cause of the following exception:",
          "During handling of the above exception, another exception occurred:")
_FATAL = re.compile(r"^Fatal Python error: (?P<what>.+?)\s*$")
# a C++ exception nobody caught (NCCL's watchdog ending the process, a c10::Error in a thread):
# libstdc++ prints these lines, then the process aborts (SIGABRT)
_TERMINATE = re.compile(r"^terminate called after throwing an instance of '(?P<type>[^']+)'")
# std::terminate with no exception in flight: a joinable std::thread destroyed, which torch's gloo
# does in its static destructors when the interpreter exits (the process then aborts: SIGABRT)
_TERMINATE_AT_EXIT = "terminate called without an active exception"
_WHAT = re.compile(r"^\s*what\(\):\s*(?P<msg>.*)$")
_CPP_END = re.compile(r"^(Exception raised from |frame #\d+:|Fatal Python error:|Traceback \(most recent)")
_FATAL_SIGNALS = {"Segmentation fault": -11, "Bus error": -7, "Illegal instruction": -4,
                  "Floating-point exception": -8, "Floating point exception": -8, "Aborted": -6}
# a logger's or torch's own line (glog "W1124 21:20:12.8 ...", "[W1124 ...]", an ISO timestamp):
# never the next line of an exception's message
_LOG_LINE = re.compile(r"^(\[?[WIEFD]\d{4} |\[[WIEF] |\d{4}-\d\d-\d\d[ T_])")
AFTER_ENDING = 30  # lines of its own a rank may print after the traceback that ended it (its teardown)
MAX_MESSAGE = 200  # lines of a message printed below its "Type:" line
MAX_BLOCK = 400  # lines kept of one traceback chain (its head and its tail)
MAX_DUMP = 200  # lines kept of one faulthandler dump
TAIL = 5  # last lines kept, to say where a rank's output stopped
MAX_WAITS = 64  # NCCL watchdog lines kept per rank


@dataclass
class RankText:
    """One rank's output as it is read. `seq`: the position of a line in the reading order of
    its source (an interleaved console orders the ranks' lines against each other)."""

    lines: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL))
    hosts: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)
    _block: list[str] | None = None
    _block_seq: int = 0
    _exc_seen: bool = False
    _after_exc: int = 0
    _blank_after_exc: bool = False
    _msg_below: bool = False  # the exception line ends with ":": its message is on the lines below
    ending: tuple[str, int] | None = None  # (the chain's text, its first line's seq)
    _since_ending: int = 0
    _dump: list[str] | None = None
    dump: tuple[str, int, int] | None = None  # (faulthandler's text, its seq, the signal as an exit status)
    waits: list[dict[str, Any]] = field(default_factory=list)  # NCCL watchdog lines (postmortem/nccl_lines.py)
    _cpp: list[str] | None = None
    cpp: tuple[str, str, str, int] | None = None  # an uncaught C++ exception: (type, what(), its lines, seq)
    abort_at_exit: int | None = None  # the seq of its "terminate called without an active exception"

    def feed(self, text: str, seq: int) -> None:
        self.lines += 1
        self.first_seq = seq if self.first_seq is None else self.first_seq
        self.last_seq = seq
        if text.strip() == _TERMINATE_AT_EXIT:
            self.abort_at_exit = seq  # not the script's own last line
            return
        if text.strip():
            self.tail.append(text[:500])
        if "watchdog" in text:
            self._note_watchdog(text, seq)
        if self._dump is not None:
            self._feed_dump(text)
            return
        if self._cpp is not None:
            if self._feed_cpp(text):
                return
        m = _TERMINATE.match(text)
        if m:
            self._close_block()
            self._cpp, self._cpp_seq = [text.rstrip()], seq
            return
        m = _FATAL.match(text)
        if m:
            self._close_block()
            self._dump = [text]
            self.dump = None
            self._dump_seq, self._dump_status = seq, _FATAL_SIGNALS.get(m.group("what"), -6)
            return
        if self._block is not None:
            self._feed_block(text, seq)
            return
        if text.strip() == HEADER:
            self._open_block(text, seq)
            return
        if self.ending is not None and text.strip():
            self._since_ending += 1
            if self._since_ending > AFTER_ENDING:
                self.ending = None  # the training went on: a traceback someone logged, not its end

    def _open_block(self, text: str, seq: int) -> None:
        self._block, self._block_seq = [text.strip()], seq
        self._exc_seen, self._after_exc, self._blank_after_exc, self._msg_below = False, 0, False, False

    def _feed_block(self, text: str, seq: int) -> None:
        block = self._block
        assert block is not None
        stripped = text.strip()
        if self._exc_seen and self._msg_below:
            # "Type:" and its message on the lines below, blank lines and quoted tracebacks
            # included (torch.multiprocessing's "-- Process 1 terminated with the following error:")
            if _LOG_LINE.match(stripped) or self._after_exc >= MAX_MESSAGE:
                self._close_block()
                self.feed_after_block(text, seq)
                return
            self._after_exc += 1
            self._append(text)
            return
        if self._exc_seen:
            if stripped in _CHAIN or stripped == HEADER:
                self._exc_seen, self._after_exc, self._blank_after_exc = False, 0, False  # the chain goes on
                self._append(text)
                return
            if not stripped:
                self._blank_after_exc = True
                self._append(text)
                return
            if self._blank_after_exc or self._after_exc >= 60 or _LOG_LINE.match(stripped):
                self._close_block()
                self.feed_after_block(text, seq)
                return
            self._after_exc += 1  # the message's next line
            self._append(text)
            return
        self._append(text)
        if stripped and not text[:1].isspace() and stripped != HEADER and stripped not in _CHAIN \
                and not stripped.startswith("File "):
            self._exc_seen, self._msg_below = True, stripped.endswith(":")

    def feed_after_block(self, text: str, seq: int) -> None:
        """The first line after a chain: counted against it, or a new chain's header."""
        if text.strip() == HEADER:
            self._open_block(text, seq)
        elif text.strip():
            self._since_ending += 1

    def _append(self, text: str) -> None:
        block = self._block
        assert block is not None
        block.append(text.rstrip())
        if len(block) > MAX_BLOCK:
            del block[MAX_BLOCK // 4]  # keep the head (the first frames) and the newest lines

    def _close_block(self) -> None:
        if self._block is not None and self._exc_seen:
            while self._block and not self._block[-1].strip():
                self._block.pop()
            self.ending, self._since_ending = ("\n".join(self._block) + "\n", self._block_seq), 0
        self._block = None

    def _feed_dump(self, text: str) -> None:
        dump = self._dump
        assert dump is not None
        dump.append(text.rstrip())
        if len(dump) >= MAX_DUMP or (not text.strip() and len(dump) > 3 and not dump[-2].strip()):
            self._close_dump()

    def _note_watchdog(self, text: str, seq: int) -> None:
        from ddp_doctor.postmortem.nccl_lines import progress_of, wait_of
        found = wait_of(text)
        kind = "wait"
        if found is None:
            found, kind = progress_of(text), "progress"
        if found is not None and len(self.waits) < MAX_WAITS:
            self.waits.append({"kind": kind, "position": seq, **found})

    def _feed_cpp(self, text: str) -> bool:
        """A line of an uncaught C++ exception's report; False when it ends it (the line is then
        read as any other)."""
        lines = self._cpp
        assert lines is not None
        if _CPP_END.match(text) or len(lines) >= 60 or (not text.strip() and len(lines) > 1):
            self._close_cpp()
            return False
        lines.append(text.rstrip())
        return True

    def _close_cpp(self) -> None:
        lines, self._cpp = self._cpp, None
        if not lines:
            return
        m = _TERMINATE.match(lines[0])
        what = next((i for i, ln in enumerate(lines) if _WHAT.match(ln)), None)
        if m is None or what is None:
            return
        message = "\n".join([_WHAT.match(lines[what]).group("msg"), *(ln.strip() for ln in lines[what + 1:])]).strip()
        self.cpp = (m.group("type"), message, "\n".join(lines) + "\n", self._cpp_seq)

    def _close_dump(self) -> None:
        if self._dump is not None:
            self.dump = ("\n".join(self._dump).strip() + "\n", self._dump_seq, self._dump_status)
        self._dump = None

    def finish(self) -> None:
        """The end of the rank's output: a chain or a dump still open is complete as it is."""
        self._close_block()
        self._close_dump()
        self._close_cpp()

    def merge(self, other: "RankText") -> None:
        """One rank's output read from several places (torchrun's tee into the console and its log
        tree, stdout and stderr, the regions of a large file): the newer ending and dump, all
        lines counted."""
        self.lines += other.lines
        self.sources |= other.sources
        self.hosts |= other.hosts
        if other.first_seq is not None:
            self.first_seq = other.first_seq if self.first_seq is None else min(self.first_seq, other.first_seq)
        if other.last_seq is not None and (self.last_seq is None or other.last_seq > self.last_seq):
            self.last_seq = other.last_seq
            self.tail = other.tail
        if other.ending is not None and (self.ending is None or other.ending[1] > self.ending[1]):
            self.ending = other.ending
        if other.dump is not None and (self.dump is None or other.dump[1] > self.dump[1]):
            self.dump = other.dump
        if other.cpp is not None and (self.cpp is None or other.cpp[3] > self.cpp[3]):
            self.cpp = other.cpp
        if other.abort_at_exit is not None and (self.abort_at_exit is None or other.abort_at_exit > self.abort_at_exit):
            self.abort_at_exit = other.abort_at_exit
        seen = {(w["kind"], w.get("seq", w.get("at")), w.get("pg")) for w in self.waits}
        self.waits += [w for w in other.waits if (w["kind"], w.get("seq", w.get("at")), w.get("pg")) not in seen]

    def ending_position(self) -> int | None:
        """Where the error that ended the rank (exception()) starts in its source."""
        if self.cpp is not None and (self.ending is None or self.cpp[3] > self.ending[1]):
            return self.cpp[3]
        return self.ending[1] if self.ending is not None else None

    def exception(self) -> dict[str, Any] | None:
        """The error that ended the rank, in the shape of a rank's outcome record (type, message,
        traceback: the whole chain), or None: its last Python traceback, or an uncaught C++
        exception printed after it (`cpp`: its C++ type)."""
        if self.cpp is not None and (self.ending is None or self.cpp[3] > self.ending[1]):
            kind, message, text, _ = self.cpp
            return {"type": kind.rsplit("::", 1)[-1], "message": message, "traceback": text, "cpp": kind}
        if self.ending is None:
            return None
        text = self.ending[0]
        err = parse_traceback(_last_in_chain(text))
        if err is None:
            return None
        return {"type": err.type, "message": err.message, "traceback": text}


def _last_in_chain(text: str) -> str:
    """The last traceback of a chain Python printed: the first one, or one after "The above
    exception was ..." / "During handling of ...". A traceback quoted inside an exception's message
    (a spawned process's, under torch.multiprocessing's "-- Process 1 terminated with the following
    error:") belongs to that message, not to the chain."""
    lines = text.splitlines()
    start, before = 0, None
    for i, ln in enumerate(lines):
        if ln.strip() == HEADER and (before is None or before in _CHAIN):
            start = i
        if ln.strip():
            before = ln.strip()
    return "\n".join(lines[start:]) + "\n"
