"""The sampler rules on 2 real gloo ranks: loaders every rank reads in full on purpose (a plain
reference model trained on the whole data, evaluation over the whole validation set) next to a DDP
model fed by a sharded loader give no error or warning; the same DDP model fed by an unsharded
loader is DDP850 (tests/run_scripts/sampler_reference_and_eval.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, assert_healthy, clean_env, ids, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "run_scripts" / "sampler_reference_and_eval.py"


def both_runs(tmp_path: Path) -> dict[str, dict]:
    """The correct script and its --unsharded twin, launched together; name -> report."""
    launches = {}
    for name, flags in (("ok", []), ("bad", ["--unsharded"])):
        (tmp_path / name).mkdir()
        # the sampler rules are the subject: the preflight's bandwidth sweep (CPU on 2 busy cores) is skipped
        launches[name] = Launch([*DDP, "run", "--nproc-per-node", "2", "--skip", "communication",
                                 "--report", str(tmp_path / name / "r.json"), str(SCRIPT), *flags],
                                clean_env(), str(tmp_path / name))
    results = run_all(launches, at_once=2)
    reports = {}
    for name in launches:
        res = result_of(results, name)
        assert res.rc == 0, res.output
        assert sorted(ln.split(" done")[0] for ln in res.stdout.splitlines() if " done" in ln) == ["rank 0", "rank 1"]
        reports[name] = load_json(str(tmp_path / name / "r.json"))
    return reports


def test_reference_model_and_full_evaluation_are_not_sharding_bugs_an_unsharded_ddp_loader_is(tmp_path):
    reports = both_runs(tmp_path)
    rep = reports["ok"]
    assert_healthy(rep)  # no error; no warning but the load-dependent timing ones of a busy machine
    [full_eval] = [f for f in rep["findings"] if f["id"] == "DDP854"]
    assert full_eval["severity"] == "info" and full_eval["ranks"] == [0, 1]
    assert "sampler_reference_and_eval.py" in full_eval["message"] and "SequentialSampler" in full_eval["message"]
    assert not ids(rep) & {"DDP850", "DDP853"}

    bad = reports["bad"]
    [f] = [f for f in bad["findings"] if f["id"] == "DDP850"]
    assert f["severity"] == "error" and f["ranks"] == [0, 1] and bad["status"] == "fail"
    assert "sampler_reference_and_eval.py:33" in f["message"] and "RandomSampler" in f["message"]
