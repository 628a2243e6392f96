"""SIGHUP to pytest while a `@pytest.mark.distributed` test runs (a closed terminal, a cancelled CI
job): the session ends as Ctrl-C ends it, pytest exits 129 (128 + SIGHUP) and no process of the
session is left: neither the rank pool's forkserver nor its ranks. Also when pytest was started with
the stop signals blocked (a parent that held them): the mask it inherits does not keep SIGHUP
pending for ever. Then the case as reported, rank 1 waiting in a barrier rank 0 never reaches, in
its shapes: one SIGHUP (which also stands for the plain case, pytest started with no signal
blocked), two (a closed terminal's), a closed terminal, the stop signals blocked in pytest's
process after the rank pool started. One inner pytest per case, driven in a subprocess; every wait
is for a state (the ranks' pid files, the ranks gone), bounded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import psutil
import pytest
from helpers.procs import clean_env, kill_tree, wait_for

pytestmark = pytest.mark.slow
INNER = """
import os
import threading

import pytest


@pytest.mark.distributed(world_size=2)
def test_blocks(rank):
    open(os.path.join(os.environ["HUP_DIR"], f"running-{rank}"), "w").close()
    threading.Event().wait(600)
"""


def _blocked_stops() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))


def test_sighup_with_the_stop_signals_blocked_from_the_start_exits_129_and_leaves_no_rank(tmp_path):
    # pytest started with SIGHUP blocked; started with none blocked, it is the "once" shape below
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER).strip() + "\n")
    env = clean_env(HUP_DIR=str(tmp_path), PY_COLORS="0")
    env.pop("PYTEST_ADDOPTS", None)
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-ddp-doctor", "-rA",
             f"--basetemp={tmp_path / 'base'}", "test_inner.py"], env=env, cwd=str(tmp_path), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_blocked_stops)
    session: list[psutil.Process] = []
    try:
        wait_for(lambda: all((tmp_path / f"running-{r}").exists() for r in (0, 1)) or proc.poll() is not None,
                 180, lambda: "the ranks to run the test\n" + (tmp_path / "out.txt").read_text())
        assert proc.poll() is None, (tmp_path / "out.txt").read_text()
        session = psutil.Process(proc.pid).children(recursive=True)  # the forkserver and its ranks
        assert len(session) >= 3, session
        os.kill(proc.pid, signal.SIGHUP)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            rc = None
        output = (tmp_path / "out.txt").read_text()
        assert rc == 128 + signal.SIGHUP, f"exit {rc}\n{output}"
        assert "stopped by SIGHUP" in output, output

        def gone(p: psutil.Process) -> bool:
            try:
                return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True
        wait_for(lambda: all(gone(p) for p in session), 30, lambda: f"no process of the session left: {session}")
    finally:
        kill_tree(proc.pid)
        for p in session:
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.wait(30)


# ---------------------------------------------------------------- the case as reported, and its shapes
# Rank 1 waits in a barrier that rank 0 never reaches (rank 0 waits on an event): the parent waits
# on its ranks. Each rank writes its pid once inside the test body: the state the test waits for,
# and what "no rank left" is checked by. A plain test runs first: with HUP_HOLD=1 it leaves the
# stop signals blocked in pytest's main thread, as a command that holds them, called in-process,
# or a library taking them synchronously would.
BARRIER = """
import os
import signal
import threading

import pytest
import torch.distributed as dist

HERE = os.environ["HUP_DIR"]


def test_before():
    if os.environ.get("HUP_HOLD") == "1":
        signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGHUP))


@pytest.mark.distributed(world_size=2, timeout=900)
def test_rank_1_waits_in_a_barrier(rank):
    path = os.path.join(HERE, f"pid-{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    if rank == 1:
        dist.barrier()  # rank 0 never comes
    else:
        threading.Event().wait(900)
"""
EXIT_BOUND = 90.0  # generous: the session ends in seconds; the test's own timeout is 900 s


class Terminal:
    """A pseudo-terminal for pytest's stdin, stdout and stderr, read as pytest writes (a full one
    would block it); hang_up() closes it as a closed terminal window or a dropped ssh session does:
    every later write to it fails (EIO)."""

    def __init__(self) -> None:
        import pty
        self.master, self.slave = pty.openpty()
        self.data = bytearray()
        self.open = True
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        import select
        while self.open:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                self.data += chunk

    def hang_up(self) -> None:
        self.open = False
        self.reader.join(10)  # never closed under a read in flight: the close must reach the terminal
        os.close(self.master)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self.open:
            self.hang_up()
        os.close(self.slave)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("shape", ["once", "twice", "closed terminal", "held since the pool started"])
def test_sighup_while_a_rank_waits_in_a_barrier_exits_129_and_leaves_no_rank(tmp_path, shape):
    """SIGHUP to pytest while rank 1 waits in a barrier: pytest exits 129 within the bound (128 +
    SIGHUP, what a shell reports for a command SIGHUP ended; pytest's own code for an interrupted
    session is 2, and the plugin makes it 128 + the signal, as for SIGTERM) and no rank, nor the
    rank pool's forkserver, is left. Shapes: one SIGHUP; a second one while the first is being
    handled (a closed terminal sends two: the kernel's hangup, then the shell's own); the terminal
    pytest writes to closed before the SIGHUP (every later write fails); the stop signals blocked
    in pytest's main thread by an earlier test (the SIGHUP would wait, pending, for the test's 900 s
    timeout)."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(BARRIER).strip() + "\n")
    env = clean_env(HUP_DIR=str(tmp_path), PY_COLORS="0", HUP_HOLD="1" if shape.startswith("held") else "0")
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-ddp-doctor", "-rA",
           f"--basetemp={tmp_path / 'base'}", "test_inner.py"]
    term = Terminal() if shape == "closed terminal" else None
    out = open(tmp_path / "out.txt", "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, env=env, cwd=str(tmp_path), start_new_session=True,
                            stdin=term.slave if term else subprocess.DEVNULL, stdout=term.slave if term else out,
                            stderr=term.slave if term else subprocess.STDOUT)

    def output() -> str:
        return term.text() if term else (tmp_path / "out.txt").read_text()

    pid_files = [tmp_path / f"pid-{r}" for r in (0, 1)]
    session: list[psutil.Process] = []
    ranks: list[int] = []
    try:
        wait_for(lambda: all(p.exists() for p in pid_files) or proc.poll() is not None, 180,
                 lambda: "both ranks inside the test body\n" + output())
        assert proc.poll() is None, output()
        ranks = [int(p.read_text()) for p in pid_files]
        session = psutil.Process(proc.pid).children(recursive=True)  # the forkserver and its ranks
        assert len(session) >= 3 and set(ranks) <= {p.pid for p in session}, (ranks, session)
        if term is not None:
            term.hang_up()
        os.kill(proc.pid, signal.SIGHUP)
        if shape == "twice":  # once the parent ended the ranks: pytest is reporting the interrupted session
            wait_for(lambda: all(_gone(p) for p in ranks) or proc.poll() is not None, 30,
                     lambda: "the parent to end the ranks after the first SIGHUP\n" + output())
            try:
                os.kill(proc.pid, signal.SIGHUP)
            except ProcessLookupError:
                pass
        try:
            rc = proc.wait(EXIT_BOUND)
        except subprocess.TimeoutExpired:
            rc = None
        text = output()
        # twice: a second SIGHUP in the interpreter's last instant (its handlers reset) ends it by the
        # default action, which a shell reports as 129 too
        assert rc == 128 + signal.SIGHUP or (shape == "twice" and rc == -signal.SIGHUP), f"exit {rc}\n{text}"
        if term is None:
            assert "stopped by SIGHUP" in text and "Traceback" not in text, text
            assert "rank 1 was running when the session was stopped" in text, text
        wait_for(lambda: all(_gone(p) for p in ranks) and all(_gone(p.pid) for p in session), 30,
                 lambda: f"no rank (pids {ranks}) nor forkserver left: {session}")
    finally:
        if proc.poll() is None:  # never a pid once reaped: it may be another process's by now
            kill_tree(proc.pid)
        for p in session:
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.wait(30)
        out.close()
        if term is not None:
            term.close()
