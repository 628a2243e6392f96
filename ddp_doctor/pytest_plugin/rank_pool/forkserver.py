"""The forkserver's main loop (``python -c "...forkserver import serve; serve()"``): preloads torch
once, then forks the ranks of each test the parent asks for, forwards signals and kills to them,
reaps them and reports every exit to the parent. It also forks the child that judges a failed test
(rank_pool/judge.py: ddp-doctor's judgement needs torch, which the parent never imports).
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Any, Callable

from ddp_doctor.processes.tree import die_with_parent
from ddp_doctor.pytest_plugin.rank_pool.wire import JUDGE, PRELOAD, PRELOAD_ENV, Reader, send
from ddp_doctor.pytest_plugin.rank_pool.worker import rank_main


def judge_child(inputs: dict, server: int) -> None:
    """The forked child that judges a failed test (rank_pool/judge.py): never returns."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != server:
        os._exit(71)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the control pipe is the forkserver's alone
    from ddp_doctor.pytest_plugin.rank_pool.judge import judge_and_write
    try:
        judge_and_write(inputs)
    except BaseException:  # noqa: BLE001 - the parent falls back to its own verdict
        import traceback
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def serve() -> None:
    """The forkserver's main loop: requests on fd 0, events on a copy of fd 1."""
    parent = os.getppid()
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
    ctl_in, ctl_out = 0, os.dup(1)
    os.dup2(2, 1)  # nothing but events on the control pipe
    _preload()
    wake_r, wake_w = _wakeup_pipe()
    pool = _Children(ctl_out, (wake_r, wake_w, ctl_out))
    send(ctl_out, ("ready", os.getpid()))
    reader = Reader()
    try:
        while True:
            ready, _, _ = select.select([ctl_in, wake_r], [], [], 1.0)
            if wake_r in ready:
                _drain(wake_r)
            pool.reap()
            if ctl_in not in ready:
                continue
            data = os.read(ctl_in, 1 << 16)
            if not data:
                break  # the parent closed the pipe or died
            for msg in reader.feed(data):
                pool.handle(msg)
    finally:
        pool.kill_all()
        os._exit(0)


def _preload() -> None:
    """Import what every rank needs (PRELOAD, or the modules PRELOAD_ENV names) once, here, so each
    forked rank starts with torch loaded; a module that fails is reported and left to the ranks, which
    import it again and report the error."""
    import importlib
    preload = [m for m in os.environ.get(PRELOAD_ENV, ",".join(PRELOAD)).split(",") if m]
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - ranks import it again and report the error
            sys.stderr.write(f"ddp-doctor forkserver: could not preload {name}: {e}\n")
    if "torch" in sys.modules:
        from ddp_doctor.pytest_plugin.rank_pool.ledgers import preload as preload_ledgers
        preload_ledgers()  # what each rank's ledger of collectives needs (rank_pool/ledgers.py)


def _wakeup_pipe() -> tuple[int, int]:
    """(read end, write end) of a non-blocking pipe that SIGCHLD writes to (signal.set_wakeup_fd):
    the main loop's select wakes as soon as a child exits, not at its next timeout."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    return wake_r, wake_w


def _drain(fd: int) -> None:
    """Read the wakeup pipe empty, so the next select waits for a new wakeup."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _kill(pid: int, signo: int, group: bool = False) -> None:
    """Send `signo` to a process (its group with `group`), one that is already gone being no error:
    a child may exit at any moment before it is reaped."""
    try:
        (os.killpg if group else os.kill)(pid, signo)
    except ProcessLookupError:
        pass


class _Children:
    """The forkserver's children and what each is for: it forks them on the parent's requests, sends
    them signals and kills, reaps them and reports each exit on the control pipe (`ctl_out`)."""

    def __init__(self, ctl_out: int, server_fds: tuple[int, ...]) -> None:
        self.ctl_out, self.server_fds = ctl_out, server_fds
        self.server = os.getpid()
        self.children: dict[int, tuple[int, int]] = {}   # pid -> (request id, rank)
        self.groups: dict[int, int] = {}                 # request id -> pgid

    def reap(self) -> None:
        """Reap every child that exited, reporting ("exited", request, rank, status, time) for each;
        a request with no child left forgets its process group."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            info = self.children.pop(pid, None)
            if info is not None:
                send(self.ctl_out, ("exited", info[0], info[1], status, time.time()))
                if not any(v[0] == info[0] for v in self.children.values()):
                    self.groups.pop(info[0], None)

    def live(self, req: int) -> list[int]:
        """The pids of request `req`'s children not reaped yet: the ones a signal or kill still reaches."""
        return [p for p, v in self.children.items() if v[0] == req]

    def handle(self, msg: tuple[Any, ...]) -> None:
        """Act on one request of the parent: run a test's ranks, judge a failed test, pass a signal
        to a test's ranks, or kill them."""
        kind, req = msg[0], msg[1]
        if kind == "run":
            self.run_ranks(req, msg[2])
        elif kind == "judge":
            pid = _fork_child(lambda msg=msg: judge_child(msg[2], self.server), self.server_fds)
            self.children[pid] = (req, JUDGE)
        elif kind == "signal":
            for pid in self.live(req):
                _kill(pid, int(msg[2]))
        elif kind == "kill":
            if self.live(req) and req in self.groups:
                _kill(self.groups[req], signal.SIGKILL, group=True)
            for pid in self.live(req):  # a rank that left the group is still ours
                _kill(pid, signal.SIGKILL)

    def run_ranks(self, req: int, spec: dict[str, Any]) -> None:
        """Fork the world_size ranks of one test in one new process group (the first rank's pid), so
        a kill ends them all, and report ("started", request, pids, pgid)."""
        pids: list[int] = []
        pgid = 0
        for r in range(int(spec["world_size"])):
            pid = _fork_child(lambda r=r, pgid=pgid, spec=spec: rank_main(spec, r, pgid, self.server),
                              self.server_fds)
            if pgid == 0:
                pgid = pid
            try:
                os.setpgid(pid, pgid)
            except OSError:
                pass  # the child did it already, or has exited
            self.children[pid] = (req, r)
            pids.append(pid)
        self.groups[req] = pgid
        send(self.ctl_out, ("started", req, pids, pgid))

    def kill_all(self) -> None:
        """SIGKILL every child and process group left, as the server ends: no rank outlives it."""
        for pid in list(self.children):
            _kill(pid, signal.SIGKILL)
        for pgid in self.groups.values():
            _kill(pgid, signal.SIGKILL, group=True)


def _fork_child(body: Callable[[], Any], server_fds: tuple[int, ...]) -> int:
    """Fork a child of the server that runs `body` without the server's signal plumbing and pipes,
    and never returns into the server's loop (exit 70 if `body` does)."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in server_fds:
                os.close(fd)
            body()
        finally:
            os._exit(70)
    return pid
