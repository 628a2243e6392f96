"""Stop signals to ddp-doctor's parents: SIGTERM (SageMaker's StopTrainingJob, a spot
interruption, a CI cancel) and SIGINT (Ctrl-C) to a real `ddp-doctor run` of 2 gloo ranks, SIGHUP
to a self-launched preflight: a report with status "interrupted", where the ranks were, the
ledger's cause when there is one, exit 128 + the signal, and no process left behind.

Each signal is sent once the ranks are where the test needs them, as the ranks themselves say so
(their heartbeats; for the preflight, a test check that holds its ranks), never after a sleep. The
launches run together in one module fixture; the SIGINT one is shared with test_stops_e2e.py
(helpers/launches.py), whose second SIGINT, sent while the report is written, leaves the report
the first one's."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest
from helpers import stops
from helpers.launches import ended_if_it_fails, wait_until_stuck
from helpers.procs import DDP, Result, clean_env, finish, load_json, result_of, wait_for

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
ROOT = Path(__file__).resolve().parents[2]
START_BOUND = 240  # seconds for the launches to reach their scripts: only ends a wait that never would
SIGINT_TWICE = "sigint_twice_while_stuck"  # the SIGINT case: a shared launch (helpers/launches.py)


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


def _sigterm_to_run(d: Path) -> Callable[[], Result]:
    """SIGTERM to `ddp-doctor run` of rank1_sleeps.py once both ranks are held there."""
    def job() -> Result:
        cmd = [*DDP, "run", "--skip", "communication", "--nproc-per-node", "2", "--timeout", "30", "--run-dir",
               str(d / "runs"), "--report", str(d / "r.json"), str(SCRIPTS / "rank1_sleeps.py")]
        proc = stops.start(cmd, clean_env(), str(d))
        with ended_if_it_fails(proc):
            wait_until_stuck(d / "runs")
        os.kill(proc.pid, signal.SIGTERM)
        return finish(proc, 120)  # an overrun fails the test that reads it
    return job


def _sighup_to_preflight(d: Path) -> Callable[[], Result]:
    """SIGHUP while the preflight's ranks run: a test check (tests/plugins/held_check.py) holds each
    rank in the local checks and says so, so the signal arrives then, whatever the machine's load."""
    def job() -> Result:
        held = d / "held"
        held.mkdir()
        env = clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.held_check", PYTHONPATH=str(ROOT),
                        HELD_CHECK_DIR=str(held))
        proc = stops.start([*DDP, "preflight", "--report", str(d / "r.json")], env, str(d))
        with ended_if_it_fails(proc):
            wait_for(lambda: {p.name for p in held.iterdir()} == {"rank-0", "rank-1"}, START_BOUND,
                     lambda: f"both ranks in the held check (there: {sorted(p.name for p in held.iterdir())})")
        os.kill(proc.pid, signal.SIGHUP)
        return finish(proc, 120)
    return job


def _sigterm_through_torchrun(d: Path) -> Callable[[], Result]:
    """SIGTERM to `torchrun -m ddp_doctor run` of rank1_sleeps.py once both ranks are held there."""
    def job() -> Result:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "ddp_doctor", "run", "--skip", "communication", str(SCRIPTS / "rank1_sleeps.py")]
        proc = stops.start(cmd, clean_env(DDP_DOCTOR_RUN_DIR=str(d / "runs")), str(d))
        with ended_if_it_fails(proc):
            wait_until_stuck(d, pattern="runs")
        os.kill(proc.pid, signal.SIGTERM)
        return finish(proc, 120)
    return job


@pytest.fixture(scope="module")
def signalled(tmp_path_factory, launches) -> dict[str, Any]:
    """Every launch of this module at once, each signalled once its processes are where the test
    needs them; the SIGINT case is the shared launch that test_stops_e2e.py also reads."""
    base = tmp_path_factory.mktemp("signals")
    dirs = {name: base / name for name in ("sigterm", "sighup_preflight", "torchrun_sigterm")}
    for d in dirs.values():
        d.mkdir()
    got = launches.get(SIGINT_TWICE, own={"sigterm": _sigterm_to_run(dirs["sigterm"]),
                                          "sighup_preflight": _sighup_to_preflight(dirs["sighup_preflight"]),
                                          "torchrun_sigterm": _sigterm_through_torchrun(dirs["torchrun_sigterm"])})
    return {"dirs": dirs, "results": got}


def assert_interrupted_where_the_ranks_were(res: Result, rep: dict, sig: signal.Signals) -> None:
    assert res.rc == 128 + sig, res.output[-3000:]
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


def test_sigterm_to_run_reports_where_the_ranks_were(signalled):
    d = signalled["dirs"]["sigterm"]
    res = result_of(signalled["results"], "sigterm")
    assert_interrupted_where_the_ranks_were(res, load_json(str(d / "r.json")), signal.SIGTERM)
    assert_none_left(d)


def test_sigint_to_run_reports_where_the_ranks_were(signalled):
    """The shared launch: a second SIGINT came while its report was written (test_stops_e2e.py
    checks that); the report is the first's, as with one."""
    launched = signalled["results"][SIGINT_TWICE]
    assert_interrupted_where_the_ranks_were(launched.result.res, launched.report(), signal.SIGINT)
    assert_none_left(launched.dir)


def test_sighup_to_a_self_launched_preflight_is_reported_as_interrupted(signalled):
    d = signalled["dirs"]["sighup_preflight"]
    res = result_of(signalled["results"], "sighup_preflight")
    assert res.rc == 128 + signal.SIGHUP, res.output
    rep = load_json(str(d / "r.json"))
    assert rep["status"] == "interrupted" and rep["interrupted"]["signal"] == "SIGHUP"
    assert rep["root_cause"]["id"] == "DDP808"
    # the ranks the stop ended are its consequences, not errors of their own; the launcher the
    # parent ended prints no traceback of torch's
    lost = [f for f in rep["findings"] if f["id"] == "DDP003"]
    assert lost and all(f.get("caused_by") == "DDP808" for f in lost), rep["findings"]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert_none_left(d)


def test_sigterm_through_torchrun_each_rank_reports_where_it_was(signalled):
    """SageMaker's StopTrainingJob under the toolkit's torchrun: torchrun forwards SIGTERM to the
    ranks of `torchrun -m ddp_doctor run`; each still writes its report (rank 0's names the cause
    from its node's ledgers) before it exits 143."""
    d = signalled["dirs"]["torchrun_sigterm"]
    res = result_of(signalled["results"], "torchrun_sigterm")
    assert "stopped by SIGTERM" in res.stderr, res.output
    rep = load_json(str(d / "ddp-doctor-report.json"))
    assert rep["status"] == "interrupted", (rep["findings"], res.stderr[-3000:])
    assert rep["interrupted"]["signal"] == "SIGTERM"
    assert rep["root_cause"]["id"] == "DDP891" and rep["root_cause"]["ranks"] == [1], rep["findings"]
    stopped = [f for f in rep["findings"] if f["id"] == "DDP808"]
    assert stopped and "rank1_sleeps.py:10" in stopped[0]["message"]
    assert_none_left(d)
