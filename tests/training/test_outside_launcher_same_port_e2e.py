"""Two hand-launched jobs, one after the other, on one MASTER_PORT: the second never inherits the
first's failure.

Ranks started by hand (`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`, each `python -m ddp_doctor
run SCRIPT`) find their run directory by MASTER_ADDR and MASTER_PORT (training/run/run_dir.py), so
both jobs share one, in one working directory and one TMPDIR. Job 1 passes `rank=0` by hand on
every rank (DDP867, the ranks wait in init until the hang bound ends them); job 2 is correct and
starts once job 1's processes are all gone. Job 1's init_process_group records stay in the
directory: their job token (records.join_job) is what keeps them out of job 2's verdict.

The records' time bound (records.SAME_JOB) alone keeps them apart when job 2 starts late enough;
a job that failed at init a moment before the next one started leaves calls inside it. Job 1's
calls are dated to job 2's start (once job 2's ranks are up: their heartbeats) so that only the
token can tell them apart, whatever the machine's load. Real processes; one launch, read by each
test (module fixture).
"""
from __future__ import annotations

import glob
import json
import os
import time
from pathlib import Path

import pytest
from helpers.procs import (
    DDP,
    TIMING_WARNINGS,
    clean_env,
    finish,
    free_port,
    ids,
    kill_tree,
    load_json,
    run_ranks,
    start,
    wait_for,
)

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
START_BOUND = 180.0  # interpreters importing torch on a loaded 2-core machine
JOB1_ERRORS = {"DDP867", "DDP821", "DDP801"}  # job 1's cause and its consequences (one rank could not host)


def _args(*extra: str) -> list[str]:
    return ["run", "--skip", "communication", "--timeout", "30", *extra, "--report", "r.json"]


def _run_dir(tmp: Path, port: int) -> Path:
    [found] = glob.glob(str(tmp / f"ddp-doctor-run-127.0.0.1-{port}-*"))
    return Path(found)


def _calls(run_dir: Path) -> dict[int, dict]:
    out = {}
    for p in glob.glob(str(run_dir / "init-*.json")):
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
        out[int(d["pid"])] = d
    return out


def _date_to_now(run_dir: Path, pids: set[int]) -> None:
    """Job 1's init calls, dated now (job 2's ranks are running): inside job 2's time bound."""
    for pid in pids:
        path = run_dir / f"init-{pid}.json"
        d = json.loads(path.read_text(encoding="utf-8"))
        d["time"] = time.time()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(d), encoding="utf-8")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)


def _beating(run_dir: Path, pids: set[int]) -> bool:
    """Every rank of job 2 has its heartbeat in the run directory (its watchdog runs: the rank's
    start time, which bounds the records it reads, is taken)."""
    seen = set()
    for p in glob.glob(str(run_dir / "hb-*.json")):
        try:
            seen.add(int(json.loads(Path(p).read_text(encoding="utf-8"))["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return pids <= seen


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("same_port")
    (base / "tmp").mkdir()
    port = free_port()
    env = clean_env(TMPDIR=str(base / "tmp"))
    # job 1: every rank passes rank=0; the hang bound ends the rank left waiting in init
    first = run_ranks(2, _args("--hang-timeout", "3") + [str(SCRIPTS / "handset_rank.py")], env, str(base),
                      port=port, timeout=150)
    first_report = load_json(str(base / "r.json"))
    run_dir = _run_dir(base / "tmp", port)
    first_calls = _calls(run_dir)
    # job 2: correct, on the same port, in the same directories, once job 1's processes are gone
    procs = {}
    try:
        for r in range(2):
            procs[r] = start([*DDP, *_args(), str(SCRIPTS / "ok_allreduce.py")],
                             {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}, str(base))
        pids = {p.pid for p in procs.values()}
        wait_for(lambda: _beating(run_dir, pids), START_BOUND, "job 2's ranks' heartbeats")
        _date_to_now(run_dir, set(first_calls))
        second = {r: finish(p, 150) for r, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p.pid)
    return {"first": first, "first_report": first_report, "first_calls": first_calls, "run_dir": run_dir,
            "second": second, "second_report": load_json(str(base / "r.json"))}


def test_the_first_job_fails_on_its_duplicate_rank_and_leaves_its_init_calls_in_the_shared_directory(jobs):
    assert all(res.rc != 0 for res in jobs["first"].values()), {r: res.output[-2000:] for r, res in
                                                                jobs["first"].items()}
    rep = jobs["first_report"]
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP867", rep["findings"]
    calls = jobs["first_calls"]
    assert len(calls) == 2 and {c["rank_arg"] for c in calls.values()} == {0}, calls
    tokens = {c.get("job") for c in calls.values()}
    assert len(tokens) == 1 and None not in tokens, calls  # stamped with the job its preflight agreed
    # still there when job 2 ended: job 2 read the directory that holds them
    assert set(calls) <= set(_calls(jobs["run_dir"])), sorted(os.listdir(jobs["run_dir"]))


def test_the_next_correct_job_on_the_same_port_passes_with_nothing_of_the_first(jobs):
    for r, res in jobs["second"].items():
        assert res.rc == 0, (r, res.output)
        assert f"rank {r} sum 3.0" in res.stdout, (r, res.output)
    rep = jobs["second_report"]
    assert not ids(rep, "error") and ids(rep, "warning") <= TIMING_WARNINGS, rep["findings"]
    assert rep["status"] == ("warn" if ids(rep, "warning") else "pass"), rep
    assert rep["root_cause"] is None and not ids(rep) & JOB1_ERRORS, rep["findings"]
    assert "rank=0 passed" not in json.dumps(rep) and "EADDRINUSE" not in json.dumps(rep), rep["findings"]
    # the second job's own calls are what its verdict read: its ranks' own numbers
    own = {pid: c for pid, c in _calls(jobs["run_dir"]).items() if pid not in jobs["first_calls"]}
    assert len(own) == 2 and {c.get("job") for c in own.values()} != {c.get("job") for c in
                                                                      jobs["first_calls"].values()}, own
