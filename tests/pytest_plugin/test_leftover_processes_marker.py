"""A distributed test (`@pytest.mark.distributed`) whose rank leaves servers running (a plain child,
one in its own session, a double-forked daemon): the rank pool ends them when the rank's test
ends, the test keeps its own outcome (passed), and pytest says so: a warning in its summary and a
note of the test (DDP816), with each server's pid and port. A test that ends
its child itself gets nothing. One inner pytest run, driven in a subprocess."""
from __future__ import annotations

import os
import signal
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers.procs import clean_env, run, wait_for

from ddp_doctor.training.run.ledger import process_gone

pytestmark = pytest.mark.slow
RUN_SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
INNER = """
import os
import subprocess
import sys

import leftover_servers
import pytest
import torch.distributed as dist


@pytest.mark.distributed(world_size=2)
def test_leaves_servers(rank):
    if rank == 1:
        d = os.environ["LEFTOVER_DIR"]
        for kind in leftover_servers.KINDS:
            leftover_servers.start(kind, d, "600")
        leftover_servers.wait_listening(d)
    dist.barrier()


@pytest.mark.distributed(world_size=2)
def test_ends_its_child(rank):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    child.terminate()
    child.wait(30)
    dist.barrier()
"""


def _servers(d: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for f in d.glob("*.pid"):
        pid, port = f.read_text().split()
        out[f.stem] = (int(pid), int(port))
    return out


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    d = tmp_path_factory.mktemp("marker_leftovers")
    (d / "test_inner.py").write_text(textwrap.dedent(INNER).strip() + "\n")
    env = clean_env(LEFTOVER_DIR=str(d), PY_COLORS="0",
                    PYTHONPATH=os.pathsep.join(filter(None, [str(RUN_SCRIPTS), os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_ADDOPTS", None)
    try:
        yield d, run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-ddp-doctor", "-rA",
                      f"--basetemp={d / 'base'}", "--junitxml=junit.xml", "test_inner.py"], env, str(d), 240)
    finally:  # what a failing run left: each server names its pid file on its command line
        for pid, _ in _servers(d).values():
            try:
                if str(d) in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _notes(d: Path, test: str) -> list[str]:
    suite = ET.parse(d / "junit.xml").getroot().find("testsuite")
    case = next(c for c in suite.findall("testcase") if c.get("name") == test)
    return [p.get("value") for p in case.iter("property") if p.get("name") == "ddp_doctor_note"]


def test_servers_a_tests_rank_left_are_ended_and_named_and_the_test_still_passes(inner):
    d, res = inner
    assert res.rc == 0, res.output
    assert "2 passed, 1 warning" in res.stdout, res.stdout
    servers = _servers(d)
    assert sorted(servers) == ["daemon", "plain", "session"], servers
    summary = res.stdout.split("warnings summary")[1].split("-- Docs:")[0]
    assert "test_inner.py::test_leaves_servers" in summary and "test_ends_its_child" not in summary, summary
    assert "LeftoverProcessesWarning: DDP816 warning: rank 1's test left 3 processes running after it ended" \
        in summary, summary
    (note,) = _notes(d, "test_leaves_servers")
    for pid, port in servers.values():
        assert f"pid {pid} (" in note and f"listening on 127.0.0.1:{port}" in note, note
        wait_for(lambda pid=pid: process_gone(pid), 30, f"server pid {pid} to be gone")
    assert "in a session of its own" in note  # the daemon: orphaned, adopted by the rank (a subreaper)


def test_a_test_that_ends_its_child_itself_gets_no_note(inner):
    d, res = inner
    assert "PASSED test_inner.py::test_ends_its_child" in res.stdout, res.stdout
    assert _notes(d, "test_ends_its_child") == []
