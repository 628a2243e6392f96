"""Processes that outlive the job: a rank that starts servers (a plain child, one
in its own session, a double-forked daemon) and leaves them listening. At the rank's end ddp-doctor
finds them (tree, session, the mark in their environment), names them with their ports (DDP816, a
warning: the job's exit status stays its own) and ends them, under its own parent and under an
outside torchrun; a rank that ends its children itself, and leaves only a daemonic
multiprocessing child for Python's exit to end, gets no finding.

Real torchrun, real children, real sockets. The launches start together (module fixture); each test
reads its own. Whatever a failing run leaves is killed at the end (each server names its pid file
on its command line, so a reused pid is never killed).
"""
from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, ids, last_stall_lines, load_json, result_of, run_all, wait_for

from ddp_doctor.training.run.ledger import process_gone

pytestmark = pytest.mark.slow
SCRIPT = str(Path(__file__).resolve().parents[1] / "run_scripts" / "leaves_children.py")
DOCTOR = ["--skip", "communication", "--report", "r.json"]
KINDS = ("plain", "session", "daemon")


def _servers(d: Path) -> dict[str, tuple[int, int]]:
    """kind -> (pid, port) from the pid files the servers wrote."""
    out = {}
    for f in d.glob("*.pid"):
        pid, port = f.read_text().split()
        out[f.stem] = (int(pid), int(port))
    return out


def _kill_what_is_left(d: Path) -> None:
    for kind, (pid, _) in _servers(d).items():
        try:
            if kind == "mp" or str(d) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("leftovers")
    launches = {
        "parent": [*DDP, "run", "--nproc-per-node", "2", *DOCTOR, SCRIPT],
        "outside": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "-m", "ddp_doctor", "run", *DOCTOR, SCRIPT],
        "clean": [*DDP, "run", "--nproc-per-node", "2", *DOCTOR, SCRIPT],
        "hung": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 "-m", "ddp_doctor", "run", *DOCTOR, "--hang-timeout", "3", SCRIPT],
    }
    jobs = {}
    for name, cmd in launches.items():
        (base / name).mkdir()
        env = clean_env(LEFTOVER_DIR=str(base / name), LEFTOVER_LIFE="600",
                        **({"LEFTOVER_CLEAN": "1"} if name == "clean" else {}),
                        **({"LEFTOVER_HANG": "1", "DDP_DOCTOR_PROGRESS": "1"} if name == "hung" else {}))
        jobs[name] = Launch(cmd, env, str(base / name), 180)
    try:
        yield {"base": base, "results": run_all(jobs, at_once=4)}
    finally:
        for name in launches:
            _kill_what_is_left(base / name)


def _assert_found_named_and_ended(runs, name: str) -> None:
    res = result_of(runs["results"], name)
    d = runs["base"] / name
    assert res.rc == 0, res.output  # the job's own exit status
    servers = _servers(d)
    assert set(servers) == set(KINDS), servers
    rep = load_json(str(d / "r.json"))
    assert rep["status"] == "warn", rep  # a warning: the job ended well
    (found,) = [f for f in rep["findings"] if f["id"] == "DDP816"]
    assert found["ranks"] == [1] and found["severity"] == "warning", found
    procs = {p["pid"]: p for p in found["evidence"]["processes"]}
    assert set(procs) == {pid for pid, _ in servers.values()}, (procs, servers)
    for pid, port in servers.values():
        assert procs[pid]["ports"] == [f"127.0.0.1:{port}"], procs[pid]
        assert procs[pid]["ended"] == "SIGTERM", procs[pid]
        assert f"pid {pid} (" in found["message"] and f"listening on 127.0.0.1:{port}" in found["message"]
    assert procs[servers["daemon"][0]]["found_by"] == "child"  # orphaned, adopted by the rank (a subreaper)
    assert procs[servers["plain"][0]]["found_by"] == "child"
    assert "in a session of its own" in found["message"]
    assert not {"DDP817", "DDP818"} & ids(rep), rep["findings"]
    for kind, (pid, _) in servers.items():  # ended before the rank exited: gone (or a zombie init reaps)
        wait_for(lambda pid=pid: process_gone(pid), 30, f"the {kind} server (pid {pid}) to be gone")


def test_under_ddp_doctors_parent_the_servers_a_rank_left_are_named_with_their_ports_and_ended(runs):
    _assert_found_named_and_ended(runs, "parent")
    assert "DDP816" in result_of(runs["results"], "parent").stderr  # said, not only in the file


def test_under_an_outside_torchrun_the_servers_a_rank_left_are_named_with_their_ports_and_ended(runs):
    _assert_found_named_and_ended(runs, "outside")


def test_a_rank_that_ends_its_children_itself_gets_no_finding_and_pythons_own_children_are_left_to_it(runs):
    res = result_of(runs["results"], "clean")
    d = runs["base"] / "clean"
    assert res.rc == 0, res.output
    rep = load_json(str(d / "r.json"))
    assert not {"DDP816", "DDP817", "DDP818"} & ids(rep), rep["findings"]
    mp_pid = _servers(d)["mp"][0]  # the daemonic multiprocessing child: Python's exit ended it
    wait_for(lambda: process_gone(mp_pid), 30, f"the multiprocessing child (pid {mp_pid}) to be gone")


def test_a_hung_rank_under_an_outside_torchrun_ends_the_servers_its_script_started(runs):
    """The rank is ended at its hang bound (os._exit, no Python exit): what its script started ends
    with it, said on stderr; the report is the hang's (the rank that went elsewhere named)."""
    res = result_of(runs["results"], "hung")
    d = runs["base"] / "hung"
    assert res.rc != 0, res.output
    rep = load_json(str(d / "r.json"))
    assert rep["status"] == "fail", rep  # rank 1 blocks outside any collective while rank 0 waits in one
    assert rep["root_cause"]["id"] == "DDP891" and rep["root_cause"]["ranks"] == [1], rep["findings"]
    servers = _servers(d)
    assert set(servers) == set(KINDS), servers
    assert re.search(r"rank 1 ended [1-9] process\(es\) its script had started", res.stderr), res.output
    # DDP_DOCTOR_PROGRESS=1: before the bound, one rank of the node says the stall (not each rank)
    progress = [ln for ln in res.stderr.splitlines() if "made no progress for" in ln and "ended at 3 s" in ln]
    assert progress and len(last_stall_lines(progress)) <= 4, res.stderr
    assert any(re.search(r"rank 1 (has made .*, )?at leaves_children\.py:36 ", ln) for ln in progress), progress
    for kind, (pid, _) in servers.items():
        wait_for(lambda pid=pid: process_gone(pid), 30, f"the {kind} server (pid {pid}) to be gone")
