"""A rank late to init_process_group is the cause (DDP879), with where it was: 2-rank gloo jobs
under `ddp-doctor run` whose rank 0's init times out (8 s) while rank 1 sleeps before init, reads
files in a loop before init, or ends without calling init; and a rank merely 2 s late, within the
timeout, that must stay clean. What each run's report says is judged from its recorded evidence
(tests/corpus/late_init/, helpers/scenarios.py's group "late_init"); the sleeping rank is launched
for what only a launch shows (where rank 1 was, from its heartbeat, the exit status, the console,
the evidence written).
"""
from __future__ import annotations

import pytest
from helpers import corpus
from helpers.procs import load_json, run
from helpers.scenarios import GROUPS, SCRIPTS, launch

from ddp_doctor.report.render import render_text
from ddp_doctor.training.evidence_file import verdict


def line_of(script: str, text: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if text in ln)


def ran(name: str) -> tuple[int, dict]:
    code, rep, _ = corpus.replayed("late_init", name)
    return code, rep


def _late_verdict(rep: dict) -> dict:
    cause = rep["root_cause"]
    assert cause["id"] == "DDP879" and cause["ranks"] == [1], cause
    [timeout] = [f for f in rep["findings"] if f["id"] == "DDP835"]
    assert timeout["ranks"] == [0] and timeout["caused_by"] == "DDP879"
    assert timeout["evidence"]["consequence"] is True
    return cause


def _asleep_at(rep: dict, script: str) -> None:
    """The verdict names rank 1's sleep before init; `script`: the path it was run from."""
    cause = _late_verdict(rep)
    line = line_of("rank1_late_to_init.py", "time.sleep(30)")
    assert f"rank 1 was at {script}:{line} in <module>" in cause["message"]
    assert cause["evidence"]["late"]["1"]["where"].startswith(f"{script}:{line} ")
    assert "after init_process_group" in cause["hint"] and "timeout=" in cause["hint"]


def test_every_run_is_recorded_and_replays_to_the_verdict_it_recorded():
    assert corpus.unreplayed("late_init", list(GROUPS["late_init"])) == []


def test_a_rank_asleep_before_init_is_the_cause_at_its_sleep():
    code, rep = ran("sleeps")
    assert code != 0
    _asleep_at(rep, corpus.as_recorded(SCRIPTS / "rank1_late_to_init.py"))
    assert "Root cause: DDP879" in render_text(rep)


def test_a_rank_reading_files_in_a_loop_before_init_is_the_cause_in_its_loop():
    _, rep = ran("loads")
    cause = _late_verdict(rep)
    script = "rank1_loads_before_init.py"
    first, last = line_of(script, "for i in range(60)"), line_of(script, "time.sleep(0.5)")
    where = cause["evidence"]["late"]["1"]["where"]
    path, _, rest = where.partition(":")
    assert path == corpus.as_recorded(SCRIPTS / script) and first <= int(rest.split()[0]) <= last, where


def test_a_rank_that_ends_without_init_is_the_cause():
    _, rep = ran("ends")
    cause = _late_verdict(rep)
    assert "rank 1 ended (exit status 0) without calling init_process_group while rank 0 waited for it" \
        in cause["message"]
    assert "DDP876" not in {f["id"] for f in rep["findings"]}


def test_a_rank_two_seconds_late_within_the_timeout_is_clean():
    code, rep = ran("two_seconds")
    assert code == 0, rep["findings"]
    assert not [f for f in rep["findings"] if f["severity"] == "error" or f["id"] == "DDP879"]


@pytest.mark.slow
def test_a_launched_rank_asleep_before_init_is_named_where_it_slept(tmp_path):
    job = launch("late_init", "sleeps", tmp_path)
    res = run(job.cmd, job.env, job.cwd, job.timeout)
    rep = load_json(str(tmp_path / "sleeps.json"))
    assert res.rc != 0
    _asleep_at(rep, str(SCRIPTS / "rank1_late_to_init.py"))
    assert "Root cause: DDP879" in res.stderr
    code, again, was = corpus.judged_again(tmp_path / "sleeps.evidence.json")
    assert was == verdict(rep, res.rc) == verdict(again, code)
