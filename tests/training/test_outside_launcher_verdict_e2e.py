"""Never a false "pass" under an outside launcher (`torchrun ... -m ddp_doctor run SCRIPT`): no
ddp-doctor parent owns the verdict, so a rank that knows how the job ended writes it.

Real torchrun, real SIGKILL. The launches start together (module fixture); each test reads its own.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers.procs import Launch, clean_env, finish, load_json, result_of, run_all, start, wait_for

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "ddp_doctor", "run", "--skip", "communication", "--report", "r.json"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("outside")
    launches = {}
    for name, script in (("oom", "rank0_oom_killed.py"), ("late", "rank1_fails_after_rank0_ended.py")):
        (base / name).mkdir()
        launches[name] = Launch([*TORCHRUN, str(SCRIPTS / script)], clean_env(), str(base / name), 150)
    return {"base": base, "results": run_all(launches, at_once=2)}


def test_a_rank_killed_by_sigkill_is_the_root_cause_and_the_report_says_fail(runs):
    res = result_of(runs["results"], "oom")
    assert res.rc != 0, res.output
    rep = load_json(str(runs["base"] / "oom" / "r.json"))
    assert rep["status"] == "fail" and rep["phase"] == "training", rep
    cause = rep["root_cause"]
    assert cause["id"] == "DDP803" and cause["ranks"] == [0], rep["findings"]
    assert "killed without an ending" in cause["message"] and "OOM killer" in cause["message"]
    peer = [f for f in rep["findings"] if f["ranks"] == [1] and f["severity"] == "error"]
    assert peer and all(f["caused_by"] == "DDP803" for f in peer), (
        [(f["id"], f["severity"], f["ranks"], f.get("caused_by"), f["message"][:300]) for f in rep["findings"]],
        res.output[-3000:])


def test_a_rank_that_fails_after_rank_0_ended_well_makes_the_report_fail_where_it_was_asked(runs):
    res = result_of(runs["results"], "late")
    assert res.rc == 1, res.output
    rep = load_json(str(runs["base"] / "late" / "r.json"))  # relative to where the job started
    assert rep["status"] == "fail", rep
    assert rep["root_cause"]["ranks"] == [1] and "disk quota exceeded" in rep["root_cause"]["message"]


def _outcome(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _status(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("status")
    except (OSError, ValueError):
        return None


def test_while_training_runs_the_report_says_running_and_pass_only_once_every_rank_ended(tmp_path):
    from ddp_doctor.training.run.ledger import process_gone
    go, run_dir = tmp_path / "go", tmp_path / "run"
    run_dir.mkdir()
    proc = start([*TORCHRUN, str(SCRIPTS / "rank1_waits_for_go.py")],
                 clean_env(GO_FILE=str(go), DDP_DOCTOR_RUN_DIR=str(run_dir)), str(tmp_path))
    try:
        # rank 1 waits for the test; rank 0 ended well and its process is gone: the job has not ended
        rank0 = wait_for(lambda: _outcome(run_dir / "rank-0.json"), 120, "rank 0's outcome record")
        wait_for(lambda: process_gone(rank0["pid"]), 60, "rank 0's process to end")
        assert _status(tmp_path / "r.json") == "running", load_json(str(tmp_path / "r.json"))
        rep = load_json(str(tmp_path / "r.json"))
        assert rep["preflight_status"] in ("pass", "warn") and rep["phase"] == "training", rep
    finally:
        go.write_text("go")
    res = finish(proc, 120)
    assert res.rc == 0, res.output
    assert sorted(ln for ln in res.stdout.splitlines() if ln.endswith(" done")) == ["rank 0 done", "rank 1 done"]
    assert _status(tmp_path / "r.json") in ("pass", "warn"), load_json(str(tmp_path / "r.json"))
    assert not [p for p in os.listdir(tmp_path) if p.startswith("r.json.rank")]
