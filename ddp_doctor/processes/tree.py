"""The process tree of a launch: children that die with their parent, orphans adopted, the whole
tree ended.

A launcher that ddp-doctor starts runs in a session of its own (so its whole group can be ended)
and gets SIGTERM when ddp-doctor dies (PR_SET_PDEATHSIG), which torchrun forwards to its workers.
While a launch runs, the parent is a child subreaper (`adopting`): a rank whose launcher was killed
is reparented to it, not to init, and ended with the rest (`terminate_tree`). The prctl pieces are
Linux's; elsewhere they do nothing and the bounds and the process group are what stands.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from typing import Any, Iterator

from ddp_doctor.processes.stop_signals import unblock_in_child

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux / no glibc: the caller's other safeguards stand
        return False


def die_with_parent(signo: int = signal.SIGTERM) -> bool:
    """`signo` to this process when the thread that started it ends (PR_SET_PDEATHSIG, Linux).
    The caller checks os.getppid() afterwards: a parent already gone sends nothing."""
    return _prctl(PR_SET_PDEATHSIG, int(signo))


def adopt_orphans(on: bool = True) -> bool:
    """Make this process a child subreaper (PR_SET_CHILD_SUBREAPER, Linux): a descendant whose
    parent dies (a rank whose launcher was killed) is reparented here instead of to init, so it
    stays among this process's descendants, where the parent ends it."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def own_session_dying_with_parent() -> None:
    """For preexec_fn: the child gets its own process group (so the parent can end the whole tree)
    and SIGTERM when this parent dies, which torchrun forwards to its workers."""
    os.setsid()
    die_with_parent(signal.SIGTERM)


def launcher_preexec() -> None:
    """For preexec_fn of a launcher under a parent that blocks the stop signals (stop_signals.py):
    they act in the launcher as usual again, and it dies with the parent in a session of its own."""
    unblock_in_child()
    own_session_dying_with_parent()


def end_descendants(grace: float | None = 2.0) -> list[int]:
    """End every descendant of this process and return their pids (none when psutil is missing or
    /proc unreadable). With `grace`: SIGTERM, then SIGKILL to those alive `grace` seconds later
    (bounded), when a one-process run is stopped: the processes its script started (the ranks of
    torch.multiprocessing.spawn) must not train on. With grace=None: SIGKILL at once and no wait,
    for processes stuck inside init_process_group with nothing to write, so that the script's own
    thread, which joins them, says nothing after the report."""
    try:
        import psutil
        procs = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing, or /proc unreadable: the caller's report stands
        return []
    _signal_each(procs, kill=grace is None)
    if grace is not None:
        try:
            _, alive = psutil.wait_procs(procs, timeout=grace)
            _signal_each(alive, kill=True)
            psutil.wait_procs(alive, timeout=1.0)
        except Exception:  # noqa: BLE001 - /proc unreadable while waiting: every one was signalled
            pass
    return [p.pid for p in procs]


def _signal_each(procs: list[Any], *, kill: bool) -> None:
    """SIGKILL (kill) or SIGTERM to each; psutil checks that the pid is still the process seen."""
    import psutil
    for p in procs:
        try:
            p.kill() if kill else p.terminate()
        except psutil.Error:  # gone already, or not ours to signal
            pass


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil
        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone
        return []


def _launched(since: float | None) -> list[Any]:
    """This process's descendants started at `since` (time.time()) or later: the launcher's tree,
    and the ranks adopted here when their launcher died (adopting)."""
    if since is None:
        return []
    try:
        import psutil
        return [p for p in psutil.Process().children(recursive=True) if p.create_time() >= since - 1.0]
    except Exception:  # noqa: BLE001 - psutil missing, or a process gone while looked at
        return []


@contextlib.contextmanager
def adopting() -> Iterator[float]:
    """While the launch runs, this process is a child subreaper: a rank whose launcher was killed
    is reparented here, where terminate_tree (given the launch's start, yielded) finds and ends it.
    After it, the adopted processes that ended are reaped and the process is an ordinary one again."""
    since = time.time()
    adopted = adopt_orphans(True)
    try:
        yield since
    finally:
        if adopted:
            adopt_orphans(False)
            _reap_adopted(since)


def _reap_adopted(since: float) -> None:
    """Wait for (reap) the adopted processes that ended: they are this process's children now,
    and no Popen of ours waits for them."""
    try:
        import psutil
        kids = [p.pid for p in psutil.Process().children() if p.create_time() >= since - 1.0
                and p.status() == psutil.STATUS_ZOMBIE]
    except Exception:  # noqa: BLE001 - psutil missing, or a process gone while looked at
        return
    for pid in kids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


def terminate_tree(proc: subprocess.Popen[Any], grace: float = 5.0, since: float | None = None) -> None:
    """End the launcher and everything under it. torch's launcher starts each worker in a session
    of its own, so the launcher's process group does not hold them: remember them first. `since`
    (from `adopting`): also end every process started here since then, those the launcher lost
    when it was killed included."""
    workers = _descendants(proc.pid) + [p for p in _launched(since) if p.pid != proc.pid]
    try:
        _terminate_group(proc, grace)
    finally:
        for w in workers:
            try:
                w.kill()  # psutil checks the process is the one seen (not a reused pid)
            except Exception:  # noqa: BLE001 - already gone
                pass


def _terminate_group(proc: subprocess.Popen[Any], grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            # torchrun is gone; make sure none of its workers outlived it
            os.killpg(proc.pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
