"""DoctorCallback in a plain Hugging Face Trainer on 2 real gloo ranks: without ddp-doctor run
(rank 0 gathers the records through the store and writes the report) and under it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.procs import DDP, clean_env, ids, load_json, run

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.test_training_entrypoints import assert_finished  # noqa: E402  (needs transformers)

SCRIPT = str(Path(__file__).resolve().parent / "probe_scripts" / "trainer_ddp_model.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "0"]


def env() -> dict[str, str]:
    return clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def test_correct_trainer_run_reports_only_the_batch_note(tmp_path):
    res = run([*TORCHRUN, SCRIPT], env(), str(tmp_path), timeout=240)
    assert_finished(res, "rank 0 done", torchrun=True)
    assert "rank 1 done" in res.stdout
    rep = load_json(str(tmp_path / "ddp-doctor-report.json"))  # the default report path, written by rank 0
    assert rep["status"] == "pass" and rep["phase"] == "training", rep["findings"]
    assert ids(rep) == {"DDP873"}, rep["findings"]
    [note] = rep["findings"]
    assert "global batch 4 = 2 per device x 1 accumulation step(s) x 2 rank(s)" in note["message"]


def test_trainer_given_a_ddp_model_is_said_at_once_without_the_wrapper(tmp_path):
    res = run([*TORCHRUN, SCRIPT, "--wrap"], env(), str(tmp_path), timeout=240)
    assert res.rc != 0  # the Trainer then fails (empty batches)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ddp-doctor: DDP860")]
    assert len(lines) == 1 and "DistributedDataParallel-wrapped TinyLM" in lines[0], res.stderr[-3000:]


def test_trainer_given_a_ddp_model_is_the_root_cause_under_the_wrapper(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--nproc-per-node", "2", "--report", str(report), SCRIPT, "--wrap"], env(),
              str(tmp_path), timeout=240)
    assert res.rc == 1, res.output
    rep = load_json(str(report))
    assert rep["root_cause"]["id"] == "DDP860" and rep["root_cause"]["ranks"] == [0, 1]
    assert "DDP832" in ids(rep)  # the Trainer's own failure, listed after its cause
    assert not (tmp_path / "ddp-doctor-report.json").exists()  # the wrapper reports, not the callback
