"""The sampler rules on 2 real gloo ranks: loaders every rank reads in full on purpose (a plain
reference model trained on the whole data, evaluation over the whole validation set) next to a DDP
model fed by a sharded loader give no error or warning; the same DDP model fed by an unsharded
loader is DDP850 (tests/run_scripts/sampler_reference_and_eval.py). Judged from the runs' recorded
evidence (tests/corpus/sampler_rules/, helpers/scenarios.py's group "sampler_rules"): what the
probes gather from a launch is shown by test_sharding_e2e.py's and test_probes_e2e.py's launches."""
from __future__ import annotations

from helpers import corpus
from helpers.procs import assert_healthy, ids
from helpers.scenarios import GROUPS


def ended_well(name: str) -> dict:
    code, rep, _ = corpus.replayed("sampler_rules", name)
    assert code == 0, rep.get("root_cause")
    outcomes = corpus.evidence_of("sampler_rules", name)["outcomes"]
    assert {r: o["exit_code"] for r, o in outcomes.items()} == {"0": 0, "1": 0}  # each rank's script ended well
    return rep


def test_every_run_is_recorded_and_replays_to_the_verdict_it_recorded():
    assert corpus.unreplayed("sampler_rules", list(GROUPS["sampler_rules"])) == []


def test_reference_model_and_full_evaluation_are_not_sharding_bugs():
    rep = ended_well("reference_eval")
    assert_healthy(rep)  # no error; no warning but the load-dependent timing ones of a busy machine
    [full_eval] = [f for f in rep["findings"] if f["id"] == "DDP854"]
    assert full_eval["severity"] == "info" and full_eval["ranks"] == [0, 1]
    assert "sampler_reference_and_eval.py" in full_eval["message"] and "SequentialSampler" in full_eval["message"]
    assert not ids(rep) & {"DDP850", "DDP853"}


def test_the_same_ddp_model_fed_by_an_unsharded_loader_is_ddp850():
    bad = ended_well("unsharded")
    [f] = [f for f in bad["findings"] if f["id"] == "DDP850"]
    assert f["severity"] == "error" and f["ranks"] == [0, 1] and bad["status"] == "fail"
    assert "sampler_reference_and_eval.py:33" in f["message"] and "RandomSampler" in f["message"]
