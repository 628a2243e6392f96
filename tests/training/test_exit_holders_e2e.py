"""A rank that will not exit after its script ended is an error naming what keeps it alive: real
2-rank gloo jobs under `ddp-doctor run` (docs/run-and-probes.md). A non-daemon thread blocked on
queue.get() (DDP806: its name, where it blocks, the line that started it), a child process never
waited for (DDP816, a warning: ddp-doctor ended it; its pid, its command line with the secret
redacted, the line that started it),
and the correct pattern (thread joined, child waited for) that stays clean.

The runs start together from one module fixture; the thread run's teardown bound (60 s in
production) is made short by the same wrapper as tests/training/test_run_e2e.py's stuck_at_exit run.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, ddp_with_bounds, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
# Only the run that must be ended gets the short bound: on 2 loaded cores a correct rank's exit
# (its ledger, torch's teardown) can take longer than a few seconds, which is not what is tested.
SHORT_BOUND = ddp_with_bounds(TEARDOWN_BOUND=6.0)

# name -> (command, script, extra options)
RUNS = {
    "thread": (SHORT_BOUND, "thread_holds_exit.py", []),
    "child": (DDP, "child_left_running.py", ["--fail-on", "error"]),
    "clean": (DDP, "joins_its_workers.py", []),
}


def line_of(script: str, text: str) -> str:
    lines = (SCRIPTS / script).read_text().splitlines()
    return f"{script}:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("exit_holders")
    launches = {
        name: Launch([*command, "run", "--skip", "communication", "--nproc-per-node", "2", "--timeout", "30", *extra,
                      "--report", str(base / f"{name}.json"), str(SCRIPTS / script)],
                     clean_env(), str(base), timeout=180)
        for name, (command, script, extra) in RUNS.items()}
    return {"base": base, "results": run_all(launches, at_once=3)}


def ran(runs: dict, name: str) -> tuple:
    res = result_of(runs["results"], name)
    path = runs["base"] / f"{name}.json"
    return res, load_json(str(path)), path.read_text()


def test_a_non_daemon_thread_blocked_on_a_queue_is_an_error_naming_it(runs):
    res, rep, _ = ran(runs, "thread")
    assert res.rc == 0, res.output  # the training's own status: its work ended well
    assert rep["status"] == "fail", rep["findings"]
    held = [f for f in rep["findings"] if f["id"] == "DDP806"]
    assert sorted(r for f in held for r in f["ranks"]) == [0, 1], rep["findings"]
    for f in held:
        assert f["severity"] == "error", f
        msg = f["message"]
        assert "thread 'metrics-uploader' (not a daemon)" in msg, msg
        assert "queue.py" in msg and "in get" in msg, msg  # where it blocks
        assert line_of("thread_holds_exit.py", "uploads.get()") in msg, msg  # the user's line
        assert f"started at {SCRIPTS / line_of('thread_holds_exit.py', 'uploader.start()')}" in msg, msg
    assert "DDP806" in res.stderr  # said on stderr, not only in the file


def test_a_child_never_waited_for_is_named_without_its_secret(runs):
    res, rep, text = ran(runs, "child")
    assert res.rc == 0, res.output  # a warning (ddp-doctor ended the child): the script's own status
    assert rep["status"] == "warn", rep["findings"]
    left = [f for f in rep["findings"] if f["id"] == "DDP816"]
    assert sorted(r for f in left for r in f["ranks"]) == [0, 1], rep["findings"]
    for f in left:
        msg = f["message"]
        assert f["severity"] == "warning" and "time.sleep(600)" in msg and "--password=***" in msg, msg
        assert f"started at {SCRIPTS / line_of('child_left_running.py', 'subprocess.Popen(')}" in msg, msg
    assert "hunter2" not in text and "hunter2" not in res.stderr


def test_a_script_that_joins_its_thread_and_waits_for_its_child_stays_clean(runs):
    res, rep, text = ran(runs, "clean")
    assert res.rc == 0, res.output
    assert not {"DDP806", "DDP816", "DDP817"} & {f["id"] for f in rep["findings"]}, rep["findings"]
    assert rep["status"] != "fail" and "hunter2" not in text
