"""The parent's side of the rank pool: RankPool starts the forkserver (lazily, again if it died),
runs one test's ranks with every wait bounded (a timeout or a failed peer dumps the live ranks'
stacks and ledgers of collectives, then kills them) and collects a RunResult; it has a failed
test judged in a child of the forkserver; compile_module prepares the test module's code.
The parent never imports torch.
"""
from __future__ import annotations

import ast
import marshal
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

from ddp_doctor.processes.tree import die_with_parent
from ddp_doctor.pytest_plugin.rank_pool.ledgers import ask as ask_for_ledgers
from ddp_doctor.pytest_plugin.rank_pool.ledgers import written_since as ledger_written_since
from ddp_doctor.pytest_plugin.rank_pool.results import (
    POOL_LOST,
    LeftoverProcessesWarning,
    RankEnd,
    RunResult,
    collect,
    file_size,
    leftover_notes,
    read_json,
    read_result,
    read_text,
)
from ddp_doctor.pytest_plugin.rank_pool.wire import (
    PRELOAD,
    PRELOAD_ENV,
    Reader,
    judgement_path,
    output_path,
    send,
)

STACK_WAIT_S = 1.0       # how long the parent waits for faulthandler dumps of hung ranks
LEDGER_WAIT_S = 2.0      # how long it waits for their ledgers (a thread in each rank writes it)
JUDGE_WAIT_S = 30.0      # how long it waits for the judgement of a failed test
PEER_GRACE_S = 3.0       # after a rank failed, how long its peers get to fail or finish on their own
REAP_WAIT_S = 5.0        # after a kill, how long the parent waits for the forkserver to reap ranks
SERVE = "from ddp_doctor.pytest_plugin.rank_pool.forkserver import serve; serve()"


def compile_module(path: str, config: Any = None) -> bytes:
    """The test module's code as pytest runs it (asserts rewritten), marshalled for the ranks."""
    with open(path, "rb") as f:
        source = f.read()
    try:
        from _pytest.assertion.rewrite import rewrite_asserts
        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, path, config)
        code = compile(tree, path, "exec", dont_inherit=True)
    except Exception:  # noqa: BLE001 - plain asserts still work
        code = compile(source, path, "exec", dont_inherit=True)
    return marshal.dumps(code)


STOPPED_BY: list[int] = []  # the stop signal that ended the session, if one did
REPEATED: list[int] = []    # stop signals that came after it while the session ended: taken, nothing more
REPEAT_GRACE_S = 30.0       # a repeat this long after the first stop interrupts again (the first was lost)
_FIRST_AT: list[float] = []
RECV_SLICE_S = 0.25         # the longest the parent waits in one select: a stop's handler runs between them
TERMINALS = ("/dev/pts/", "/dev/tty", "/dev/console")


def _raise_interrupt(signo: int, _frame: Any) -> None:
    if STOPPED_BY and time.monotonic() - _FIRST_AT[0] < REPEAT_GRACE_S:
        # A closed terminal sends SIGHUP twice (the kernel's hangup, then the shell's own to its
        # jobs), a scheduler repeats its SIGTERM: the session is already ending, its ranks being
        # ended. A second KeyboardInterrupt would break that ending half-way (the ranks' stacks
        # and the kill skipped, pytest's own handling cut: exit 130 and a traceback, not 128 + N).
        REPEATED.append(signo)
        return
    if not STOPPED_BY:
        STOPPED_BY.append(signo)
        _FIRST_AT.append(time.monotonic())
    if signo == signal.SIGHUP:
        quiet_hung_up_terminals()
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signo).name}")


def quiet_hung_up_terminals() -> list[int]:
    """A closed terminal (SIGHUP's usual sender) takes no more output: each write to it fails
    (EIO), and pytest, reporting the interrupted session there, would end in an error of its own
    (exit 1, the ranks' stacks lost) instead of 129. Each descriptor this process holds on a
    terminal that has hung up (poll: POLLHUP or POLLERR) is pointed at /dev/null, as `nohup` would
    have done, the copies pytest's capture keeps of stdout and stderr included. A terminal still
    there, a file or a pipe is left as it is. Returns the descriptors changed."""
    import select
    try:
        fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: the standard streams at least
        fds = [0, 1, 2]
    gone = []
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith(TERMINALS):
                continue
            poll = select.poll()
            poll.register(fd, select.POLLOUT)
            hung_up = any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poll.poll(0))
        except (OSError, ValueError):
            continue
        if hung_up:
            gone.append(fd)
    if gone:
        try:
            null = os.open(os.devnull, os.O_RDWR)
        except OSError:
            return []
        for fd in gone:
            try:
                os.dup2(null, fd, inheritable=os.get_inheritable(fd))
            except OSError:
                pass
        os.close(null)
    return gone


def stop_as_interrupt() -> None:
    """SIGTERM and SIGHUP (a cancelled CI job, a closed terminal) end the session as Ctrl-C does:
    pytest reports the interrupted session, exits 128 + the signal, and the running distributed
    test shows its ranks' stacks. Only where nobody else handles them, and only from the main
    thread (where Python can install handlers). Called as the pool starts and again as each
    distributed test starts: what ran in pytest's process since (a test, a library) may have
    blocked them or put their default action back."""
    if threading.current_thread() is not threading.main_thread():
        return
    stops = (signal.SIGTERM, signal.SIGHUP)
    for sig in stops:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _raise_interrupt)
    # A mask inherited blocked (pytest started by a process that held the stop signals) would keep
    # them pending for ever, the session outliving them: they act here (a signal ignored on purpose,
    # `nohup pytest`, stays ignored)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (*stops, signal.SIGINT))


def interrupted_stacks(d: str, live: list[int]) -> str:
    """What to show for ranks a stop signal caught in their test: each one's Python stack."""
    parts = []
    for r in live:
        text = read_text(output_path(d, "stack", r)).strip()
        parts.append(f"ddp-doctor: rank {r} was running when the session was stopped; its Python stack:\n"
                     f"{text or '(none recorded)'}")
    return "\n".join(parts)


class RankPool:
    """The parent's handle on the forkserver; started lazily, restarted if it dies."""

    def __init__(self, log_path: str, preload: tuple[str, ...] = PRELOAD) -> None:
        self.log_path = log_path
        self.preload = preload
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader = Reader()
        self.pending: list[Any] = []
        self.ready = False
        self.req = 0
        self.interrupted = ""  # the stacks of the ranks a stop signal caught, for the marker to show

    # -- lifecycle
    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        stop_as_interrupt()
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env[PRELOAD_ENV] = ",".join(self.preload)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", SERVE],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGKILL))
        finally:
            log.close()
        self.reader, self.pending, self.ready = Reader(), [], False

    def close(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            assert p.stdin is not None
            p.stdin.close()  # the forkserver kills what is left and exits
        except OSError:
            pass
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()

    def _recv(self, timeout: float) -> Any:
        """The next event, None on timeout; raises EOFError when the forkserver is gone."""
        if self.pending:
            return self.pending.pop(0)
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + max(timeout, 0.0)
        while True:
            left = end - time.monotonic()
            # in slices: a stop signal that another thread of pytest's process took (one this
            # thread blocks) interrupts no select here; its handler runs between two slices
            r, _, _ = select.select([fd], [], [], min(max(left, 0.0), RECV_SLICE_S))
            if not r:
                if left > RECV_SLICE_S:
                    continue
                return None
            data = os.read(fd, 1 << 16)
            if not data:
                raise EOFError(POOL_LOST)
            self.pending.extend(self.reader.feed(data))
            if self.pending:
                return self.pending.pop(0)

    def _send(self, msg: Any) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        send(self.proc.stdin.fileno(), msg)

    def wait_ready(self, timeout: float) -> None:
        self.start()
        end = time.monotonic() + timeout
        while not self.ready:
            msg = self._recv(end - time.monotonic())
            if msg is None:
                raise TimeoutError(f"the rank pool did not start within {timeout:g} s (log: {self.log_path})")
            if msg[0] == "ready":
                self.ready = True

    # -- one test
    def run(self, spec: dict[str, Any], timeout: float, *, start_timeout: float = 120.0) -> RunResult:
        stop_as_interrupt()  # as this test starts, whatever happened to the stop signals since the pool started
        ws = int(spec["world_size"])
        try:
            self.wait_ready(start_timeout)
        except EOFError:
            self.close()
            self.start()
            self.wait_ready(start_timeout)
        self.req += 1
        req = self.req
        t0 = time.monotonic()
        ends = {r: RankEnd(r) for r in range(ws)}
        res = RunResult(world_size=ws, ends=ends, timeout=timeout)
        killed_for: str | None = None
        deadline = t0 + timeout
        grace_end: float | None = None
        try:
            self._send(("run", req, spec))
            reaped: set[int] = set()
            kill_sent_at: float | None = None
            while len(reaped) < ws:
                now = time.monotonic()
                if killed_for is None and (now >= deadline or (grace_end is not None and now >= grace_end)):
                    killed_for = "timeout" if now >= deadline else "peer"
                    res.timed_out = killed_for == "timeout"
                    self._dump_and_kill(req, spec["dir"], [r for r in range(ws) if r not in reaped])
                    for r in range(ws):
                        if r not in reaped:
                            ends[r].killed = killed_for
                    kill_sent_at = time.monotonic()
                if kill_sent_at is not None and time.monotonic() - kill_sent_at > REAP_WAIT_S:
                    res.notes.append(f"ranks {sorted(set(range(ws)) - reaped)} were not reaped "
                                     f"{REAP_WAIT_S:g} s after SIGKILL")
                    break
                wait_until = deadline if grace_end is None else min(deadline, grace_end)
                if killed_for is not None:
                    wait_until = time.monotonic() + 0.5
                msg = self._recv(max(wait_until - time.monotonic(), 0.0))
                if msg is None or msg[1] != req:
                    continue
                if msg[0] == "exited":
                    _, _, r, status, when = msg
                    reaped.add(r)
                    ends[r].status, ends[r].exit_time = status, when
                    end_result = read_result(spec["dir"], r)
                    if grace_end is None and (end_result is None or end_result["outcome"] != "passed"):
                        grace_end = time.monotonic() + PEER_GRACE_S
        except EOFError:
            res.pool_lost = True
            self.close()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP (stop_as_interrupt): where the ranks were
            live = sorted(set(range(ws)) - reaped)
            try:
                self._dump_and_kill(req, spec["dir"], live, ledgers=False)
            except (OSError, AssertionError):
                pass
            self.interrupted = interrupted_stacks(spec["dir"], live)
            raise
        except BaseException:  # any other way out: the ranks are killed, then it goes on up
            try:
                self._send(("kill", req))
            except (OSError, AssertionError):
                pass
            raise
        res.seconds = time.monotonic() - t0
        for e in ends.values():
            collect(e, spec["dir"])
        for note in leftover_notes(res):  # in pytest's warnings summary too, not only in the test's notes
            warnings.warn(note, LeftoverProcessesWarning, stacklevel=2)
        return res

    def _dump_and_kill(self, req: int, d: str, live: list[int], *, ledgers: bool = True) -> None:
        """With `ledgers`, every live rank's ledger of collectives and where it was (a thread in the
        rank writes them: rank_pool/ledgers.py); then every live rank's Python stack (faulthandler
        on SIGUSR1, once those threads are idle again: a stack dump reads other threads' frames);
        each wait bounded; then the kill."""
        if ledgers:
            asked_at = time.time()
            asked = ask_for_ledgers(d, live)
            end = time.monotonic() + LEDGER_WAIT_S
            while asked and time.monotonic() < end:
                if all(ledger_written_since(d, r, asked_at) for r in asked):
                    time.sleep(0.02)  # the thread goes back to waiting for the next request
                    break
                time.sleep(0.02)
        self._send(("signal", req, int(signal.SIGUSR1)))
        end = time.monotonic() + STACK_WAIT_S
        paths = [output_path(d, "stack", r) for r in live]
        while time.monotonic() < end:
            if all(file_size(p) > 0 for p in paths):
                time.sleep(0.05)  # let the dump finish writing
                break
            time.sleep(0.02)
        self._send(("kill", req))

    # -- the judgement of a failed test, in a child of the forkserver (torch is loaded there)
    def judge(self, inputs: dict[str, Any], d: str, bound: float = JUDGE_WAIT_S) -> dict[str, Any] | None:
        """ddp-doctor's judgement of a failed test (rank_pool/judge.py), made by a child the
        forkserver forks, so that this process never imports torch; None when it could not be had
        within `bound` seconds."""
        if self.proc is None or self.proc.poll() is not None or not self.ready:
            return None
        self.req += 1
        req = self.req
        end = time.monotonic() + bound
        try:
            self._send(("judge", req, {**inputs, "dir": d}))
            while True:
                msg = self._recv(end - time.monotonic())
                if msg is None:
                    self._send(("kill", req))
                    return None
                if msg[0] == "exited" and msg[1] == req:
                    break
        except EOFError:
            self.close()
            return None
        except OSError:
            return None
        return read_json(judgement_path(d))
