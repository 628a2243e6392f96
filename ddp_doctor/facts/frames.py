"""Which stack frames are ddp-doctor's own, or a library's: tracebacks, stacks and call sites
shown to the user skip them. is_user_file is the test of a frame of this host (this process's
stack, its own exceptions); is_library_file adds what a frame recorded on any host shows of a
library; not_user_code_dirs are the directories of this host that both skip."""
from __future__ import annotations

import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any

# The installed ddp_doctor package: frames under it are ddp-doctor's own, not the user's.
TOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_USER_CODE: tuple[str, ...] | None = None


def not_user_code_dirs() -> tuple[str, ...]:
    """Frames from these directories are not 'user code' when we say where a rank is."""
    global _NOT_USER_CODE
    if _NOT_USER_CODE is None:
        dirs = [TOOL_DIR]  # ddp_doctor
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):  # libraries are not the user's code
            p = sysconfig.get_paths().get(key)
            if p:
                dirs.append(p)
        try:  # found, not imported: importing torch costs seconds and 200 MB (a post-mortem needs neither)
            import importlib.util
            spec = importlib.util.find_spec("torch")
            if spec is not None and spec.origin:
                dirs.append(os.path.dirname(os.path.abspath(spec.origin)))
        except (ImportError, ValueError):  # a broken torch: its frames are not there to tell apart
            pass
        _NOT_USER_CODE = tuple(dirs)
    return _NOT_USER_CODE


# Path parts of an installed library's file on any host: a recorded frame (NCCL's flight recorder,
# a peer's ledger, an evidence file judged again on another machine) may come from another machine,
# whose directories not_user_code_dirs cannot know: its libraries, its Python's standard library
# (.../lib/python3.X/), and ddp-doctor's own package wherever it was installed or checked out.
LIBRARY_PATH_PARTS = ("site-packages", "dist-packages", f"{os.sep}torch{os.sep}", "/torch/", "/ddp_doctor/",
                      "/lib/python3.")


def is_user_file(filename: str) -> bool:
    """Whether a frame of this host is the user's code: a real file (not a pseudo-file such as
    "<string>") outside this host's library and ddp-doctor directories. Only those: a user's own
    directory may well be called torch/ (is_library_file's guess is for frames of other hosts)."""
    return bool(filename) and not filename.startswith("<") and not filename.startswith(not_user_code_dirs())


def is_library_file(filename: str) -> bool:
    """Whether a recorded frame's file (from this host or another) is not the user's code: not
    is_user_file here, or an installed library's path on any host."""
    return not is_user_file(filename) or any(part in filename for part in LIBRARY_PATH_PARTS)


# torch.distributed's collective entry points that scripts call (the object variants issue
# several collectives inside one call). A frame of one of them in torch's distributed_c10d.py
# says the thread was inside that collective.
COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "broadcast", "barrier", "monitored_barrier", "reduce",
    "all_gather", "all_gather_into_tensor", "all_gather_coalesced", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
)
_C10D_FILE = "distributed_c10d.py"
# Frames of the autograd engine: a DDP model's backward issues its gradient all_reduces from C++.
_BACKWARD = {("graph.py", "_engine_run_backward"), ("_tensor.py", "backward")}


def collective_of_frame(filename: str, function: str) -> str | None:
    """The collective a stack frame is inside: the torch.distributed function's name
    (`all_reduce`, ...), "backward" for the autograd engine (a DDP model's gradient all_reduces,
    issued from C++), or None."""
    base = os.path.basename(filename)
    if base == _C10D_FILE and function in COLLECTIVES and is_library_file(filename):
        return function
    if (base, function) in _BACKWARD and is_library_file(filename):
        return "backward"
    return None


# faulthandler's text: a header per thread, then its frames innermost first.
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+)|^Stack \(most recent call first\)")
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


@dataclass(frozen=True)
class DumpedThread:
    """One thread of a faulthandler dump: whether it took the fatal signal (`current`), and its
    frames as (file, line, function), innermost first."""

    current: bool
    frames: tuple[tuple[str, int, str], ...]


def dumped_threads(dump: str) -> list[DumpedThread]:
    """Every thread of faulthandler's text, in its order ("Current thread ..." and "Thread ..."
    with all threads, "Stack ..." with one, which is the current one)."""
    threads: list[DumpedThread] = []
    current: bool | None = None
    frames: list[tuple[str, int, str]] = []
    for line in dump.splitlines():
        m = _THREAD.match(line)
        if m:
            if current is not None:
                threads.append(DumpedThread(current, tuple(frames)))
            current, frames = m["current"] != "Thread", []
            continue
        f = _DUMP_FRAME.match(line)
        if f and current is not None:
            frames.append((f["file"], int(f["line"]), f["func"]))
    if current is not None:
        threads.append(DumpedThread(current, tuple(frames)))
    return threads


def thread_in_collective(dump: str) -> tuple[DumpedThread, str, int] | None:
    """The thread of a faulthandler dump that was inside a collective (the one that took the
    signal first, else the first listed: a native abort raised on a library's own thread, such as
    gloo's, leaves no Python thread "current"), the collective (collective_of_frame) and the index
    of its frame; None when no thread was in one."""
    threads = dumped_threads(dump)
    for t in sorted(threads, key=lambda t: not t.current):
        for i, (file, _line, func) in enumerate(t.frames):
            op = collective_of_frame(file, func)
            if op is not None:
                return t, op, i
    return None


# ---------------------------------------------------------------- a live thread of this process
COLLECTIVE_FILES = ("distributed_c10d.py", "c10d_logger.py")  # a frame here: inside a collective


def stack_of(thread_id: int) -> list[tuple[str, int, str]]:
    """(file, line, function) of a thread's frames, outermost first."""
    frame = sys._current_frames().get(thread_id)
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out[::-1]


def describe(stack: list[tuple[str, int, str]]) -> dict[str, Any]:
    """Where a stack is: the innermost frame of user code, and whether it sits in a collective."""
    user = next((f for f in reversed(stack) if is_user_file(f[0])), None)
    inner = stack[-1] if stack else None
    return {
        "where": f"{user[0]}:{user[1]} in {user[2]}" if user else None,
        "innermost": f"{inner[0]}:{inner[1]} in {inner[2]}" if inner else None,
        "in_collective": any(os.path.basename(f[0]) in COLLECTIVE_FILES for f in stack),
    }
