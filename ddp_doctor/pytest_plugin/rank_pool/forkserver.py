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
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, tuple[int, int]] = {}   # pid -> (request id, rank)
    groups: dict[int, int] = {}                 # request id -> pgid
    send(ctl_out, ("ready", os.getpid()))
    reader = Reader()
    server = os.getpid()

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            info = children.pop(pid, None)
            if info is not None:
                send(ctl_out, ("exited", info[0], info[1], status, time.time()))
                if not any(v[0] == info[0] for v in children.values()):
                    groups.pop(info[0], None)

    def live(req: int) -> list[int]:
        return [p for p, v in children.items() if v[0] == req]

    try:
        while True:
            ready, _, _ = select.select([ctl_in, wake_r], [], [], 1.0)
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            reap()
            if ctl_in not in ready:
                continue
            data = os.read(ctl_in, 1 << 16)
            if not data:
                break  # the parent closed the pipe or died
            for msg in reader.feed(data):
                kind, req = msg[0], msg[1]
                if kind == "run":
                    spec = msg[2]
                    pids: list[int] = []
                    pgid = 0
                    for r in range(int(spec["world_size"])):
                        pid = _fork_child(lambda r=r, pgid=pgid, spec=spec: rank_main(spec, r, pgid, server),
                                          (wake_r, wake_w, ctl_out))
                        if pgid == 0:
                            pgid = pid
                        try:
                            os.setpgid(pid, pgid)
                        except OSError:
                            pass  # the child did it already, or has exited
                        children[pid] = (req, r)
                        pids.append(pid)
                    groups[req] = pgid
                    send(ctl_out, ("started", req, pids, pgid))
                elif kind == "judge":
                    pid = _fork_child(lambda msg=msg: judge_child(msg[2], server), (wake_r, wake_w, ctl_out))
                    children[pid] = (req, JUDGE)
                elif kind == "signal":
                    for pid in live(req):
                        try:
                            os.kill(pid, int(msg[2]))
                        except ProcessLookupError:
                            pass
                elif kind == "kill":
                    if live(req) and req in groups:
                        try:
                            os.killpg(groups[req], signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    for pid in live(req):  # a rank that left the group is still ours
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
    finally:
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pgid in groups.values():
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(0)


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
