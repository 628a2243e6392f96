"""Stop signals to ddp-doctor's parents (issue 13): SIGTERM (SageMaker's StopTrainingJob, a spot
interruption, a CI cancel) and SIGINT (Ctrl-C) to a real `ddp-doctor run` of 2 gloo ranks, SIGHUP
to a self-launched preflight: a report with status "interrupted", where the ranks were, the
ledger's cause when there is one, exit 128 + the signal, and no process left behind."""
from __future__ import annotations

import glob
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from helpers.procs import DDP, clean_env, finish, load_json, start

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"


def in_training(run_parent: Path, pattern: str = "ddp-doctor-run-*") -> bool:
    beats = glob.glob(str(run_parent / pattern / "hb-*.json"))
    phases = []
    for p in beats:
        try:
            phases.append(json.loads(Path(p).read_text()).get("phase"))
        except (OSError, ValueError):
            return False
    return len(phases) == 2 and set(phases) == {"training"}


def leftovers(cwd: Path) -> list[str]:
    """Processes still running in the test's directory (every process of a launch inherits it)."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        if p.info.get("cwd") and Path(p.info["cwd"]).is_relative_to(cwd):
            out.append(" ".join(p.info.get("cmdline") or []))
    return out


def test_sigterm_and_sigint_to_run_report_where_the_ranks_were(tmp_path):
    procs = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        d = tmp_path / sig.name
        d.mkdir()
        cmd = [*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", "--run-dir", str(d / "runs"),
               "--report", str(d / "r.json"), str(SCRIPTS / "rank1_sleeps.py")]
        procs[sig] = (start(cmd, clean_env(), str(d)), d)
    deadline = time.monotonic() + 90
    while not all(in_training(d / "runs") for _, d in procs.values()):
        assert time.monotonic() < deadline, "the ranks never reached their scripts"
        time.sleep(0.2)
    time.sleep(1.5)  # a heartbeat or two inside the script
    sent = {}
    for sig, (proc, _) in procs.items():
        os.kill(proc.pid, sig)
        sent[sig] = time.monotonic()
    for sig, (proc, d) in procs.items():
        res = finish(proc, 60)
        took = time.monotonic() - sent[sig]
        assert res.rc == 128 + sig, res.output
        assert took < 20, took  # stacks and ledgers (<= ~6 s), then the report
        rep = load_json(str(d / "r.json"))
        assert rep["status"] == "interrupted", rep["status"]
        assert rep["interrupted"]["signal"] == sig.name and rep["interrupted"]["sender_pid"] == os.getpid()
        stopped = [f for f in rep["findings"] if f["id"] == "DDP808"]
        assert stopped and stopped[0]["ranks"] == [0, 1]
        assert "rank1_sleeps.py:9" in stopped[0]["message"] and "(in a collective)" in stopped[0]["message"]
        # the ledgers taken before the ranks were ended name why the job was stuck
        cause = rep["root_cause"]
        assert cause["id"] == "DDP891" and cause["ranks"] == [1], rep["findings"]
        assert "rank 0 waits in all_reduce #1" in cause["message"]
        assert f"stopped by {sig.name}" in res.stderr
    assert leftovers(tmp_path) == []


def test_sighup_to_a_self_launched_preflight_is_reported_as_interrupted(tmp_path):
    report = tmp_path / "r.json"
    proc = start([*DDP, "preflight", "--report", str(report)], clean_env(), str(tmp_path))
    time.sleep(3.0)  # the launcher and ranks are starting
    os.kill(proc.pid, signal.SIGHUP)
    res = finish(proc, 60)
    assert res.rc == 128 + signal.SIGHUP, res.output
    rep = load_json(str(report))
    assert rep["status"] == "interrupted" and rep["interrupted"]["signal"] == "SIGHUP"
    assert rep["root_cause"]["id"] == "DDP808"
    assert leftovers(tmp_path) == []


def test_sigterm_through_torchrun_each_rank_reports_where_it_was(tmp_path):
    """SageMaker's StopTrainingJob under the toolkit's torchrun: torchrun forwards SIGTERM to the
    ranks of `torchrun -m ddp_doctor run`; each still writes its report (rank 0's names the cause
    from its node's ledgers) before it exits 143."""
    import sys
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ddp_doctor", "run", str(SCRIPTS / "rank1_sleeps.py")]
    proc = start(cmd, clean_env(DDP_DOCTOR_RUN_DIR=str(runs)), str(tmp_path))
    deadline = time.monotonic() + 90
    while not in_training(tmp_path, pattern="runs"):
        assert time.monotonic() < deadline, "the ranks never reached their scripts"
        time.sleep(0.2)
    time.sleep(1.5)
    os.kill(proc.pid, signal.SIGTERM)
    res = finish(proc, 60)
    assert "stopped by SIGTERM" in res.stderr, res.output
    rep = load_json(str(tmp_path / "ddp-doctor-report.json"))
    assert rep["status"] == "interrupted", (rep["findings"], res.stderr[-3000:])
    assert rep["interrupted"]["signal"] == "SIGTERM"
    assert rep["root_cause"]["id"] == "DDP891" and rep["root_cause"]["ranks"] == [1], rep["findings"]
    stopped = [f for f in rep["findings"] if f["id"] == "DDP808"]
    assert stopped and "rank1_sleeps.py:10" in stopped[0]["message"]
    assert leftovers(tmp_path) == []
