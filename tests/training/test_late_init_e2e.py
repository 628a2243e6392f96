"""A rank late to init_process_group is the cause (DDP879), with where it was: real 2-rank gloo
jobs under `ddp-doctor run` whose rank 0's init times out (8 s) while rank 1 sleeps before init,
reads files in a loop before init, or ends without calling init; and a rank merely 2 s late,
within the timeout, that must stay clean.

The runs are started together by one module fixture (they mostly wait), then each test reads its
own run's report.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"

RUNS = {
    "sleeps": "rank1_late_to_init.py",
    "loads": "rank1_loads_before_init.py",
    "ends": "rank1_ends_before_init.py",
    "two_seconds": "rank1_init_2s_late.py",
}


def line_of(script: str, text: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if text in ln)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("late_init")
    launches = {
        name: Launch([*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", "--hang-timeout", "60",
                      "--run-dir", str(base / f"{name}-runs"), "--report", str(base / f"{name}.json"),
                      str(SCRIPTS / script)], clean_env(), str(base))
        for name, script in RUNS.items()}
    return {"base": base, "results": run_all(launches, at_once=len(launches))}


def ran(runs: dict, name: str) -> tuple:
    return result_of(runs["results"], name), load_json(str(runs["base"] / f"{name}.json"))


def _late_verdict(rep: dict) -> dict:
    cause = rep["root_cause"]
    assert cause["id"] == "DDP879" and cause["ranks"] == [1], cause
    [timeout] = [f for f in rep["findings"] if f["id"] == "DDP835"]
    assert timeout["ranks"] == [0] and timeout["caused_by"] == "DDP879"
    assert timeout["evidence"]["consequence"] is True
    return cause


def test_a_rank_asleep_before_init_is_the_cause_at_its_sleep(runs):
    res, rep = ran(runs, "sleeps")
    assert res.rc != 0
    cause = _late_verdict(rep)
    line = line_of("rank1_late_to_init.py", "time.sleep(30)")
    assert f"rank 1 was at {SCRIPTS / 'rank1_late_to_init.py'}:{line} in <module>" in cause["message"]
    assert cause["evidence"]["late"]["1"]["where"].startswith(f"{SCRIPTS / 'rank1_late_to_init.py'}:{line} ")
    assert "after init_process_group" in cause["hint"] and "timeout=" in cause["hint"]
    assert "Root cause: DDP879" in res.stderr


def test_a_rank_reading_files_in_a_loop_before_init_is_the_cause_in_its_loop(runs):
    _, rep = ran(runs, "loads")
    cause = _late_verdict(rep)
    script = "rank1_loads_before_init.py"
    first, last = line_of(script, "for i in range(60)"), line_of(script, "time.sleep(0.5)")
    where = cause["evidence"]["late"]["1"]["where"]
    path, _, rest = where.partition(":")
    assert path == str(SCRIPTS / script) and first <= int(rest.split()[0]) <= last, where


def test_a_rank_that_ends_without_init_is_the_cause(runs):
    _, rep = ran(runs, "ends")
    cause = _late_verdict(rep)
    assert "rank 1 ended (exit status 0) without calling init_process_group while rank 0 waited for it" \
        in cause["message"]
    assert "DDP876" not in {f["id"] for f in rep["findings"]}


def test_a_rank_two_seconds_late_within_the_timeout_is_clean(runs):
    res, rep = ran(runs, "two_seconds")
    assert res.rc == 0, res.output[-3000:]
    assert not [f for f in rep["findings"] if f["severity"] == "error" or f["id"] == "DDP879"]
