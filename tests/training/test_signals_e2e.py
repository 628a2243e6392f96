"""Stop signals to ddp-doctor's parents: SIGTERM (SageMaker's StopTrainingJob, a spot
interruption, a CI cancel) and SIGINT (Ctrl-C) to a real `ddp-doctor run` of 2 gloo ranks, SIGHUP
to a self-launched preflight: a report with status "interrupted", where the ranks were, the
ledger's cause when there is one, exit 128 + the signal, and no process left behind.

Each signal is sent once the ranks are where the test needs them, as the ranks themselves say so
(their heartbeats; for the preflight, a test check that holds its ranks), never after a sleep."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from helpers.procs import DDP, clean_env, finish, kill_tree, load_json, start, wait_for

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
ROOT = Path(__file__).resolve().parents[2]
START_BOUND = 240  # seconds for the launches to reach their scripts: only ends a wait that never would


def heartbeats(run_parent: Path, pattern: str) -> dict[int, dict]:
    out = {}
    for p in glob.glob(str(run_parent / pattern / "hb-*.json")):
        try:
            hb = json.loads(Path(p).read_text())
            out[int(hb["rank"])] = hb
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def stuck_in_rank1_sleeps(run_parent: Path, pattern: str = "ddp-doctor-run-*") -> bool:
    """Both ranks where rank1_sleeps.py keeps them, each seen there by its watchdog on two samples
    in a row (its stack unchanged since the sample before: blocked there): rank 1 in its sleep
    (line 9), rank 0 inside the all_reduce (line 10) that waits for rank 1."""
    hbs = heartbeats(run_parent, pattern)

    def held(hb: dict | None, line: int) -> bool:
        return bool(hb) and hb.get("phase") == "training" and f"rank1_sleeps.py:{line} in" in (hb.get("where") or "") \
            and float(hb.get("time") or 0) > float(hb.get("last_progress") or 0)

    return len(hbs) == 2 and held(hbs.get(1), 9) and held(hbs.get(0), 10) and bool(hbs[0].get("in_collective"))


def wait_until_stuck(run_parent: Path, pattern: str = "ddp-doctor-run-*") -> None:
    wait_for(lambda: stuck_in_rank1_sleeps(run_parent, pattern), START_BOUND,
             lambda: f"rank 1 in its sleep and rank 0 in the all_reduce; heartbeats: {heartbeats(run_parent, pattern)}")


@contextmanager
def ended_if_it_fails(*procs: subprocess.Popen):
    """A wait that fails ends the launches it waited on (with their whole trees), and says what
    they printed."""
    try:
        yield
    except BaseException as e:  # noqa: BLE001 - any failed wait, Ctrl-C too: end the launches, show their output
        outputs = []
        for p in procs:
            kill_tree(p.pid)
            try:
                out, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                out, err = "", "(output lost)"
            outputs.append(f"{p.args}:\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
        raise AssertionError("\n".join([str(e), *outputs])) from None


def leftovers(cwd: Path) -> list[str]:
    """Processes still running in the test's directory (every process of a launch inherits it)."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        if p.info.get("cwd") and Path(p.info["cwd"]).is_relative_to(cwd):
            out.append(" ".join(p.info.get("cmdline") or []))
    return out


def assert_none_left(cwd: Path) -> None:
    """No process of the launch outlives it: a killed one may take a moment to be gone, so the wait
    is bounded, and what is still there at the bound fails the test."""
    wait_for(lambda: not leftovers(cwd), 30, lambda: f"the launch's processes to end; still running: {leftovers(cwd)}")


def test_sigterm_and_sigint_to_run_report_where_the_ranks_were(tmp_path):
    procs = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        d = tmp_path / sig.name
        d.mkdir()
        cmd = [*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", "--run-dir", str(d / "runs"),
               "--report", str(d / "r.json"), str(SCRIPTS / "rank1_sleeps.py")]
        procs[sig] = (start(cmd, clean_env(), str(d)), d)
    with ended_if_it_fails(*(proc for proc, _ in procs.values())):
        for _, d in procs.values():
            wait_until_stuck(d / "runs")
    for sig, (proc, _) in procs.items():
        os.kill(proc.pid, sig)
    for sig, (proc, d) in procs.items():
        res = finish(proc, 120)  # an overrun fails the test
        assert res.rc == 128 + sig, res.output
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
        assert "DDP801" not in {f["id"] for f in rep["findings"]}  # ended by the signal, not a hang bound
    assert_none_left(tmp_path)


def test_sighup_to_a_self_launched_preflight_is_reported_as_interrupted(tmp_path):
    """SIGHUP while the preflight's ranks run: a test check (tests/plugins/held_check.py) holds each
    rank in the local checks and says so, so the signal arrives then, whatever the machine's load."""
    report, held = tmp_path / "r.json", tmp_path / "held"
    held.mkdir()
    env = clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.held_check", PYTHONPATH=str(ROOT), HELD_CHECK_DIR=str(held))
    proc = start([*DDP, "preflight", "--report", str(report)], env, str(tmp_path))
    with ended_if_it_fails(proc):
        wait_for(lambda: {p.name for p in held.iterdir()} == {"rank-0", "rank-1"}, START_BOUND,
                 lambda: f"both ranks in the held check (there: {sorted(p.name for p in held.iterdir())})")
    os.kill(proc.pid, signal.SIGHUP)
    res = finish(proc, 120)
    assert res.rc == 128 + signal.SIGHUP, res.output
    rep = load_json(str(report))
    assert rep["status"] == "interrupted" and rep["interrupted"]["signal"] == "SIGHUP"
    assert rep["root_cause"]["id"] == "DDP808"
    assert_none_left(tmp_path)


def test_sigterm_through_torchrun_each_rank_reports_where_it_was(tmp_path):
    """SageMaker's StopTrainingJob under the toolkit's torchrun: torchrun forwards SIGTERM to the
    ranks of `torchrun -m ddp_doctor run`; each still writes its report (rank 0's names the cause
    from its node's ledgers) before it exits 143."""
    import sys
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ddp_doctor", "run", str(SCRIPTS / "rank1_sleeps.py")]
    proc = start(cmd, clean_env(DDP_DOCTOR_RUN_DIR=str(runs)), str(tmp_path))
    with ended_if_it_fails(proc):
        wait_until_stuck(tmp_path, pattern="runs")
    os.kill(proc.pid, signal.SIGTERM)
    res = finish(proc, 120)
    assert "stopped by SIGTERM" in res.stderr, res.output
    rep = load_json(str(tmp_path / "ddp-doctor-report.json"))
    assert rep["status"] == "interrupted", (rep["findings"], res.stderr[-3000:])
    assert rep["interrupted"]["signal"] == "SIGTERM"
    assert rep["root_cause"]["id"] == "DDP891" and rep["root_cause"]["ranks"] == [1], rep["findings"]
    stopped = [f for f in rep["findings"] if f["id"] == "DDP808"]
    assert stopped and "rank1_sleeps.py:10" in stopped[0]["message"]
    assert_none_left(tmp_path)
