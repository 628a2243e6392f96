"""Cause, not symptom: each failure the collective ledger explains as a real 2-rank gloo script under `ddp-doctor
run`, whose report must name the cause, the rank and the evidence (ops, sizes, lines, steps);
and correct patterns that must stay clean.

The runs are started together by one module fixture (they mostly wait: timeouts, sleeps, a hang
bound), then each test reads its own run's report.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, TIMING_WARNINGS, Launch, clean_env, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
AT_ONCE = 3  # runs at a time on 2 cores: each is a launcher, 2 ranks and the parent

# name -> (script, extra options)
RUNS = {
    "uneven": ("uneven_inputs.py", []),
    "sizes": ("size_mismatch.py", []),
    "slow_checkpoint": ("slow_checkpoint.py", []),
    "rank0_only": ("rank0_only_allreduce.py", ["--hang-timeout", "6"]),
    "handset_rank": ("handset_rank.py", []),
    "env_world": ("env_world_size.py", []),
    "correct": ("correct_patterns.py", []),
    "barrier_in_block": ("barrier_in_rank0_block.py", ["--hang-timeout", "6"]),
    "extra_eval": ("rank0_evaluates_after_training.py", []),
    "nan_break": ("leaves_loop_on_nan.py", ["--hang-timeout", "6"]),
    "metric_abort": ("metric_in_rank0_block.py", []),
    "skipped_abort": ("metric_skipped_on_one_rank.py", []),
    "ran_out": ("uneven_loader_then_barrier.py", ["--hang-timeout", "8"]),
    "eval_helper": ("evaluates_on_rank0_only.py", ["--hang-timeout", "6"]),
    "gather_sizes": ("gathers_rank_sized.py", []),
}


def line_of(script: str, text: str) -> str:
    lines = (SCRIPTS / script).read_text().splitlines()
    return f"{script}:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("cause")


@pytest.fixture(scope="module")
def runs(base):
    launches = {
        name: Launch([*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", "--hang-timeout", "60", *extra,
                      "--run-dir", str(base / f"{name}-runs"), "--report", str(base / f"{name}.json"),
                      str(SCRIPTS / script)], clean_env(), str(base))
        for name, (script, extra) in RUNS.items()}
    return {"base": base, "results": run_all(launches, at_once=AT_ONCE)}


def ran(runs: dict, name: str) -> tuple:
    """One launch's result and report; a launch that overran fails only the test that reads it."""
    return result_of(runs["results"], name), load_json(str(runs["base"] / f"{name}.json"))


def ledgers_of(runs_dir: Path) -> dict[int, dict]:
    """The ledgers a run left in its kept run directory (--run-dir)."""
    from ddp_doctor.training import records
    [run_dir] = [p for p in runs_dir.iterdir() if p.name.startswith("ddp-doctor-run-")]
    return records.read_ledgers(str(run_dir))


def two_nodes(tmp_path: Path, script: str, extra: list[str]) -> list:
    """`ddp-doctor run --nnodes 2` of `script` on algo-1 and algo-2 (helpers.nodes)."""
    from helpers.nodes import doctor_run_on_two_nodes
    return doctor_run_on_two_nodes(tmp_path, SCRIPTS / script, extra)


def errors(rep: dict) -> list[dict]:
    return [f for f in rep["findings"] if f["severity"] == "error"]


def test_uneven_inputs_names_the_rank_that_left_and_the_steps(runs):
    res, rep = ran(runs, "uneven")
    assert res.rc == 1, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP892" and cause["ranks"] == [1], rep["findings"]
    assert "rank 1 ran 3 steps and destroyed its process group" in cause["message"]
    assert "rank 0 (3 steps done) waits in all_reduce" in cause["message"]
    assert cause["evidence"]["steps"] == {"0": 3, "1": 3}
    peer = [f for f in errors(rep) if f["ranks"] == [0]]
    assert peer and all(f["evidence"].get("consequence") for f in peer)  # the symptom, labelled


def test_collectives_of_different_sizes_are_a_mismatch_with_both_lines(runs):
    res, rep = ran(runs, "sizes")
    assert res.rc != 0, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP890", rep["findings"]
    site = line_of("size_mismatch.py", "dist.all_reduce(t)")
    assert "call #1" in cause["message"]
    assert "rank 0 all_reduce Float[3] at " in cause["message"] and "rank 1 all_reduce Float[4] at " in cause["message"]
    assert site in cause["message"]
    assert sorted(cause["evidence"]["ranks"]) == ["0", "1"]


def test_a_timeout_names_the_rank_that_was_elsewhere_and_where(runs):
    res, rep = ran(runs, "slow_checkpoint")
    assert res.rc == 1, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP891" and cause["ranks"] == [0], rep["findings"]
    assert "rank 1 waits in barrier #2" in cause["message"]
    assert line_of("slow_checkpoint.py", "time.sleep(600)") in cause["message"]  # where rank 0 was
    timed_out = [f for f in errors(rep) if f["ranks"] == [1] and f["id"] != "DDP891"]
    assert timed_out and all(f["evidence"].get("consequence") for f in timed_out)


def test_a_collective_on_one_rank_only_is_a_mismatch_not_just_a_hang(runs):
    res, rep = ran(runs, "rank0_only")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    # the ledgers alone cannot tell (both calls are the job's first); the source can: rank 0's
    # all_reduce is inside `if dist.get_rank() == 0:`, rank 1's barrier in no rank branch
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert line_of("rank0_only_allreduce.py", "dist.all_reduce(") in cause["message"]
    assert "issued all_reduce Float[2]" in cause["message"] and "rank 1 issued barrier" in cause["message"]
    assert "(`dist.get_rank() == 0` true there, line 6)" in cause["message"]
    assert cause["evidence"]["decided_by"] == "rank_branch"
    hang = [f for f in rep["findings"] if f["id"] == "DDP801"]
    assert hang and hang[0]["evidence"].get("consequence")


def test_a_metric_reduced_on_rank_0_only_that_makes_gloo_abort_is_named_at_its_line(runs):
    """gloo aborts rank 0 (SIGABRT, no Python exception) inside its rank-0-only all_reduce: the
    verdict is the ledgers' (what rank 0 issued inferred from its crash dump), not "a crash"."""
    res, rep = ran(runs, "metric_abort")
    assert res.rc != 0, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    # its tensors kept through the crash (the call note), its line from the crash dump
    assert "issued all_reduce Float[1] at " in cause["message"]
    assert line_of("metric_in_rank0_block.py", "dist.all_reduce(accuracy)") in cause["message"]
    assert "`dist.get_rank() == 0` true there" in cause["message"]
    crash = [f for f in rep["findings"] if f["id"] == "DDP807"]
    assert crash and all(f.get("caused_by") == "DDP893" for f in crash), rep["findings"]
    assert "no Python frame" not in str(rep["findings"])


def test_a_rank_that_skipped_a_routine_metric_is_named_not_the_rank_gloo_aborted(runs):
    res, rep = ran(runs, "skipped_abort")
    assert res.rc != 0, res.output
    cause = rep["root_cause"]
    # rank 1 aborted inside its logging all_reduce, the routine call; rank 0's gradient all_reduce
    # came where every rank had issued the logging one
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert "out of the order every rank had kept" in cause["message"]
    assert line_of("metric_skipped_on_one_rank.py", "dist.all_reduce(logged)") in cause["message"]
    assert "`step % 2 == 0 or rank == 1` true there" in cause["message"]


def test_a_rank_whose_data_ran_out_first_is_uneven_inputs_not_its_own_way(runs):
    res, rep = ran(runs, "ran_out")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP892" and cause["ranks"] == [1], rep["findings"]
    assert "rank 1 ran out of batches first: its DataLoader pass ended after 4 batches" in cause["message"]
    assert "rank 0 drew 5" in cause["message"]
    assert line_of("uneven_loader_then_barrier.py", "dist.barrier()") in cause["message"]
    assert cause["evidence"]["data_pass"]["1"]["ended"] is True


def test_a_helper_that_reduces_called_on_rank_0_only_is_named_at_its_call(runs):
    res, rep = ran(runs, "eval_helper")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert line_of("evaluates_on_rank0_only.py", "dist.all_reduce(correct)") in cause["message"]
    assert "`local_rank == 0` true there" in cause["message"]
    assert "around the call at " in cause["message"]
    assert line_of("evaluates_on_rank0_only.py", "evaluate(model))") + ")" in cause["message"]


def test_an_all_gather_sized_by_each_ranks_data_is_a_mismatch_with_both_sizes(runs):
    """Whichever way gloo ends it (an abort on one rank, a raise on the other), the verdict is the
    mismatch at the all_gather's line, with each rank's size: the aborted rank's kept through its
    crash (its note of the call)."""
    res, rep = ran(runs, "gather_sizes")
    assert res.rc != 0, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP890" and cause["ranks"] == [0, 1], rep["findings"]
    assert "rank 0 all_gather Float[3] at" in cause["message"] and "rank 1 all_gather Float[4] at" in cause["message"]
    assert line_of("gathers_rank_sized.py", "dist.all_gather(") in cause["message"]
    assert "their shape depends on each rank's data" in cause["message"]
    assert "no Python frame" not in str(rep["findings"])


def test_a_rank_written_by_hand_is_reported_at_once(runs):
    res, rep = ran(runs, "handset_rank")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP867" and cause["ranks"] == [0, 1], rep["findings"]
    assert "joined with rank 0 (rank=0 passed at" in cause["message"]
    assert line_of("handset_rank.py", "dist.init_process_group(") in cause["message"]
    assert "the launcher gave RANK=0, RANK=1" in cause["message"]
    # ended by the judgement of the init calls, not by the 60 s hang bound
    assert not [f for f in rep["findings"] if f["id"] == "DDP801"], rep["findings"]


def test_a_world_size_changed_by_the_script_is_reported_at_once(runs):
    res, rep = ran(runs, "env_world")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP868" and cause["ranks"] == [0, 1], rep["findings"]
    assert "joined a world of 4" in cause["message"] and "the launcher started 2" in cause["message"]
    assert "the launcher set '2'; the script changed it" in cause["message"]
    assert not [f for f in rep["findings"] if f["id"] == "DDP801"], rep["findings"]


def test_correct_patterns_stay_clean(runs):
    res, rep = ran(runs, "correct")
    assert res.rc == 0, res.output
    # the preflight's timing warnings depend on the machine's load, not on the script
    assert not [f for f in rep["findings"] if f["severity"] in ("error", "warning")
                and f["id"] not in TIMING_WARNINGS], rep["findings"]


def test_each_rank_leaves_its_ledger_of_the_scripts_own_collectives(runs, base):
    ledgers = ledgers_of(base / "sizes-runs")
    assert sorted(ledgers) == [0, 1]
    for rank, led in ledgers.items():
        assert led["rank"] == rank and led["source"] == "flight_recorder" and led["complete"] is True
        # only the script's collective (the preflight's own group is left out), with its line
        [entry] = led["entries"]
        assert entry["profiling_name"] == "gloo:all_reduce" and entry["input_sizes"] == [[3 + rank]]
        assert entry["user_site"].endswith(line_of("size_mismatch.py", "dist.all_reduce(t)"))
    assert ledgers[0]["position"] == "destroyed" and ledgers[1]["position"] == "failed"
    assert ledgers[1]["entries"][0].get("failed_here") is True


def test_a_hang_leaves_ledgers_with_the_pending_collectives(runs, base):
    ledgers = ledgers_of(base / "rank0_only-runs")
    assert {led["position"] for led in ledgers.values()} == {"hung"}
    assert [(e["profiling_name"], e["retired"]) for e in ledgers[0]["entries"]] == [("gloo:all_reduce", False)]
    assert [(e["profiling_name"], e["retired"]) for e in ledgers[1]["entries"]] == [("gloo:barrier", False)]
    assert "rank0_only_allreduce.py" in ledgers[1]["where"]


def test_across_nodes_the_master_nodes_report_names_the_cause_on_the_other_node(tmp_path):
    """Two simulated nodes (`ddp-doctor run --nnodes 2`, one rank each, host names algo-1/algo-2):
    rank 1 on node 1 raises; node 0's report, the one read first, names it (from the job's store)."""
    results = two_nodes(tmp_path, "rank1_raises.py", [])
    for node, res in enumerate(results):
        assert res.rc == 1, res.output
        rep = load_json(str(tmp_path / f"node{node}.json"))
        cause = rep["root_cause"]
        assert cause["id"] == "DDP800" and cause["ranks"] == [1], (node, rep["findings"])
        assert "ValueError: bad batch on rank 1" in cause["message"]
        assert not [f for f in rep["findings"] if f["id"] == "DDP003"], rep["findings"]  # no lost "local rank 0"
    node0 = load_json(str(tmp_path / "node0.json"))
    peer = [f for f in node0["findings"] if f["ranks"] == [0] and f["severity"] == "error"]
    assert peer and all(f["evidence"].get("consequence") for f in peer)


# ----------------------------------------------------------------------------- who went its own way

def test_a_barrier_indented_into_the_rank0_block_names_rank_0_and_its_line(runs):
    res, rep = ran(runs, "barrier_in_block")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert line_of("barrier_in_rank0_block.py", "dist.barrier()") in cause["message"]
    assert "rank 1 issued all_reduce" in cause["message"] and cause["evidence"]["decided_by"] == "new_call"
    # the hang names the rank that went its own way, never the one that only waited
    (hang,) = [f for f in rep["findings"] if f["id"] == "DDP801"]
    assert hang["ranks"] == [0] and hang["evidence"]["explained_by"] == "DDP893", hang
    assert not [f for f in errors(rep) if f["ranks"] == [1] and not f["evidence"].get("consequence")]


def test_an_evaluation_on_rank_0_only_after_training_names_rank_0_not_the_rank_that_ended(runs):
    res, rep = ran(runs, "extra_eval")
    assert res.rc != 0, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert line_of("rank0_evaluates_after_training.py", "dist.all_reduce(loss)") in cause["message"]
    assert "rank 1 finished after the same" in cause["message"] and "4 steps done on each" in cause["message"]
    assert not [f for f in rep["findings"] if f["id"] == "DDP892"], rep["findings"]
    # rank 0's "Connection closed by peer" is the consequence of its own extra collective
    assert all(f["evidence"].get("consequence") for f in errors(rep) if f["id"] != "DDP893"), rep["findings"]


def test_a_rank_that_left_its_loop_on_its_own_data_is_named_not_the_rank_still_training(runs):
    res, rep = ran(runs, "nan_break")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [1], rep["findings"]
    assert line_of("leaves_loop_on_nan.py", "dist.barrier()") in cause["message"]
    assert "rank 0 issued all_reduce" in cause["message"]
    (hang,) = [f for f in rep["findings"] if f["id"] == "DDP801"]
    assert hang["ranks"] == [1], hang


def test_a_hang_on_another_node_is_named_on_every_node_with_its_line(tmp_path):
    """Two simulated nodes, one rank each: rank 1 (node 1) blocks on a queue before its next
    all_reduce while rank 0 (node 0) waits in it. Each node finds the hang on its own; the ranks
    share their ledgers and stacks through the job's store, so both reports name rank 1 and its line."""
    results = two_nodes(tmp_path, "rank1_blocks_on_queue.py", ["--hang-timeout", "8", "--skip", "communication"])
    blocked = line_of("rank1_blocks_on_queue.py", "batches.get()")
    for node, res in enumerate(results):
        assert res.rc == 124, (node, res.output)
        rep = load_json(str(tmp_path / f"node{node}.json"))
        cause = rep["root_cause"]
        outputs = [r.output[-4000:] for r in results]
        assert cause["id"] == "DDP891" and cause["ranks"] == [1], (node, rep["findings"], outputs)
        assert blocked in cause["message"] and "rank 0 waits in all_reduce" in cause["message"]
        (hang,) = [f for f in rep["findings"] if f["id"] == "DDP801"]
        assert hang["ranks"] == [1] and hang["evidence"]["consequence"], (node, hang)
        assert blocked in hang["evidence"]["stacks"]["1"].replace('", line ', ":"), (node, hang["evidence"]["stacks"])
