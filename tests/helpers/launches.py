"""The session's catalogue of shared launches: a scenario that several test modules read is named
here once (its command, environment and directory layout) and launched once a session.

The session fixture `launches` (registered by tests/conftest.py) hands out a Catalogue. A module
fixture asks it for the scenarios its tests read, with the module's own launches beside them:

    got = launches.get("sigint_twice_while_stuck", own={"mine": Launch(...)})

A scenario no earlier module asked for is launched then, together with `own`, `at_once` at a time
(helpers.procs.run_all); one launched before is handed over as it was. Lazily: a module run alone
launches only what it asks for. Each scenario is a Launched: the launch's outcome (a procs.Result,
or the scenario's own record of a launch it drove), its directory (the launch's cwd: its report,
the evidence file beside it, its run directory when the scenario keeps one). What a launch raised
(an overrun, a survivor, a skip) is kept in its place and raised by each test that reads it.

Shared means read-only: every asker reads the same files. A test that changes them (deletes,
corrupts, writes beside them) works on a copy (Launched.copy).

Under pytest-xdist each worker is a session of its own with its own catalogue: the modules that
read a scenario (its `readers`) are one xdist group (tests/helpers/schedule.py), so one worker
runs them all and launches it once.

The scenarios, and the modules that read each:
- sigint_twice_while_stuck: `ddp-doctor run` of rank1_sleeps.py, SIGINT once both ranks are held
  where the script keeps them, a second SIGINT while the report's S3 upload is held by the test
  (tests/training/test_signals_e2e.py: the report of a SIGINT; tests/training/test_stops_e2e.py:
  the second SIGINT, the report whole).
- two_torchrun_jobs: two `torchrun -m ddp_doctor run` jobs at once on one host, both run ids
  "none"; job B's rank 1 raises while job A's ranks wait for the test
  (tests/training/test_two_jobs_one_host_e2e.py: each job's records its own;
  tests/training/test_run_e2e.py: torchrun's failure summary of job B names the root cause).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pytest

from helpers.procs import (
    DDP,
    Launch,
    Result,
    clean_env,
    finish,
    free_port,
    kill_tree,
    load_json,
    run_all,
    start,
    wait_for,
    wait_for_line,
)
from helpers.stops import heartbeats

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "run_scripts"
START_BOUND = 240.0  # s for a launch to reach its script on a loaded 2-core machine: ends only a wait that never would


@dataclass(frozen=True)
class Scenario:
    """One shared launch. `job(directory)` gives what run_all runs in that (new, empty) directory:
    a Launch, or a callable that drives the launch itself and returns its own record of it.
    `report` and `runs` name the report and the kept run directories' parent, in the directory.
    `readers`: the test modules that ask for it (paths under tests/), run by one xdist worker."""
    about: str
    job: Callable[[Path], Launch | Callable[[], Any]]
    readers: tuple[str, ...]
    report: str | None = "r.json"
    runs: str | None = None


@dataclass
class Launched:
    """A scenario as launched: the same object for every asker of the session."""
    name: str
    dir: Path
    outcome: Any  # what the launch returned, or what it raised
    scenario: Scenario

    @property
    def result(self) -> Any:
        """The launch's Result (or its record); raises what the launch raised."""
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    @property
    def report_path(self) -> Path:
        assert self.scenario.report, f"{self.name} names no report"
        return self.dir / self.scenario.report

    @property
    def evidence_path(self) -> Path:
        """The evidence file written beside the report (X.json -> X.evidence.json)."""
        return self.report_path.with_name(self.report_path.name[: -len(".json")] + ".evidence.json")

    def report(self) -> dict[str, Any]:
        _ = self.result  # a launch that failed fails its reader with why, not with a missing file
        return load_json(str(self.report_path))

    @property
    def run_dirs(self) -> list[Path]:
        """The run directories the launch kept (its --run-dir's ddp-doctor-run-*)."""
        assert self.scenario.runs, f"{self.name} keeps no run directory"
        return sorted((self.dir / self.scenario.runs).glob("ddp-doctor-run-*"))

    def copy(self, dest: Path) -> Path:
        """A copy of the launch's directory at `dest`, for a test that changes the files."""
        shutil.copytree(self.dir, dest, symlinks=True)
        return dest


class Catalogue:
    """The session's launches: each scenario launched the first time a module asks for it."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._root: Path | None = None
        self._done: dict[str, Launched] = {}

    def get(self, *names: str, own: Mapping[str, Launch | Callable[[], Any]] | None = None,
            at_once: int = 3) -> dict[str, Any]:
        """name -> Launched for each of `names`, and what run_all gives for each of the module's own
        launches `own` (its result, or what it raised): those not launched yet start together, the
        scenarios first."""
        own = dict(own or {})
        unknown = [n for n in names if n not in SCENARIOS]
        assert not unknown, f"no such scenario: {unknown} (helpers/launches.py names {sorted(SCENARIOS)})"
        clash = set(names) & set(own)
        assert not clash, f"a module's own launch named as a scenario: {sorted(clash)}"
        asker = Path(sys._getframe(1).f_globals.get("__file__") or "?").resolve()
        module = asker.relative_to(ROOT / "tests").as_posix() if asker.is_relative_to(ROOT / "tests") else str(asker)
        strangers = [n for n in names if module not in SCENARIOS[n].readers]
        assert not strangers, f"{module} is not among the readers of {strangers}: add it there (one xdist group)"
        todo = [n for n in dict.fromkeys(names) if n not in self._done]
        dirs = {n: self._dir(n) for n in todo}
        got = run_all({**{n: SCENARIOS[n].job(dirs[n]) for n in todo}, **own}, at_once=at_once)
        for n in todo:
            self._done[n] = Launched(n, dirs[n], got.pop(n), SCENARIOS[n])
        return {**got, **{n: self._done[n] for n in names}}

    def _dir(self, name: str) -> Path:
        if self._root is None:
            self._root = self._factory.mktemp("launches")
        d = self._root / name
        d.mkdir()
        return d


@pytest.fixture(scope="session")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Catalogue:
    """The session's catalogue of shared launches (helpers/launches.py)."""
    return Catalogue(tmp_path_factory)


# What the scenarios wait on and check, also used by the modules that read them.

def stuck_in_rank1_sleeps(run_parent: Path, pattern: str = "*") -> bool:
    """Both ranks where rank1_sleeps.py keeps them, each seen there by its watchdog on two samples
    in a row (its stack unchanged since the sample before: blocked there): rank 1 in its sleep
    (line 9), rank 0 inside the all_reduce (line 10) that waits for rank 1."""
    hbs = heartbeats(run_parent, pattern)

    def held(hb: dict | None, line: int) -> bool:
        return bool(hb) and hb.get("phase") == "training" and f"rank1_sleeps.py:{line} in" in (hb.get("where") or "") \
            and float(hb.get("time") or 0) > float(hb.get("last_progress") or 0)

    return len(hbs) == 2 and held(hbs.get(1), 9) and held(hbs.get(0), 10) and bool(hbs[0].get("in_collective"))


def wait_until_stuck(run_parent: Path, pattern: str = "*") -> dict[int, dict[str, Any]]:
    """The heartbeats once both ranks of rank1_sleeps.py are held (stuck_in_rank1_sleeps)."""
    wait_for(lambda: stuck_in_rank1_sleeps(run_parent, pattern), START_BOUND,
             lambda: f"rank 1 in its sleep and rank 0 in the all_reduce; heartbeats: {heartbeats(run_parent, pattern)}")
    return heartbeats(run_parent, pattern)


@contextmanager
def ended_if_it_fails(*procs: subprocess.Popen[str]) -> Iterator[None]:
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


def ranks_ended(hbs: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """The ranks' pids once none is alive; at the bound the survivors are killed and the caller fails."""
    from helpers import stops
    pids = [int(hb["pid"]) for hb in hbs.values()]
    try:
        wait_for(lambda: stops.group_gone(pids), 30, lambda: f"ranks {pids} to end")
    except AssertionError:
        alive = [p for p in pids if stops.alive(p)]
        stops.kill_all(alive)
        raise AssertionError(f"ranks outlived the job (orphans still running): {alive}") from None
    return pids


# The scenarios.

@dataclass
class Signalled:
    """What sigint_twice_while_stuck saw: the launch's result (its stderr from the start, the line
    read before the second signal included), each rank's heartbeat when the first SIGINT was sent,
    whether the second was held (pending) while the report was written, and the report's upload."""
    res: Result
    ranks: dict[int, dict[str, Any]]
    held: bool
    uploaded: bytes


def _sigint_twice_while_stuck(d: Path) -> Callable[[], Signalled]:
    def job() -> Signalled:
        from helpers import stops
        pytest.importorskip("boto3")  # the report's S3 upload, held by the test, is when the second SIGINT comes
        upload = stops.HeldUpload()
        try:
            cmd = [*DDP, "run", "--skip", "communication", "--nproc-per-node", "2", "--timeout", "30", "--run-dir",
                   str(d / "runs"), "--report", str(d / "r.json"), str(SCRIPTS / "rank1_sleeps.py")]
            proc = stops.start(cmd, clean_env(**upload.env("s3://reports/stops/")), str(d))
            with ended_if_it_fails(proc):
                hbs = wait_until_stuck(d / "runs")
                os.kill(proc.pid, signal.SIGINT)
                said = wait_for_line(proc.stderr, r"SIGINT from pid \d+.*taking the ranks' stacks", 120)
                wait_for(upload.received.is_set, 120, "the report's upload to start")
                os.kill(proc.pid, signal.SIGINT)  # while the report is being written
                wait_for(lambda: stops.pending(proc.pid, signal.SIGINT) or proc.poll() is not None, 30,
                         "the second SIGINT to be pending")
                held = stops.pending(proc.pid, signal.SIGINT)
            upload.release()
            res = finish(proc, 120)
            res.stderr = said + res.stderr
            ranks_ended(hbs)
            return Signalled(res, hbs, held, upload.body)
        finally:
            upload.close()
    return job


def _torchrun(port: int, report: str, script: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--master-port", str(port), "-m", "ddp_doctor", "run", "--skip", "communication",
            "--report", report, str(SCRIPTS / script)]


def _ranks_of(agent_pid: int) -> dict[str, int]:
    """RANK -> pid of a torchrun agent's workers (its children)."""
    import psutil
    out = {}
    try:
        for child in psutil.Process(agent_pid).children():
            rank = child.environ().get("RANK")
            if rank is not None:
                out[rank] = child.pid
    except psutil.Error:
        return {}
    return out


def _two_torchrun_jobs(base: Path) -> Callable[[], dict[str, Any]]:
    """Job A (each_rank_waits_for_go.py) and job B (rank1_raises.py), no --standalone: both run ids
    are torchrun's default "none". Once B has ended, A's rank 0 is let go, A's report read while
    A's rank 1 still runs, then A's rank 1 let go. The record: each job's Result ("a", "b") and
    report ("a_report", "b_report"), A's report while its rank 1 ran, the run directories in
    the jobs' TMPDIR."""
    def job() -> dict[str, Any]:
        from ddp_doctor.training.run.ledger import process_gone
        for d in ("a", "b", "tmp"):
            (base / d).mkdir()
        env = clean_env(TMPDIR=str(base / "tmp"), GO_FILE=str(base / "go"))
        a = start(_torchrun(free_port(), "a.json", "each_rank_waits_for_go.py"), env, str(base / "a"))
        b = start(_torchrun(free_port(), "b.json", "rank1_raises.py"), env, str(base / "b"))
        try:
            ranks = wait_for(lambda: len(_ranks_of(a.pid)) == 2 and _ranks_of(a.pid), START_BOUND,
                             "job A's two ranks")
            res_b = finish(b, 150)  # B's rank 1 failed and B ended: its records are all written
            (base / "go0").touch()  # A's rank 0 ends well; A's rank 1 still runs
            wait_for(lambda: process_gone(ranks["0"]), 120, "job A's rank 0 to end")
            while_running = load_json(str(base / "a" / "a.json"))
            (base / "go1").touch()
            res_a = finish(a, 120)
        finally:
            for p in (a, b):
                if p.poll() is None:
                    kill_tree(p.pid)
        return {"a": res_a, "b": res_b, "a_while_running": while_running,
                "a_report": load_json(str(base / "a" / "a.json")), "b_report": load_json(str(base / "b" / "b.json")),
                "run_dirs": sorted(p.name for p in (base / "tmp").iterdir() if p.name.startswith("ddp-doctor-run-"))}
    return job


SCENARIOS: dict[str, Scenario] = {
    "sigint_twice_while_stuck": Scenario(
        "SIGINT to `ddp-doctor run` of rank1_sleeps.py once both ranks are held, a second one while the "
        "report's upload is held (record: Signalled)", _sigint_twice_while_stuck,
        ("training/test_signals_e2e.py", "training/test_stops_e2e.py"), runs="runs"),
    "two_torchrun_jobs": Scenario(
        "two torchrun jobs at once on one host, run ids both \"none\": A waits for the test, B's rank 1 "
        "raises (record: a dict, _two_torchrun_jobs)", _two_torchrun_jobs,
        ("training/test_two_jobs_one_host_e2e.py", "training/test_run_e2e.py"), report=None),
}
