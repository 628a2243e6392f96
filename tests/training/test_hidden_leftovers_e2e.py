"""Leftovers that leave no trace in the tree, the session, the group or the environment: a daemon
that double-forks, calls setsid and execs with an empty environment is adopted by its rank (the
rank is a child subreaper), so it is named (DDP816) and ended; a child with `--password=V` on its
command line is named with the value redacted. One real 2-rank `ddp-doctor run`."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers.procs import DDP, clean_env, ids, load_json, run, wait_for

from ddp_doctor.training.run.ledger import process_gone

pytestmark = pytest.mark.slow
SCRIPT = str(Path(__file__).resolve().parents[1] / "run_scripts" / "leaves_hidden_children.py")
SECRET = "hunter2secret"


def _pids(d: Path) -> dict[str, int]:
    return {f.stem: int(f.read_text()) for f in d.glob("*.pid") if f.read_text().strip()}


def _kill_what_is_left(d: Path) -> None:
    for pid in _pids(d).values():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"sleep\x00600") or SECRET.encode() in cmd:  # what the script started, not a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_a_daemon_that_cleared_its_environment_and_a_child_with_a_password_are_named_redacted_and_ended(tmp_path):
    try:
        res = run([*DDP, "run", "--nproc-per-node", "2", "--skip", "communication", "--report", "r.json", SCRIPT],
                  clean_env(LEFTOVER_DIR=str(tmp_path)), str(tmp_path), 240)
        assert res.rc == 0, res.output  # the job's own exit status
        pids = _pids(tmp_path)
        assert set(pids) == {"daemon", "secret"}, pids
        rep = load_json(str(tmp_path / "r.json"))
        assert rep["status"] == "warn", rep["findings"]
        (found,) = [f for f in rep["findings"] if f["id"] == "DDP816"]
        assert found["ranks"] == [1] and found["severity"] == "warning", found
        procs = {p["pid"]: p for p in found["evidence"]["processes"]}
        assert set(procs) == set(pids.values()), (procs, pids)
        daemon, secret = procs[pids["daemon"]], procs[pids["secret"]]
        assert daemon["cmdline"] == "sleep 600" and f"pid {pids['daemon']} (sleep 600)" in found["message"], found
        assert "--password=***" in secret["cmdline"] and f"pid {pids['secret']} (" in found["message"], found
        assert "--password=***)" in found["message"], found["message"]  # the redaction keeps the text around it
        assert all(p["ended"] in ("SIGTERM", "SIGKILL") for p in procs.values()), procs
        assert SECRET not in res.output and SECRET not in (tmp_path / "r.json").read_text()
        assert not {"DDP817", "DDP818"} & ids(rep), rep["findings"]
        for kind, pid in pids.items():
            wait_for(lambda pid=pid: process_gone(pid), 30, f"the {kind} process (pid {pid}) to be gone")
    finally:
        _kill_what_is_left(tmp_path)


def test_a_forked_copy_of_the_rank_left_running_is_ended_and_never_stops_the_rank(tmp_path):
    """The copy inherits the rank's stop watch (its handler, its wakeup pipe): ended with SIGTERM,
    it must not write that stop into the pipe it shares with the rank, which would then exit 143."""
    script = str(Path(__file__).resolve().parents[1] / "run_scripts" / "forks_and_leaves.py")
    try:
        res = run([*DDP, "run", "--report", "r.json", script], clean_env(LEFTOVER_DIR=str(tmp_path)),
                  str(tmp_path), 240)
        assert res.rc == 0, res.output  # the script's own status, not 128 + SIGTERM
        pid = int((tmp_path / "fork.pid").read_text())
        rep = load_json(str(tmp_path / "r.json"))
        (found,) = [f for f in rep["findings"] if f["id"] == "DDP816"]
        assert [p["pid"] for p in found["evidence"]["processes"]] == [pid], found
        assert "SIGTERM arrived" not in res.output, res.output
        wait_for(lambda: process_gone(pid), 30, f"the forked copy (pid {pid}) to be gone")
    finally:
        try:
            if b"forks_and_leaves" in Path(f"/proc/{int((tmp_path / 'fork.pid').read_text())}/cmdline").read_bytes():
                os.kill(int((tmp_path / "fork.pid").read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
