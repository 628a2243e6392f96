"""Every stop reported, once, whatever its timing, on real processes:

- the elastic agent (`ddp-doctor run --nproc-per-node 2`'s launcher) sent SIGTERM: an
  "interrupted" report that names the launcher, exit 143 (it was "pass");
- the agent killed (SIGKILL): a "fail" report (DDP810), exit 137, and no rank trains on (it was
  "pass", exit 247, both ranks orphaned and training);
- two SIGINTs to `ddp-doctor run` (its ranks held in rank1_sleeps.py), the second while the
  report is being written (its S3 upload held by the test): one whole report, exit 130, the second
  noted (it was: no report, or one cut short); a launch shared with test_signals_e2e.py
  (helpers/launches.py), which reads the report of its first SIGINT;
- one process (`ddp-doctor run script.py`) sent SIGTERM, SIGHUP or SIGINT: "interrupted", where it
  was, exit 128 + N (it was the preflight's "pass"); run to its end, it passes.

Each signal is sent once the processes are where the test needs them (heartbeats, a line on
stderr, the upload arriving, the signal seen pending), never after a sleep."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import stops
from helpers.launches import ended_if_it_fails, ranks_ended
from helpers.procs import (
    DDP,
    Result,
    clean_env,
    finish,
    load_json,
    result_of,
    wait_for,
)

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
TRAINS, ALONE = "trains_until_stopped.py", "alone_until_stopped.py"
START_BOUND = 240  # seconds for a launch to reach its script: only ends a wait that never would
# SIGINT to `ddp-doctor run`, then a second one while the report's upload is held: a shared launch
# (helpers/launches.py) whose first SIGINT test_signals_e2e.py also reads
TWO_SIGINTS = "sigint_twice_while_stuck"


@dataclass
class Stopped:
    res: Result
    report: dict[str, Any] | None
    ranks: dict[int, dict[str, Any]]  # rank -> its heartbeat when the signal was sent
    seen: dict[str, Any] = field(default_factory=dict)

    def finding(self, cid: str) -> dict[str, Any]:
        found = [f for f in (self.report or {}).get("findings", []) if f["id"] == cid]
        assert found, (cid, self.report, self.res.stderr[-3000:])
        return found[0]


def _report(path: Path) -> dict[str, Any] | None:
    try:
        return load_json(str(path))
    except (OSError, ValueError):
        return None


def _run_cmd(d: Path) -> list[str]:
    return [*DDP, "run", "--skip", "communication", "--nproc-per-node", "2", "--timeout", "30", "--run-dir",
            str(d / "runs"), "--report", str(d / "r.json"), str(SCRIPTS / TRAINS)]


def _start_training(d: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], dict[int, dict[str, Any]]]:
    d.mkdir()
    proc = stops.start(_run_cmd(d), env, str(d))
    with ended_if_it_fails(proc):
        hbs = wait_for(lambda: stops.training(d / "runs", 2, TRAINS), START_BOUND,
                       lambda: f"both ranks training; heartbeats: {stops.heartbeats(d / 'runs')}")
    return proc, hbs


def _signal_the_agent(base: Path, sig: signal.Signals):
    def job() -> Stopped:
        d = base / f"agent-{sig.name}"
        proc, hbs = _start_training(d, clean_env())
        with ended_if_it_fails(proc):
            agent = wait_for(lambda: stops.child_running(proc.pid, "ddp_doctor.training.run.agent"), 30,
                             "the launcher (torch's elastic agent)")
        agent.send_signal(sig)
        res = finish(proc, 120)
        ranks_ended(hbs)
        return Stopped(res, _report(d / "r.json"), hbs, {"agent": agent.pid})
    return job


def _alone(base: Path, sig: signal.Signals | None):
    """One process, no launcher: the script stopped by `sig` once it runs (None: it ends itself)."""
    def job() -> Stopped:
        d = base / f"alone-{sig.name if sig else 'ends'}"
        (d / "runs").mkdir(parents=True)
        env = clean_env(TMPDIR=str(d / "runs"), MARKER_DIR=str(d))
        script = SCRIPTS / (ALONE if sig else "writes_marker.py")
        proc = stops.start([*DDP, "run", "--skip", "communication", "--report", str(d / "r.json"), str(script)], env,
                            str(d))
        hbs: dict[int, dict[str, Any]] = {}
        if sig is not None:
            with ended_if_it_fails(proc):
                hbs = wait_for(lambda: stops.training(d / "runs", 1, ALONE), START_BOUND,
                               lambda: f"the script running; heartbeats: {stops.heartbeats(d / 'runs')}")
            os.kill(proc.pid, sig)
        res = finish(proc, 120)
        return Stopped(res, _report(d / "r.json"), hbs)
    return job


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, launches):
    base = tmp_path_factory.mktemp("stops")
    return launches.get(TWO_SIGINTS, own={
        "agent-term": _signal_the_agent(base, signal.SIGTERM),
        "agent-kill": _signal_the_agent(base, signal.SIGKILL),
        "alone-term": _alone(base, signal.SIGTERM),
        "alone-hup": _alone(base, signal.SIGHUP),
        "alone-int": _alone(base, signal.SIGINT),
        "alone-ends": _alone(base, None),
    }, at_once=4)


def test_sigterm_to_the_launcher_is_an_interrupted_job(stopped):
    s = result_of(stopped, "agent-term")
    assert s.res.rc == 128 + signal.SIGTERM, s.res.output[-3000:]
    assert s.report["status"] == "interrupted", s.report
    assert s.report["interrupted"]["signal"] == "SIGTERM"
    assert s.report["interrupted"]["to"] == f"the launcher (torch's elastic agent, pid {s.seen['agent']})"
    stop = s.finding("DDP808")
    assert stop["ranks"] == [0, 1]
    assert f"to the launcher (torch's elastic agent, pid {s.seen['agent']})" in stop["message"]
    assert TRAINS in stop["message"]  # where each rank was: the parent took their stacks first
    assert "taking the ranks' stacks" in s.res.stderr


def test_a_killed_launcher_fails_the_job_and_takes_its_ranks_with_it(stopped):
    s = result_of(stopped, "agent-kill")  # _ranks_ended: no rank outlived it
    assert s.res.rc == 128 + signal.SIGKILL, s.res.output[-3000:]
    assert s.report["status"] == "fail", s.report
    ended = s.finding("DDP810")
    assert s.report["root_cause"]["id"] == "DDP810" and ended["ranks"] == [0, 1]
    assert f"pid {s.seen['agent']}) was killed by SIGKILL while ranks 0-1 were training" in ended["message"]
    assert TRAINS in ended["message"]


def test_a_second_sigint_while_the_report_is_written_is_noted_and_the_report_stays_whole(stopped):
    launched = stopped[TWO_SIGINTS]
    got = launched.result
    s = Stopped(got.res, _report(launched.report_path), got.ranks, {"held": got.held, "body": got.uploaded})
    assert s.seen["held"], f"the second SIGINT ended the parent at once: rc {s.res.rc}\n{s.res.stderr[-3000:]}"
    assert s.res.rc == 128 + signal.SIGINT, s.res.output[-3000:]
    assert s.report["status"] == "interrupted" and s.report["interrupted"]["signal"] == "SIGINT"
    assert s.finding("DDP808")["ranks"] == [0, 1]
    uploaded = json.loads(s.seen["body"])  # the S3 copy is the whole report, its upload not cut short
    assert uploaded["status"] == "interrupted" and uploaded["findings"] == s.report["findings"]
    assert "could not upload" not in s.res.stderr
    assert "arrived while the report was written; it was written first" in s.res.stderr
    assert s.res.stderr.count("ddp-doctor training: INTERRUPTED") == 1  # one report, never a second


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_one_process_stopped_is_interrupted_with_where_it_was(stopped, sig):
    s = result_of(stopped, f"alone-{sig.name[3:].lower()}")
    assert s.res.rc == 128 + sig, s.res.output[-3000:]
    assert s.report["status"] == "interrupted" and s.report["interrupted"]["signal"] == sig.name, s.report
    stop = s.finding("DDP808")
    assert f"stopped by {sig.name}. rank 0: {SCRIPTS / ALONE}:" in stop["message"], stop["message"]
    assert ALONE in stop["evidence"]["stacks"]["0"]  # its stack
    if sig == signal.SIGINT:  # the script got its KeyboardInterrupt, as under `python SCRIPT`
        assert "KeyboardInterrupt" in s.res.stderr


def test_one_process_run_to_its_end_passes(stopped):
    s = result_of(stopped, "alone-ends")
    assert s.res.rc == 0, s.res.output[-3000:]
    assert s.report["status"] == "pass" and "interrupted" not in s.report
