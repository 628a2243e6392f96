"""A run never hangs, never loses its report, never loses the root-cause rank's exit status, on
real processes:

- `ddp-doctor run --nproc-per-node 2` whose launcher (torch's elastic agent) is stopped with
  SIGSTOP while its ranks finish: the parent ends the launcher once it makes no progress after the
  ranks ended, writes the report and exits with the ranks' status (it was: `run` never ended);
- `torchrun -m ddp_doctor run` sent SIGTERM once the ranks train (SageMaker's StopTrainingJob):
  torchrun ends within its grace, and rank 0 leaves the job's report as "interrupted" with where
  each rank was (it was: the preflight's "running", under load);
- rank 1 `os._exit(7)` mid-training, launches at once: each exits 7, rank 1's own status (it was:
  sometimes 1, rank 0's lost-peer error);
- `ddp-doctor run` sent SIGTERM during its preflight: DDP808 names each rank's preflight stage
  (it was: "interrupted" without where the ranks were).

Each signal is sent once the processes are where the test needs them (heartbeats, the launcher's
process seen), never after a sleep; every wait is bounded. The stopped launcher spends most of its
time waiting out the parent's bound on a launcher that outlives its ranks (30 s, the product's own),
so a module fixture starts the os._exit(7) launches beside it; the SIGTERM tests, whose launchers
must end within a grace, run alone."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Callable

import pytest
from helpers import stops
from helpers.procs import (
    DDP,
    Launch,
    clean_env,
    ddp_with_bounds,
    finish,
    kill_tree,
    load_json,
    result_of,
    run_all,
    wait_for,
)

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
START_BOUND = 240  # seconds for a launch to reach its script: only ends a wait that never would


def _ended_or_killed(proc, what: str):
    """A wait that fails ends the launch (its whole tree) and says what it printed."""
    from contextlib import contextmanager

    @contextmanager
    def guard():
        try:
            yield
        except BaseException as e:  # noqa: BLE001 - any failed wait: end the launch, show its output
            kill_tree(proc.pid)
            try:
                out, err = proc.communicate(timeout=30)
            except Exception:  # noqa: BLE001 - the output is only for the message
                out, err = "", "(output lost)"
            raise AssertionError(f"{what}: {e}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}") from None
    return guard()


def _flat_beats(runs: Path) -> dict:
    import json
    out = {}
    for p in runs.glob("hb-*.json"):
        try:
            hb = json.loads(p.read_text())
            out[int(hb["rank"])] = hb
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _training(runs: Path, n: int, script: str, flat: bool = False):
    hbs = _flat_beats(runs) if flat else stops.heartbeats(runs)
    inside = {r: hb for r, hb in hbs.items() if hb.get("phase") == "training" and script in (hb.get("where") or "")}
    return inside if len(inside) == n else None


def _stopped_launcher(tmp_path: Path) -> Callable[[], dict]:
    """`ddp-doctor run` whose launcher is stopped (SIGSTOP) once both ranks wait for go, then told
    go. The launch starts here, on the fixture's thread (stops.start's preexec_fn is not safe while
    other threads run); the job returned, for procs.run_all, does the rest and returns the launch's
    result, the launcher and the ranks' heartbeats."""
    script = "each_rank_waits_for_go.py"
    go = tmp_path / "go-"
    # the parent's 30 s for the launcher's exit, shortened: what happens at the bound is the subject
    cmd = [*ddp_with_bounds(LAUNCHER_EXIT_BOUND=3.0), "run", "--skip", "communication", "--nproc-per-node", "2",
           "--hang-timeout", "15", "--timeout", "30",
           "--run-dir", str(tmp_path / "runs"), "--report", str(tmp_path / "r.json"), str(SCRIPTS / script)]
    proc = stops.start(cmd, clean_env(GO_FILE=str(go)), str(tmp_path))
    return lambda: _stop_the_launcher(proc, tmp_path, script, go)


def _stop_the_launcher(proc, tmp_path: Path, script: str, go: Path) -> dict:
    agent = None
    with _ended_or_killed(proc, "the launch"):
        agent = wait_for(lambda: stops.child_running(proc.pid, "ddp_doctor.training.run.agent"), START_BOUND,
                         "the launcher (torch's elastic agent)")
        hbs = wait_for(lambda: _training(tmp_path / "runs", 2, script), START_BOUND,
                       lambda: f"both ranks waiting for go; heartbeats: {stops.heartbeats(tmp_path / 'runs')}")
        agent.send_signal(signal.SIGSTOP)
        for r in (0, 1):
            Path(f"{go}{r}").touch()
    try:
        res = finish(proc, 180)  # an overrun (the parent waiting for ever on its launcher) fails the test
    finally:
        try:  # never leave a stopped process behind, whatever happened
            agent.send_signal(signal.SIGCONT)
            agent.kill()
        except Exception:  # noqa: BLE001 - gone, as it should be
            pass
    return {"res": res, "agent": agent, "hbs": hbs}


@pytest.fixture(scope="module")
def ends(tmp_path_factory):
    """The stopped launcher and the os._exit(7) launches, started together (procs.run_all)."""
    base = tmp_path_factory.mktemp("ends")
    (base / "stopped").mkdir()
    jobs: dict = {"stopped": _stopped_launcher(base / "stopped")}  # the longest first
    # rank 1's os._exit(7) twice, at once and beside the stopped launcher's start: the load under
    # which rank 0's lost-peer exit 1 was sometimes recorded first; each launch must exit 7
    for i in range(2):
        d = base / f"job{i}"
        d.mkdir()
        jobs[f"job{i}"] = Launch([*DDP, "run", "--skip", "communication", "--nproc-per-node", "2", "--timeout", "60",
                                  "--report", str(d / "r.json"), str(SCRIPTS / "rank1_os_exit_7.py")],
                                 clean_env(), str(d), timeout=300)
    return base, run_all(jobs, at_once=3)


def test_a_stopped_launcher_after_its_ranks_ended_is_ended_and_the_report_written(ends):
    base, done = ends
    got = result_of(done, "stopped")
    res, agent, hbs = got["res"], got["agent"], got["hbs"]
    assert res.rc == 0, res.output
    assert "had not exited" in res.stderr and "after its ranks ended" in res.stderr, res.stderr[-3000:]
    rep = load_json(str(base / "stopped" / "r.json"))
    assert rep["status"] in ("pass", "warn"), rep["findings"]
    assert not stops.alive(agent.pid)
    assert stops.group_gone([int(hb["pid"]) for hb in hbs.values()])


def test_sigterm_to_torchrun_ends_it_within_its_grace_with_an_interrupted_report(tmp_path):
    script = "trains_until_stopped.py"
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ddp_doctor", "run", "--skip", "communication", str(SCRIPTS / script)]
    proc = stops.start(cmd, clean_env(DDP_DOCTOR_RUN_DIR=str(runs)), str(tmp_path))
    with _ended_or_killed(proc, "torchrun"):
        # as soon as both ranks run the script (torch may still be importing in DDP's constructor)
        hbs = wait_for(lambda: _training(runs, 2, script, flat=True), START_BOUND,
                       lambda: f"both ranks training; heartbeats: {_flat_beats(runs)}")
    os.kill(proc.pid, signal.SIGTERM)
    # torchrun SIGKILLs what is alive 30 s after its SIGTERM; the bound leaves room for a loaded host
    res = finish(proc, 120)
    rep = load_json(str(tmp_path / "ddp-doctor-report.json"))
    assert rep["status"] == "interrupted", (rep["status"], res.stderr[-4000:])
    assert rep["interrupted"]["signal"] == "SIGTERM"
    stopped = [f for f in rep["findings"] if f["id"] == "DDP808"]
    assert stopped and stopped[0]["ranks"] == [0, 1], rep["findings"]
    assert "rank 0:" in stopped[0]["message"] and "rank 1:" in stopped[0]["message"]
    assert stops.group_gone([int(hb["pid"]) for hb in hbs.values()])


def test_a_rank_that_os_exits_7_gives_the_job_its_status_every_time(ends):
    base, done = ends
    for name in ("job0", "job1"):
        res = result_of(done, name)
        rep = load_json(str(base / name / "r.json"))
        assert res.rc == 7, (name, res.rc, [(f["id"], f["ranks"], f["message"][:200]) for f in rep["findings"]])
        assert 1 in rep["root_cause"]["ranks"], rep["root_cause"]


def test_sigterm_during_the_preflight_of_run_says_where_each_rank_was(tmp_path):
    """SIGTERM to `ddp-doctor run` while its preflight's ranks are held in the local checks (a test
    check, tests/plugins/held_check.py, holds them and says so): DDP808 names each rank's stage."""
    held = tmp_path / "held"
    held.mkdir()
    root = Path(__file__).resolve().parents[2]
    env = clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.held_check", PYTHONPATH=str(root),
                    HELD_CHECK_DIR=str(held), MARKER_DIR=str(tmp_path))
    cmd = [*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", "--run-dir", str(tmp_path / "runs"),
           "--report", str(tmp_path / "r.json"), str(SCRIPTS / "writes_marker.py")]
    proc = stops.start(cmd, env, str(tmp_path))
    with _ended_or_killed(proc, "the launch"):
        wait_for(lambda: {p.name for p in held.iterdir()} >= {"rank-0", "rank-1"}, START_BOUND,
                 lambda: f"both ranks in the held check (there: {sorted(p.name for p in held.iterdir())})")
    os.kill(proc.pid, signal.SIGTERM)
    res = finish(proc, 120)
    assert res.rc == 128 + signal.SIGTERM, res.output
    rep = load_json(str(tmp_path / "r.json"))
    assert rep["status"] == "interrupted" and rep["interrupted"]["signal"] == "SIGTERM"
    stopped = [f for f in rep["findings"] if f["id"] == "DDP808"]
    assert stopped and stopped[0]["ranks"] == [0, 1], rep["findings"]
    for r in (0, 1):
        assert f"rank {r}: in the preflight, stage local_checks" in stopped[0]["message"], stopped[0]["message"]
    assert not list(tmp_path.glob("ran-*"))  # the script never ran
