"""What keeps a rank's process alive after its script ended (DDP806): the non-daemon threads the
interpreter's exit joins and the child processes still running, each with where it was started.

    install()                           # with the other probes: start sites are noted from then on
    ...the script...
    watch_exit(outcome_path)            # after the script: the outcome gets "held_by" while it lives

`install` wraps `threading.Thread.start` (the caller's file:line, for non-daemon threads only: a
daemon never keeps the process alive), `subprocess.Popen.__init__` and multiprocessing's
`BaseProcess.start` (the caller's file:line by pid); nothing runs per step. `watch_exit` starts a
daemon thread that, every HOLD_POLL seconds until the process ends, reads what the process holds
(threading.enumerate(): alive, not daemon, not the main thread; sys._current_frames(): where each
is; the process table: its children alive) and rewrites the rank's outcome with it when that
changed, so what the parent reads when it ends the rank at its teardown bound is at most
HOLD_POLL old. Command lines are redacted (records.write_json redacts the outcome too). Never
raises into the script or the rank's ending.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from typing import Any

HOLD_POLL = 0.5      # seconds between two looks at what the process holds
SITES_KEPT = 1000    # start sites of child processes kept (the latest)
LISTED = 16          # threads and children recorded
_SITE_ATTR = "_ddp_doctor_started_at"
_child_sites: dict[int, str] = {}
_lock = threading.Lock()
_installed = False


def install() -> None:
    """Note where non-daemon threads and child processes are started (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    import multiprocessing.process
    import subprocess

    from ddp_doctor.training.probes.patching import wrap_in_place
    wrap_in_place(threading.Thread, "start", _thread_start_wrapper)
    wrap_in_place(subprocess.Popen, "__init__", _child_start_wrapper)
    wrap_in_place(multiprocessing.process.BaseProcess, "start", _child_start_wrapper)


def _site() -> str | None:
    try:
        from ddp_doctor.training.probes.call_sites import user_site
        return user_site()
    except Exception:  # noqa: BLE001 - a probe never breaks the user's call
        return None


def _thread_start_wrapper(orig: Any) -> Any:
    def start(self: threading.Thread, *a: Any, **k: Any) -> Any:
        if not self.daemon:
            try:
                setattr(self, _SITE_ATTR, _site())
            except Exception:  # noqa: BLE001 - a Thread subclass with __slots__: no site, the start runs
                pass
        return orig(self, *a, **k)
    return start


def _child_start_wrapper(orig: Any) -> Any:
    def start(self: Any, *a: Any, **k: Any) -> Any:
        out = orig(self, *a, **k)
        pid = getattr(self, "pid", None)
        if isinstance(pid, int):
            site = _site()
            if site:
                with _lock:
                    _child_sites[pid] = site
                    while len(_child_sites) > SITES_KEPT:
                        _child_sites.pop(next(iter(_child_sites)))
        return out
    return start


def started_at(pid: int) -> str | None:
    """The user's line that started child `pid` in this process, when it was seen."""
    with _lock:
        return _child_sites.get(pid)


def _frame_site(frame: Any) -> tuple[str | None, str | None, str | None]:
    """("file:line in func" of the innermost frame, of the innermost frame of the user's code, and
    of the frame that user's line called: queue.py's get, where threading.py's wait is innermost)."""
    from ddp_doctor.facts.frames import is_user_file
    inner = user = called = prev = None
    for f, line in traceback.walk_stack(frame):
        where = f"{f.f_code.co_filename}:{line} in {f.f_code.co_name}"
        if inner is None:
            inner = where
        if is_user_file(f.f_code.co_filename):
            user, called = where, prev
            break
        prev = where
    return inner, user, called


def threads_holding() -> list[dict[str, Any]]:
    """The threads the interpreter's exit waits for: alive, not daemon, not the main thread nor this one."""
    frames = sys._current_frames()
    main, me = threading.main_thread(), threading.current_thread()
    out = []
    for t in threading.enumerate():
        if t is main or t is me or t.daemon or not t.is_alive():
            continue
        inner, user, called = _frame_site(frames.get(t.ident or -1))
        out.append({"name": t.name, "ident": t.ident, "where": inner, "user_where": user, "called": called,
                    "started_at": getattr(t, _SITE_ATTR, None)})
    return out[:LISTED]


def children_holding() -> list[dict[str, Any]]:
    """This process's children still running (not zombies), with their command lines (redacted);
    not the helpers the interpreter and torch keep for themselves (multiprocessing's resource
    tracker and forkserver, torch's compile workers), which end with the process."""
    from ddp_doctor.facts import process_table as facts
    from ddp_doctor.report.redact import redact_text
    me = os.getpid()
    helpers = facts.own_helpers(interpreter_exits=False)
    out = []
    for pid, p in sorted(facts.process_table().items()):
        if p.ppid != me or p.zombie or pid in helpers:
            continue
        cmd = facts.command_line(pid)
        out.append({"pid": pid, "cmdline": redact_text(cmd) if cmd else cmd, "started_at": started_at(pid)})
    return out[:LISTED]


def holding() -> dict[str, Any]:
    """What keeps this process alive, as the outcome's "held_by" records it."""
    out: dict[str, Any] = {"threads": threads_holding()}
    try:
        out["children"] = children_holding()
    except Exception as e:  # noqa: BLE001 - the threads are still worth naming
        out["children"], out["error"] = [], f"{type(e).__name__}: {e}"
    return out


def watch_exit(outcome_path: str) -> None:
    """After the rank wrote its outcome: keep "held_by" in it current until the process ends. A
    daemon thread: it runs while the interpreter's exit waits for non-daemon threads and children,
    and never delays that exit itself."""
    threading.Thread(target=_watch, args=(outcome_path,), name="ddp-doctor-exit-watch", daemon=True).start()


def _watch(path: str) -> None:
    # every import before the first look, while the interpreter is not exiting yet: a daemon thread
    # frozen by the exit inside an import would hold the import lock the exit may need
    import ddp_doctor.facts.frames  # noqa: F401
    import ddp_doctor.facts.ports  # noqa: F401
    import ddp_doctor.facts.process_table  # noqa: F401
    import ddp_doctor.report.redact  # noqa: F401
    from ddp_doctor.training.records import write_json
    said: Any = {"threads": [], "children": []}  # a process that holds nothing leaves its ending as written
    stop = threading.Event()  # never set: a bounded wait per look, until the process ends
    try:
        with open(path, encoding="utf-8") as f:
            first = json.load(f)
    except (OSError, ValueError):
        return
    while True:
        try:
            held = holding()
            if held != said:
                with open(path, encoding="utf-8") as f:
                    now = json.load(f)
                if now.get("time") != first.get("time"):
                    return  # another ending replaced this one (a stop, a hang): it is not ours to change
                write_json(path, {**now, "held_by": held})
                said = held
        except Exception:  # noqa: BLE001 - a record that cannot be read or written: the ending stands as written
            return
        stop.wait(HOLD_POLL)
