"""SIGHUP to pytest while a `@pytest.mark.distributed` test runs (a closed terminal, a cancelled CI
job): the session ends as Ctrl-C ends it, pytest exits 129 (128 + SIGHUP) and no process of the
session is left: neither the rank pool's forkserver nor its ranks. Also when pytest was started with
the stop signals blocked (a parent that held them): the mask it inherits does not keep SIGHUP
pending for ever. One inner pytest per case, driven in a subprocess."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

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


@pytest.mark.parametrize("mask", ["default", "inherited blocked"])
def test_sighup_during_a_distributed_test_exits_129_and_leaves_no_rank(tmp_path, mask):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER).strip() + "\n")
    env = clean_env(HUP_DIR=str(tmp_path), PY_COLORS="0")
    env.pop("PYTEST_ADDOPTS", None)
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-ddp-doctor", "-rA",
             f"--basetemp={tmp_path / 'base'}", "test_inner.py"], env=env, cwd=str(tmp_path), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_blocked_stops if mask != "default" else None)
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
