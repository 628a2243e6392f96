"""`ddp-doctor run` on real processes: a DataLoader worker's error on rank 1 reaches the training
loop wrapped ("Caught ValueError in DataLoader worker process 0. Original Traceback ..."); the
report names the worker's own error and the script's line that raised it.

One launch, shared by the tests of this module (the fixture pattern of test_run_e2e.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "run_scripts" / "rank1_worker_raises.py"
RAISE_LINE = SCRIPT.read_text().splitlines().index('            raise ValueError(f"corrupt record {i}")') + 1
OWN_FRAME = re.compile(r'File "[^"]*[/\\]ddp_doctor[/\\]')


@pytest.fixture(scope="module")
def worker_raises(tmp_path_factory):
    base = tmp_path_factory.mktemp("wrapped")
    report = base / "r.json"
    results = run_all({"worker_raises": Launch(
        [*DDP, "run", "--nproc-per-node", "2", "--skip", "communication", "--timeout", "20",
         "--report", str(report), str(SCRIPT)], clean_env(), str(base), timeout=120)})
    return result_of(results, "worker_raises"), load_json(str(report))


def test_the_root_cause_is_rank_1s_worker_error_with_the_line_that_raised_it(worker_raises):
    res, rep = worker_raises
    assert res.rc == 1, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP800" and cause["ranks"] == [1], rep["findings"]
    assert "ValueError: corrupt record 37" in cause["message"], cause
    assert f"{SCRIPT}:{RAISE_LINE} in __getitem__" in cause["message"], cause
    assert "in DataLoader worker process 0" in cause["message"] and "Original Traceback" not in cause["message"]
    assert f"{SCRIPT.name}:{RAISE_LINE}" in res.stderr.split("Root cause:", 1)[-1]  # the printed verdict says it


def test_the_wrapper_is_kept_in_the_evidence(worker_raises):
    _, rep = worker_raises
    ev = rep["root_cause"]["evidence"]
    assert ev["wrapped_by"] == "ValueError: Caught ValueError in DataLoader worker process 0."
    assert ev["raised_at"] == f"{SCRIPT}:{RAISE_LINE} in __getitem__"
    assert "Original Traceback" in ev["traceback"]  # the whole traceback as the rank recorded it


def test_rank_0_is_a_consequence_and_no_traceback_of_ddp_doctor_is_shown(worker_raises):
    res, rep = worker_raises
    rank0 = [f for f in rep["findings"] if 0 in f["ranks"] and f["severity"] == "error"]
    assert rank0 and all(f["evidence"].get("consequence") for f in rank0), rank0
    assert not OWN_FRAME.search(res.output), res.output[-3000:]
