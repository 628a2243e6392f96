"""Cause, not symptom: each failure the collective ledger explains, as a real 2-rank gloo script
under `ddp-doctor run` left it (its evidence, recorded by tests/record_corpus.py into
tests/corpus/cause/), judged again: the report must name the cause, the rank and the evidence
(ops, sizes, lines, steps); and correct patterns must stay clean. test_cause_e2e.py launches the
scenarios whose gathering it checks (ledgers, two nodes).
"""
from __future__ import annotations

from helpers import corpus
from helpers.procs import TIMING_WARNINGS
from helpers.scenarios import GROUPS, line_of


def ran(name: str) -> tuple[int, dict]:
    """The job's exit code and report, judged again from the run's recorded evidence."""
    code, rep, _ = corpus.replayed("cause", name)
    return code, rep


def errors(rep: dict) -> list[dict]:
    return [f for f in rep["findings"] if f["severity"] == "error"]


def test_every_scenario_is_recorded_and_replays_to_the_verdict_it_recorded():
    assert corpus.unreplayed("cause", list(GROUPS["cause"])) == []


def test_uneven_inputs_names_the_rank_that_left_and_the_steps():
    code, rep = ran("uneven")
    assert code == 1, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP892" and cause["ranks"] == [1], rep["findings"]
    assert "rank 1 ran 3 steps and destroyed its process group" in cause["message"]
    assert "rank 0 (3 steps done) waits in all_reduce" in cause["message"]
    assert cause["evidence"]["steps"] == {"0": 3, "1": 3}
    peer = [f for f in errors(rep) if f["ranks"] == [0]]
    assert peer and all(f["evidence"].get("consequence") for f in peer)  # the symptom, labelled


def test_collectives_of_different_sizes_are_a_mismatch_with_both_lines():
    code, rep = ran("sizes")
    assert code != 0, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP890", rep["findings"]
    site = line_of("size_mismatch.py", "dist.all_reduce(t)")
    assert "call #1" in cause["message"]
    assert "rank 0 all_reduce Float[3] at " in cause["message"] and "rank 1 all_reduce Float[4] at " in cause["message"]
    assert site in cause["message"]
    assert sorted(cause["evidence"]["ranks"]) == ["0", "1"]


def test_a_timeout_names_the_rank_that_was_elsewhere_and_where():
    code, rep = ran("slow_checkpoint")
    assert code == 1, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP891" and cause["ranks"] == [0], rep["findings"]
    assert "rank 1 waits in barrier #2" in cause["message"]
    assert line_of("slow_checkpoint.py", "time.sleep(600)") in cause["message"]  # where rank 0 was
    timed_out = [f for f in errors(rep) if f["ranks"] == [1] and f["id"] != "DDP891"]
    assert timed_out and all(f["evidence"].get("consequence") for f in timed_out)


def test_a_collective_on_one_rank_only_is_a_mismatch_not_just_a_hang():
    code, rep = ran("rank0_only")
    assert code == 124, rep["findings"]
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


def test_a_metric_reduced_on_rank_0_only_that_makes_gloo_abort_is_named_at_its_line():
    """gloo aborts rank 0 (SIGABRT, no Python exception) inside its rank-0-only all_reduce: the
    verdict is the ledgers' (what rank 0 issued inferred from its crash dump), not "a crash"."""
    code, rep = ran("metric_abort")
    assert code != 0, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    # its tensors kept through the crash (the call note), its line from the crash dump
    assert "issued all_reduce Float[1] at " in cause["message"]
    assert line_of("metric_in_rank0_block.py", "dist.all_reduce(accuracy)") in cause["message"]
    assert "`dist.get_rank() == 0` true there" in cause["message"]
    crash = [f for f in rep["findings"] if f["id"] == "DDP807"]
    assert crash and all(f.get("caused_by") == "DDP893" for f in crash), rep["findings"]
    assert "no Python frame" not in str(rep["findings"])


def test_a_rank_that_skipped_a_routine_metric_is_named_not_the_rank_gloo_aborted():
    code, rep = ran("skipped_abort")
    assert code != 0, rep["findings"]
    cause = rep["root_cause"]
    # rank 1 aborted inside its logging all_reduce, the routine call; rank 0's gradient all_reduce
    # came where every rank had issued the logging one
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert "out of the order every rank had kept" in cause["message"]
    assert line_of("metric_skipped_on_one_rank.py", "dist.all_reduce(logged)") in cause["message"]
    assert "`step % 2 == 0 or rank == 1` true there" in cause["message"]


def test_a_rank_whose_data_ran_out_first_is_uneven_inputs_not_its_own_way():
    code, rep = ran("ran_out")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP892" and cause["ranks"] == [1], rep["findings"]
    assert "rank 1 ran out of batches first: its DataLoader pass ended after 4 batches" in cause["message"]
    assert "rank 0 drew 5" in cause["message"]
    assert line_of("uneven_loader_then_barrier.py", "dist.barrier()") in cause["message"]
    assert cause["evidence"]["data_pass"]["1"]["ended"] is True


def test_a_helper_that_reduces_called_on_rank_0_only_is_named_at_its_call():
    code, rep = ran("eval_helper")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert line_of("evaluates_on_rank0_only.py", "dist.all_reduce(correct)") in cause["message"]
    assert "`local_rank == 0` true there" in cause["message"]
    assert "around the call at " in cause["message"]
    assert line_of("evaluates_on_rank0_only.py", "evaluate(model))") + ")" in cause["message"]


def test_an_all_gather_sized_by_each_ranks_data_is_a_mismatch_with_both_sizes():
    """Whichever way gloo ends it (an abort on one rank, a raise on the other), the verdict is the
    mismatch at the all_gather's line, with each rank's size: the aborted rank's kept through its
    crash (its note of the call)."""
    code, rep = ran("gather_sizes")
    assert code != 0, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP890" and cause["ranks"] == [0, 1], rep["findings"]
    assert "rank 0 all_gather Float[3] at" in cause["message"] and "rank 1 all_gather Float[4] at" in cause["message"]
    assert line_of("gathers_rank_sized.py", "dist.all_gather(") in cause["message"]
    assert "their shape depends on each rank's data" in cause["message"]
    assert "no Python frame" not in str(rep["findings"])


def test_ranks_that_both_send_first_are_a_send_cycle_and_the_hang_its_consequence():
    code, rep = ran("send_cycle")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP894" and cause["ranks"] == [0, 1], rep["findings"]
    sent = line_of("p2p_send_cycle.py", "dist.send(")
    assert cause["message"].startswith(
        "every rank waits in torch.distributed.send: each sends to a peer that is itself sending (a send/recv "
        "cycle), and no rank receives. rank 0: ")
    assert cause["message"].count(f"{sent} in <module>") == 2, cause["message"]
    [hang] = [f for f in rep["findings"] if f["id"] == "DDP801"]
    assert hang["caused_by"] == "DDP894" and "every rank waits in send (DDP894, the root cause)" in hang["message"]
    assert cause["cause_class"] == "code"


def test_a_rank_that_left_with_os_exit_0_is_the_cause_not_the_rank_that_then_failed():
    code, rep = ran("os_exit_0")
    assert code == 1, rep["findings"]  # rank 0's own status: it raised
    cause = rep["root_cause"]
    assert cause["id"] == "DDP812" and cause["ranks"] == [1], rep["findings"]
    left = line_of("rank1_os_exit_0.py", "        os._exit(0)")
    assert cause["message"].startswith("rank 1 ended its process with os._exit(0) at ")
    assert cause["message"].endswith(f"{left} while rank 0 still ran, and failed after it"), cause["message"]
    [peer] = [f for f in rep["findings"] if f["ranks"] == [0] and f["severity"] == "error"]
    assert peer["caused_by"] == "DDP812" and "Connection" in peer["message"]


def test_a_monitored_barrier_that_timed_out_names_the_rank_it_waited_for_and_where_it_was():
    code, rep = ran("late_to_barrier")
    assert code == 1, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP819" and cause["ranks"] == [1], rep["findings"]
    barrier = line_of("rank1_late_to_monitored_barrier.py", "dist.monitored_barrier(")
    slept = line_of("rank1_late_to_monitored_barrier.py", "store.wait([")
    assert cause["message"].startswith("rank 1 did not reach the monitored barrier that rank 0 waited in (at ")
    assert f"{barrier} in <module>) for 3 s: rank 1 was at " in cause["message"]
    assert cause["message"].endswith(f"{slept} in <module>"), cause["message"]
    [waited] = [f for f in rep["findings"] if f["id"] == "DDP825"]
    assert waited["ranks"] == [0] and waited["caused_by"] == "DDP819"


def test_a_rank_written_by_hand_is_reported_at_once():
    code, rep = ran("handset_rank")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP867" and cause["ranks"] == [0, 1], rep["findings"]
    assert "joined with rank 0 (rank=0 passed at" in cause["message"]
    assert line_of("handset_rank.py", "dist.init_process_group(") in cause["message"]
    assert "the launcher gave RANK=0, RANK=1" in cause["message"]
    # ended by the judgement of the init calls, not by the 60 s hang bound
    assert not [f for f in rep["findings"] if f["id"] == "DDP801"], rep["findings"]


def test_a_world_size_changed_by_the_script_is_reported_at_once():
    code, rep = ran("env_world")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP868" and cause["ranks"] == [0, 1], rep["findings"]
    assert "joined a world of 4" in cause["message"] and "the launcher started 2" in cause["message"]
    assert "the launcher set '2'; the script changed it" in cause["message"]
    assert not [f for f in rep["findings"] if f["id"] == "DDP801"], rep["findings"]


def test_correct_patterns_stay_clean():
    code, rep = ran("correct")
    assert code == 0, rep["findings"]
    # the preflight's timing warnings depend on the machine's load, not on the script
    assert not [f for f in rep["findings"] if f["severity"] in ("error", "warning")
                and f["id"] not in TIMING_WARNINGS], rep["findings"]


# ----------------------------------------------------------------------------- who went its own way

def test_a_barrier_indented_into_the_rank0_block_names_rank_0_and_its_line():
    code, rep = ran("barrier_in_block")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert line_of("barrier_in_rank0_block.py", "dist.barrier()") in cause["message"]
    assert "rank 1 issued all_reduce" in cause["message"] and cause["evidence"]["decided_by"] == "new_call"
    # the hang names the rank that went its own way, never the one that only waited
    (hang,) = [f for f in rep["findings"] if f["id"] == "DDP801"]
    assert hang["ranks"] == [0] and hang["evidence"]["explained_by"] == "DDP893", hang
    assert not [f for f in errors(rep) if f["ranks"] == [1] and not f["evidence"].get("consequence")]


def test_an_evaluation_on_rank_0_only_after_training_names_rank_0_not_the_rank_that_ended():
    code, rep = ran("extra_eval")
    assert code != 0, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [0], rep["findings"]
    assert line_of("rank0_evaluates_after_training.py", "dist.all_reduce(loss)") in cause["message"]
    assert "rank 1 finished after the same" in cause["message"] and "4 steps done on each" in cause["message"]
    assert not [f for f in rep["findings"] if f["id"] == "DDP892"], rep["findings"]
    # rank 0's "Connection closed by peer" is the consequence of its own extra collective
    assert all(f["evidence"].get("consequence") for f in errors(rep) if f["id"] != "DDP893"), rep["findings"]


def test_a_rank_that_left_its_loop_on_its_own_data_is_named_not_the_rank_still_training():
    code, rep = ran("nan_break")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP893" and cause["ranks"] == [1], rep["findings"]
    assert line_of("leaves_loop_on_nan.py", "dist.barrier()") in cause["message"]
    assert "rank 0 issued all_reduce" in cause["message"]
    (hang,) = [f for f in rep["findings"] if f["id"] == "DDP801"]
    assert hang["ranks"] == [1], hang
