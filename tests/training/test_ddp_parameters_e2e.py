"""DDP's errors about single parameters, named: 2-rank runs under `ddp-doctor run` of
tests/run_scripts/ddp_unused_parameters.py (torch prints only the indices of the parameters, without
TORCH_DISTRIBUTED_DEBUG): the verdict names them, and the rank whose iteration left them unused.
What each run's report says is judged from its recorded evidence (tests/corpus/ddp_parameters/,
helpers/scenarios.py's group "ddp_parameters"); one mode is launched for what only a launch shows
(the names gathered from the ranks, the console, the exit status, the evidence written)."""
from __future__ import annotations

import pytest
from helpers import corpus
from helpers.procs import load_json, run
from helpers.scenarios import GROUPS, launch

from ddp_doctor.report.render import render_text
from ddp_doctor.training.evidence_file import verdict

HEAD_NAMED = ("ranks 0-1: parameters unused in each one's iteration (DDP did not receive their gradient): "
              "unused_head.weight (index 5), unused_head.bias (index 6)")
TORCH_SAID = "Parameter indices which did not receive grad for rank 0: 5 6"  # torch: indices only


def ran(mode: str) -> tuple[int, dict]:
    code, rep, _ = corpus.replayed("ddp_parameters", mode)
    return code, rep


def test_every_mode_is_recorded_and_replays_to_the_verdict_it_recorded():
    assert corpus.unreplayed("ddp_parameters", list(GROUPS["ddp_parameters"])) == []


def test_a_head_unused_on_every_rank_is_named():
    code, rep = ran("head")
    cause = rep["root_cause"]
    assert cause["id"] == "DDP823" and cause["ranks"] == [0, 1], cause
    raised = {r: o["exception"]["message"] for r, o in corpus.evidence_of("ddp_parameters", "head")["outcomes"].items()}
    assert TORCH_SAID in raised["0"]
    assert not [m for m in raised.values() if "unused_head.weight" in m], raised  # the names are ddp-doctor's
    assert cause["message"].startswith(HEAD_NAMED), cause
    assert "unused_head.weight (index 5)" in render_text(rep) and "find_unused_parameters=True" in cause["hint"]
    assert code == 1


def test_a_branch_skipped_on_one_rank_names_that_ranks_iteration():
    _, rep = ran("branch")
    cause = rep["root_cause"]
    assert cause["id"] == "DDP823" and cause["ranks"] == [1], cause
    assert cause["message"].startswith(
        "rank 1: parameters unused in its iteration (DDP did not receive their gradient): extra.0.weight (index 2), "
        "extra.0.bias (index 3), extra.2.weight (index 4), extra.2.bias (index 5)"), cause
    assert not [f for f in rep["findings"] if f["id"] == "DDP823" and 0 in f["ranks"]], rep["findings"]


def test_a_block_checkpointed_twice_names_the_parameter_and_the_fixes():
    _, rep = ran("twice")
    cause = rep["root_cause"]
    assert cause["id"] == "DDP847", cause
    assert "parameter block.lin.bias (index 3, of module block.lin) got its gradient twice" in cause["message"], cause
    assert "use_reentrant=False" in cause["hint"] and "static_graph=True" in cause["hint"]
    assert "find_unused_parameters=False" in cause["hint"]


@pytest.mark.slow
def test_a_launched_run_names_the_parameters_torch_gave_by_index(tmp_path):
    job = launch("ddp_parameters", "head", tmp_path)
    res = run(job.cmd, job.env, job.cwd, job.timeout)
    rep = load_json(str(tmp_path / "head.json"))
    assert res.rc == 1, res.stderr[-3000:]
    assert TORCH_SAID in res.output
    assert "unused_head.weight" not in res.output.split("ddp-doctor training:")[0]
    assert rep["root_cause"]["message"].startswith(HEAD_NAMED), (rep["root_cause"], res.stderr[-3000:])
    assert "unused_head.weight (index 5)" in res.stderr
    code, again, was = corpus.judged_again(tmp_path / "head.evidence.json")
    assert was == verdict(rep, res.rc) == verdict(again, code)
