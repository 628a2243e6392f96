"""Run the user's script or module in this process as `python SCRIPT` / `python -m MODULE` would:
`__main__`, sys.argv and sys.path[0] as Python sets them, and the same traceback on stderr."""
from __future__ import annotations

import os
import runpy
import sys
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.facts.frames import TOOL_DIR


@dataclass(frozen=True)
class Target:
    path: str | None          # a script path, or None with `module`
    module: str | None
    args: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"-m {self.module}" if self.module else str(self.path)


@dataclass
class Outcome:
    exit_code: int
    exception: dict[str, Any] | None = None  # type, message, traceback, time
    exited: dict[str, Any] | None = None  # sys.exit(N != 0): where the script called it, and when


def _exit_site(exc: SystemExit) -> dict[str, Any]:
    """Where the script raised SystemExit (its innermost frame outside Python's and torch's own
    code, else the innermost of the script's): "file:line in function", and the time."""
    from ddp_doctor.facts.frames import not_user_code_dirs
    frames = [f for f in traceback.extract_tb(_user_traceback(exc)) if not f.filename.startswith(TOOL_DIR)]
    library = not_user_code_dirs()
    own = [f for f in frames if not f.filename.startswith(library)] or frames
    where = f"{own[-1].filename}:{own[-1].lineno} in {own[-1].name}" if own else None
    return {"where": where, "time": time.time()}


def _user_traceback(exc: BaseException) -> Any:
    """Drop the frames of runpy and of ddp-doctor itself, so the traceback starts where Python's
    own would for `python SCRIPT`."""
    tb = exc.__traceback__
    here = TOOL_DIR
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(here)
                              or tb.tb_frame.f_code.co_filename == runpy.__file__
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    return tb


def user_traceback_text(exc: BaseException) -> str:
    """The traceback Python would print for `python SCRIPT`: without runpy's and ddp-doctor's own
    frames, also those of the probes' thin wrappers in the middle of the user's call chain (and in
    chained exceptions)."""
    here = TOOL_DIR
    te = traceback.TracebackException(type(exc), exc, _user_traceback(exc))
    seen: set[int] = set()
    todo = [te]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list([f for f in t.stack if not f.filename.startswith(here)])
        todo += [c for c in (t.__cause__, t.__context__) if c is not None]
    return "".join(te.format())


def show_uncaught(exc: BaseException, text: str) -> None:
    """Show the script's uncaught exception on stderr as Python would at its exit: through
    sys.excepthook when the script replaced it, else `text` (user_traceback_text). torch's
    init_process_group replaces it with a hook that starts every line with "[rankN]: "
    (torch/distributed/distributed_c10d.py, _distributed_excepthook), so a rank's traceback is
    labelled as under torchrun. The hook is given the traceback without ddp-doctor's frames."""
    hook = sys.excepthook
    if hook is sys.__excepthook__:
        sys.stderr.write(text)
        sys.stderr.flush()
        return
    _drop_own_frames(exc)
    try:
        hook(type(exc), exc, exc.__traceback__)
    except BaseException as failed:  # noqa: BLE001 - Python's own words for a hook that raises
        why = "".join(traceback.format_exception(type(failed), failed, failed.__traceback__))
        sys.stderr.write(f"Error in sys.excepthook:\n{why}\nOriginal exception was:\n{text}")
    sys.stderr.flush()


def _drop_own_frames(exc: BaseException) -> None:
    """The frames user_traceback_text leaves out (runpy's and ddp-doctor's) taken out of the
    tracebacks of `exc` and the exceptions it was raised from or during."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        kept = []
        tb = _user_traceback(e)
        while tb is not None:
            if not tb.tb_frame.f_code.co_filename.startswith(TOOL_DIR):
                kept.append(tb)
            tb = tb.tb_next
        new = None
        for t in reversed(kept):
            new = types.TracebackType(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
        e.__traceback__ = new
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


def exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")  # what Python does with sys.exit("message")
    return 1


def run_target(target: Target) -> Outcome:
    sys.argv = [target.path if target.path else target.module or "", *target.args]
    try:
        if target.module:
            runpy.run_module(target.module, run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(str(target.path))
            sys.path.insert(0, os.path.dirname(path))
            runpy.run_path(path, run_name="__main__")
        return Outcome(0)
    except SystemExit as e:
        code = exit_code_of(e)
        return Outcome(code, exited=_exit_site(e) if code else None)
    except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt included, as Python reports it
        when = time.time()
        text = user_traceback_text(e)
        show_uncaught(e, text)
        return Outcome(130 if isinstance(e, KeyboardInterrupt) else 1, {
            "type": type(e).__name__, "message": str(e), "traceback": text, "time": when})
