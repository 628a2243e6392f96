"""DoctorCallback in a plain Hugging Face Trainer on 2 real gloo ranks: without ddp-doctor run
(rank 0 gathers the records through the store and writes the report) and under it. The correct
Trainer run with the callback is test_training_entrypoints.py's hf_trainer under torchrun (its
report: nothing but DDP873) and test_run_e2e.py's under the wrapper."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, ids, load_json, result_of, run_all

pytestmark = pytest.mark.slow
# Like pytest.importorskip, without importing them into the test process (both xdist workers collect
# this module; the ranks import them)
if not all(importlib.util.find_spec(name) for name in ("transformers", "accelerate")):
    pytest.skip("needs transformers and accelerate", allow_module_level=True)


SCRIPT = str(Path(__file__).resolve().parents[1] / "probe_scripts" / "trainer_ddp_model.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "0"]


def env() -> dict[str, str]:
    return clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both launches together: under torchrun with the callback alone, and under ddp-doctor run."""
    base = tmp_path_factory.mktemp("callback")
    (base / "plain").mkdir()
    (base / "wrapped").mkdir()
    launches = {
        "plain": Launch([*TORCHRUN, SCRIPT, "--wrap"], env(), str(base / "plain"), 240),
        # the Trainer's failure is the subject: the preflight's bandwidth sweep (CPU on 2 busy cores) is skipped
        "wrapped": Launch([*DDP, "run", "--nproc-per-node", "2", "--skip", "communication",
                           "--report", str(base / "wrapped" / "r.json"), SCRIPT, "--wrap"],
                          env(), str(base / "wrapped"), 240)}
    return base, run_all(launches, at_once=2)


def test_trainer_given_a_ddp_model_is_said_at_once_without_the_wrapper(runs):
    res = result_of(runs[1], "plain")
    assert res.rc != 0  # the Trainer then fails (empty batches)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ddp-doctor: DDP860")]
    assert len(lines) == 1 and "DistributedDataParallel-wrapped TinyLM" in lines[0], res.stderr[-3000:]


def test_trainer_given_a_ddp_model_is_the_root_cause_under_the_wrapper(runs):
    base, results = runs
    res = result_of(results, "wrapped")
    assert res.rc == 1, res.output
    rep = load_json(str(base / "wrapped" / "r.json"))
    assert rep["root_cause"]["id"] == "DDP860" and rep["root_cause"]["ranks"] == [0, 1]
    assert "DDP832" in ids(rep)  # the Trainer's own failure, listed after its cause
    assert not (base / "wrapped" / "ddp-doctor-report.json").exists()  # the wrapper reports, not the callback
