"""DDP's errors about single parameters, named, through a real 2-rank `ddp-doctor run`
(tests/run_scripts/ddp_unused_parameters.py): torch prints only the indices of the parameters
(without TORCH_DISTRIBUTED_DEBUG), the verdict names them, and the rank whose iteration left them
unused. The three runs are started together by one module fixture; each test reads its own report."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "run_scripts" / "ddp_unused_parameters.py"
MODES = ("head", "branch", "twice")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp-parameters")
    env = clean_env()
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)  # torch's own names stay out of its message
    launches = {mode: Launch([*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", "--hang-timeout", "60",
                              "--report", str(base / f"{mode}.json"), str(SCRIPT), mode], env, str(base))
                for mode in MODES}
    return {"base": base, "results": run_all(launches, at_once=3)}


def ran(runs: dict, mode: str) -> tuple:
    return result_of(runs["results"], mode), load_json(str(runs["base"] / f"{mode}.json"))


def test_a_head_unused_on_every_rank_is_named(runs):
    res, rep = ran(runs, "head")
    cause = rep["root_cause"]
    assert cause["id"] == "DDP823" and cause["ranks"] == [0, 1], (cause, res.stderr[-3000:])
    assert "Parameter indices which did not receive grad for rank 0: 5 6" in res.output  # torch: indices only
    assert "unused_head.weight" not in res.output.split("ddp-doctor training:")[0]
    assert cause["message"].startswith(
        "ranks 0-1: parameters unused in each one's iteration (DDP did not receive their gradient): "
        "unused_head.weight (index 5), unused_head.bias (index 6)"), cause
    assert "unused_head.weight (index 5)" in res.stderr and "find_unused_parameters=True" in cause["hint"]
    assert res.rc == 1


def test_a_branch_skipped_on_one_rank_names_that_ranks_iteration(runs):
    res, rep = ran(runs, "branch")
    cause = rep["root_cause"]
    assert cause["id"] == "DDP823" and cause["ranks"] == [1], (cause, res.stderr[-3000:])
    assert cause["message"].startswith(
        "rank 1: parameters unused in its iteration (DDP did not receive their gradient): extra.0.weight (index 2), "
        "extra.0.bias (index 3), extra.2.weight (index 4), extra.2.bias (index 5)"), cause
    assert not [f for f in rep["findings"] if f["id"] == "DDP823" and 0 in f["ranks"]], rep["findings"]


def test_a_block_checkpointed_twice_names_the_parameter_and_the_fixes(runs):
    res, rep = ran(runs, "twice")
    cause = rep["root_cause"]
    assert cause["id"] == "DDP847", (cause, res.stderr[-3000:])
    assert "parameter block.lin.bias (index 3, of module block.lin) got its gradient twice" in cause["message"], cause
    assert "use_reentrant=False" in cause["hint"] and "static_graph=True" in cause["hint"]
    assert "find_unused_parameters=False" in cause["hint"]
