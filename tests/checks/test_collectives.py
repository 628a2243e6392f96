"""The collective ledger's alignment (ddp_doctor/checks/collectives.py): ledgers built from flight
recorder entries shaped exactly as torch 2.13 dumps them on gloo
(_dump_fr_trace_json(includeCollectives=True, onlyActive=False)["entries"])."""
from __future__ import annotations

from typing import Any

import pytest

from ddp_doctor import checks as catalogue
from ddp_doctor.checks.collectives import ledger_findings

T0 = 1795418264335696816


def entry(seq: int, op: str, sizes: list[list[int]] | None = None, dtypes: list[str] | None = None, *,
          record: int | None = None, retired: bool = True, pg: tuple[str, str] = ("0", "default_pg"),
          out: list[list[int]] | None = None, **extra: Any) -> dict[str, Any]:
    sizes = [] if sizes is None else sizes
    dtypes = (["Float"] * len(sizes)) if dtypes is None else dtypes
    e = {'collective_seq_id': seq, 'input_dtypes': dtypes, 'input_sizes': sizes, 'is_p2p': False, 'op_id': seq,
         'output_dtypes': dtypes, 'output_sizes': sizes if out is None else out, 'p2p_seq_id': 0,
         'pg_id': int(pg[0]), 'process_group': list(pg), 'profiling_name': f'gloo:{op}',
         'record_id': seq - 1 if record is None else record, 'retired': retired, 'state': 'scheduled',
         'thread_id': '140605103532928', 'thread_name': 'python', 'time_created_ns': T0 + seq * 1000,
         'time_discovered_completed_ns': 0, 'time_discovered_started_ns': 0, 'timeout_ms': 1800000}
    e.update(extra)
    return e


def ddp_construction(start: int = 1, params: int = 10) -> list[dict[str, Any]]:
    """What DistributedDataParallel(model) issues: its checks, then the parameter broadcast."""
    return [entry(start, "all_gather", [[1]], ["Long"], out=[[2, 1]]),
            entry(start + 1, "broadcast", [[6]], ["Long"]),
            entry(start + 2, "broadcast", [[params]])]


def steps(start: int, n: int, params: int = 10) -> list[dict[str, Any]]:
    """n optimizer steps of one gradient bucket each."""
    return [entry(start + i, "all_reduce", [[params]]) for i in range(n)]


def ledger(rank: int, entries: list[dict[str, Any]], position: str = "running", **kw: Any) -> dict[str, Any]:
    return {"rank": rank, "pid": 100 + rank, "time": 1795418267.2, "source": "flight_recorder",
            "position": position, "entries": entries, **kw}


def real_prefix() -> list[dict[str, Any]]:
    """The real 2-rank run of the brief: a user all_reduce, a barrier, DDP's construction, one backward."""
    return [entry(1, "all_reduce", [[3]]), entry(2, "barrier")] + ddp_construction(3) + steps(6, 1)


def ids(findings: list[Any]) -> list[str]:
    return [f.id for f in findings]


# ----------------------------------------------------------------------------- the catalogue

def test_ids_are_catalogued_with_one_severity() -> None:
    cat = catalogue.load_catalogue()
    for cid in ("DDP890", "DDP891", "DDP892"):
        entry_ = cat[cid]
        assert entry_.category == "training_failure" and entry_.stage == "event"
        assert entry_.severities == ("error",)
        assert all(entry_.sections.get(s) for s in ("What", "Why", "Fix"))


# ----------------------------------------------------------------------------- DDP890

def test_desync_op() -> None:
    a = real_prefix() + [entry(7, "all_reduce", [[3]], user_site="train.py:12", retired=False)]
    b = real_prefix() + [entry(7, "broadcast", [[3]], user_site="train.py:14", retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, b, "hung")})
    assert f.id == "DDP890" and f.severity == "error" and f.phase == "training"
    assert f.message == ("collectives differ at call #7 of process group 0 (default_pg): "
                         "rank 0 all_reduce Float[3] at train.py:12, rank 1 broadcast Float[3] at train.py:14; "
                         "which rank went its own way cannot be told from the ledgers (no call was routine)")
    assert sorted(f.ranks) == [0, 1] and f.evidence["undecided"] is True
    assert f.evidence["collective_seq_id"] == 7
    assert f.evidence["ranks"]["1"]["entry"]["profiling_name"] == "gloo:broadcast"


def test_desync_size_names_the_odd_rank() -> None:
    base = real_prefix()
    good = base + [entry(7, "all_reduce", [[3]], user_site="train.py:12")]
    bad = base + [entry(7, "all_reduce", [[4]], user_site="train.py:12", retired=False)]
    (f,) = ledger_findings({0: ledger(0, good), 1: ledger(1, bad), 2: ledger(2, list(good))})
    assert f.id == "DDP890"
    assert "call #7" in f.message
    assert "ranks 0, 2 all_reduce Float[3] at train.py:12" in f.message
    assert "rank 1 all_reduce Float[4] at train.py:12" in f.message
    assert f.ranks == [1]
    # only the first disagreement: later calls are shifted and say nothing more
    more = bad + [entry(8, "broadcast", [[1]])]
    assert ids(ledger_findings({0: ledger(0, good), 1: ledger(1, more)})) == ["DDP890"]


def test_desync_dtype() -> None:
    a = real_prefix() + [entry(7, "all_reduce", [[3]], ["Float"])]
    b = real_prefix() + [entry(7, "all_reduce", [[3]], ["Double"])]
    (f,) = ledger_findings({0: ledger(0, a), 1: ledger(1, b)})
    assert f.id == "DDP890"
    assert "rank 0 all_reduce Float[3], rank 1 all_reduce Double[3]" in f.message


def test_desync_site_from_frames() -> None:
    frames = [{"name": "all_reduce", "filename": "/usr/lib/python3/site-packages/torch/distributed/c10d.py",
               "line": 2800},
              {"name": "main", "filename": "/job/train.py", "line": 12}]
    a = [entry(1, "all_reduce", [[3]], frames=frames)]
    b = [entry(1, "all_reduce", [[5]], frames=frames)]
    (f,) = ledger_findings({0: ledger(0, a), 1: ledger(1, b)})
    assert "rank 0 all_reduce Float[3] at train.py:12" in f.message


def test_all_gather_outputs_and_uneven_all_to_all_are_not_a_mismatch() -> None:
    # all_gather's output includes the world; all_to_all's inputs differ by the splits
    a = [entry(1, "all_gather", [[1]], ["Long"], out=[[2, 1]]), entry(2, "all_to_all", [[3]], out=[[2]]),
         entry(3, "scatter", [[2, 2]], out=[[2]])]
    b = [entry(1, "all_gather", [[1]], ["Long"], out=[[3, 1]]), entry(2, "all_to_all", [[2]], out=[[3]]),
         entry(3, "scatter", [], [], out=[[2]])]
    assert ledger_findings({0: ledger(0, a), 1: ledger(1, b)}) == []


# ----------------------------------------------------------------------------- DDP891

def test_rank_waits_while_other_is_elsewhere() -> None:
    a = real_prefix() + [entry(7, "all_reduce", [[1]], user_site="train.py:33", retired=False)]
    b = real_prefix()
    (f,) = ledger_findings({0: ledger(0, a, "hung", steps=1, where="train.py:33 in main"),
                            1: ledger(1, b, "hung", steps=1, where="train.py:40 in save_checkpoint")})
    assert f.id == "DDP891" and f.severity == "error"
    assert f.ranks == [1]  # the cause, not the waiting rank
    assert f.message == ("rank 0 waits in all_reduce #7 of process group 0 (default_pg) (issued at train.py:33); "
                         "rank 1 never issued #7 (its last was #6): it is at train.py:40 in save_checkpoint")
    assert f.evidence["ranks"]["0"]["consequence"] is True
    assert f.evidence["ranks"]["1"]["where"] == "train.py:40 in save_checkpoint"
    assert "consequence" not in f.evidence["ranks"]["1"]


def test_rank_that_issued_nothing_while_others_wait() -> None:
    a = [entry(1, "all_reduce", [[3]], retired=False)]
    b = [entry(1, "all_reduce", [[2]], pg=("1", "undefined"))]  # a complete record with no default-group call
    (f,) = ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, b, "hung", where="train.py:5 in <module>")})
    assert f.id == "DDP891" and f.ranks == [1]
    assert "rank 1 never issued #1 (it issued none): it is at train.py:5 in <module>" in f.message


def test_rank_waiting_in_another_group_is_named_there() -> None:
    sub = ("1", "undefined")
    a = [entry(1, "all_reduce", [[3]]), entry(2, "all_reduce", [[3]], retired=False)]
    b = [entry(1, "all_reduce", [[3]]), entry(1, "all_reduce", [[2]], pg=sub, record=1, retired=False)]
    findings = ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, b, "hung")})
    default = [f for f in findings if f.evidence["process_group"]["id"] == "0"]
    assert [f.id for f in default] == ["DDP891"]
    assert "it waits in all_reduce #1 of process group 1" in default[0].message


def test_shorter_rank_just_earlier_is_no_finding() -> None:
    # rank 1 was dumped a moment earlier: everything it issued is retired and nobody waits beyond it
    a = real_prefix() + steps(7, 3)
    b = real_prefix() + steps(7, 1)
    assert ledger_findings({0: ledger(0, a), 1: ledger(1, b)}) == []


def test_rank_dumped_before_the_others_issued_the_call_is_not_judged() -> None:
    a = real_prefix() + [entry(7, "all_reduce", [[10]], retired=False)]
    before = (T0 + 7 * 1000 - 500) / 1e9  # rank 1 wrote its ledger just before rank 0 issued #7
    assert ledger_findings({0: ledger(0, a, "hung"), 1: dict(ledger(1, real_prefix()), time=before)}) == []
    after = (T0 + 7 * 1000 + 10**9) / 1e9
    assert ids(ledger_findings({0: ledger(0, a, "hung"), 1: dict(ledger(1, real_prefix()), time=after)})) == ["DDP891"]
    # a rank that finished wrote its final record: when it wrote it does not matter
    finished = dict(ledger(1, real_prefix(), "finished"), time=before)
    assert ids(ledger_findings({0: ledger(0, a, "hung"), 1: finished})) == ["DDP892"]


def test_failed_rank_is_left_to_its_own_exception() -> None:
    a = real_prefix() + [entry(7, "all_reduce", [[10]], retired=False)]
    assert ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, real_prefix(), "failed")}) == []


# ----------------------------------------------------------------------------- DDP892

def test_uneven_inputs_with_steps() -> None:
    a = ddp_construction() + steps(4, 3) + [entry(7, "all_reduce", [[10]], retired=False)]
    b = ddp_construction() + steps(4, 3)
    (f,) = ledger_findings({0: ledger(0, a, "hung", steps=3), 1: ledger(1, b, "finished", steps=3)})
    assert f.id == "DDP892" and f.severity == "error"
    assert f.ranks == [1]
    assert f.message == ("rank 1 ran 3 steps and finished after 6 collectives of process group 0 (default_pg); "
                         "rank 0 (3 steps done) waits in all_reduce #7, which rank 1 never issued")
    assert f.evidence["steps"] == {"0": 3, "1": 3}
    assert f.evidence["ranks"]["0"]["consequence"] is True
    assert "Join" in f.hint and "drop_last" in f.hint


def test_a_rank_that_issued_no_collective_before_it_ended_left_early_not_for_uneven_batches() -> None:
    # `if len(shard) < 5: return` on rank 1, before the first all_reduce rank 0 waits in
    a = [entry(1, "all_reduce", [[1]], user_site="train.py:14", retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung", steps=0), 1: ledger(1, [], "finished", steps=0, complete=True)})
    assert f.id == "DDP892" and f.ranks == [1]
    assert f.message.startswith("rank 1 ran 0 steps and finished after 0 collectives of process group 0")
    assert "issued no collective at all" in f.hint and "drop_last" not in f.hint


def test_uneven_inputs_destroyed_without_steps() -> None:
    a = ddp_construction() + steps(4, 2) + [entry(6, "all_reduce", [[10]], retired=False)]
    b = ddp_construction() + steps(4, 2)
    (f,) = ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, b, "destroyed")})
    assert f.id == "DDP892" and f.ranks == [1]
    assert "rank 1 destroyed its process group" in f.message and "steps" not in f.message


def test_mixed_world_names_each_cause_once() -> None:
    waiting = ddp_construction() + steps(4, 2) + [entry(6, "all_reduce", [[10]], retired=False)]
    done = ddp_construction() + steps(4, 2)
    found = ledger_findings({0: ledger(0, waiting, "hung"), 1: ledger(1, done, "finished"),
                             2: ledger(2, list(done), "running", where="train.py:50 in evaluate"),
                             3: ledger(3, list(waiting), "hung")})
    assert sorted((f.id, tuple(f.ranks)) for f in found) == [("DDP891", (2,)), ("DDP892", (1,))]
    assert all("ranks 0, 3 wait in all_reduce #6" in f.message for f in found)


# ----------------------------------------------------------------------------- silence on correct runs

def test_identical_ledgers() -> None:
    a = real_prefix()
    assert ledger_findings({0: ledger(0, a, "finished"), 1: ledger(1, [dict(e) for e in a], "finished")}) == []


def test_ddp_construction_and_steps_with_no_sync_accumulation() -> None:
    # gradient accumulation with no_sync: one all_reduce every 4 micro-batches, the same on every rank
    a = ddp_construction() + steps(4, 5)
    found = ledger_findings({r: ledger(r, [dict(e) for e in a], "finished", steps=5) for r in range(4)},
                            world_size=4)
    assert found == []


def test_rank0_evaluation_issues_nothing_extra() -> None:
    a = ddp_construction() + steps(4, 3) + [entry(7, "barrier")]
    assert ledger_findings({0: ledger(0, a, "finished", steps=3),
                            1: ledger(1, [dict(e) for e in a], "finished", steps=3)}) == []


def test_second_process_group_aligned_separately() -> None:
    sub = ("1", "undefined")
    a = ddp_construction() + [entry(1, "all_reduce", [[2]], pg=sub, record=3)] + steps(4, 2)
    for i, e in enumerate(a):
        e["record_id"] = i
    b = [dict(e) for e in a]
    c = [e for e in ddp_construction() + steps(4, 2)]  # rank 2 is not in group 1
    for i, e in enumerate(c):
        e["record_id"] = i
    assert ledger_findings({0: ledger(0, a, "finished"), 1: ledger(1, b, "finished"),
                            2: ledger(2, c, "finished")}) == []


def test_second_process_group_mismatch_is_found_there() -> None:
    sub = ("1", "undefined")
    a = ddp_construction() + [entry(1, "all_reduce", [[2]], pg=sub, record=3)]
    b = ddp_construction() + [entry(1, "all_reduce", [[8]], pg=sub, record=3)]
    (f,) = ledger_findings({0: ledger(0, a), 1: ledger(1, b)})
    assert f.id == "DDP890"
    assert "call #1 of process group 1:" in f.message
    assert f.evidence["process_group"] == {"id": "1", "name": "undefined"}


def test_point_to_point_entries_are_not_aligned() -> None:
    # a send/recv carries the collective counter of the last collective (NCCL records it so); only
    # rank 0 sent here, which is no collective mismatch
    a = real_prefix() + [entry(6, "send", [[4]], is_p2p=True, p2p_seq_id=1, record=6)]
    b = real_prefix()
    assert ledger_findings({0: ledger(0, a), 1: ledger(1, b)}) == []


def test_ranks_all_in_flight_name_no_cause() -> None:
    # both ranks wait in #7 (rank 0 also queued #8 asynchronously): nobody is outside a collective
    a = real_prefix() + [entry(7, "all_reduce", [[10]], retired=False), entry(8, "all_reduce", [[10]], retired=False)]
    b = real_prefix() + [entry(7, "all_reduce", [[10]], retired=False)]
    assert ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, b, "hung")}) == []


@pytest.mark.parametrize("other", [None, {}, {"rank": 1, "entries": []}, {"rank": 1}])
def test_empty_or_missing_ledger_is_not_judged(other: dict[str, Any] | None) -> None:
    a = real_prefix() + [entry(7, "all_reduce", [[10]], retired=False)]
    ledgers: dict[int, Any] = {0: ledger(0, a, "hung")}
    if other is not None:
        ledgers[1] = other
    assert ledger_findings(ledgers) == []


def test_an_empty_ledger_that_lost_nothing_is_a_rank_that_issued_none() -> None:
    # the collector cut the ledger to the script's calls and says nothing was lost: rank 1 issued
    # no collective while rank 0 waits in one (rank 1 sleeps at x.py:9)
    a = real_prefix() + [entry(7, "all_reduce", [[10]], retired=False)]
    empty = {"rank": 1, "entries": [], "complete": True, "position": "running", "where": "x.py:9 in <module>"}
    found = ledger_findings({0: ledger(0, a, "hung"), 1: empty})
    assert ids(found) == ["DDP891"] and found[0].ranks == [1]
    assert "rank 1 never issued #7 (it issued none): it is at x.py:9 in <module>" in found[0].message
    assert ledger_findings({0: ledger(0, a, "hung"), 1: {**empty, "complete": False}}) == []


def test_wrapped_recorder_does_not_judge_lost_calls() -> None:
    # rank 1's ring buffer wrapped (its first kept record is not record 0): that it holds no call of
    # the default group says nothing, while the same record kept whole would (DDP891)
    a = real_prefix() + [entry(7, "all_reduce", [[10]], retired=False)]
    sub = ("1", "undefined")
    kept = [entry(s, "all_reduce", [[2]], pg=sub, record=s + 100) for s in range(1, 4)]
    assert ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, kept, "hung")}) == []
    whole = [entry(s, "all_reduce", [[2]], pg=sub, record=s - 1) for s in range(1, 4)]
    assert ids(ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, whole, "hung")})) == ["DDP891"]


def test_world_size_bounds_ranks() -> None:
    a = real_prefix()
    b = real_prefix()[:-1] + [entry(6, "all_reduce", [[99]])]
    assert ids(ledger_findings({0: ledger(0, a), 1: ledger(1, b)}, world_size=2)) == ["DDP890"]
    assert ledger_findings({0: ledger(0, a), 1: ledger(1, b)}, world_size=1) == []


# ----------------------------------------------------------------------------- DDP893: who went its own way

def test_a_barrier_only_rank_0_reaches_names_rank_0_not_the_rank_in_the_next_step() -> None:
    # `if rank == 0: save(); dist.barrier()` after 3 steps: rank 1 goes on to step 4's all_reduce
    done = ddp_construction() + steps(4, 3)
    a = done + [entry(7, "barrier", user_site="train.py:25", retired=False)]
    b = [dict(e) for e in done] + [entry(7, "all_reduce", [[10]], retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung", steps=3), 1: ledger(1, b, "hung", steps=3)})
    assert f.id == "DDP893" and f.ranks == [0], f.message
    assert f.message == ("rank 0 went its own way at call #7 of process group 0 (default_pg): issued barrier at "
                         "train.py:25, a collective no other rank issued; rank 1 issued all_reduce Float[10], "
                         "as every rank had before (3 steps done on each)")
    assert f.evidence["decided_by"] == "new_call"
    assert f.evidence["ranks"]["1"]["consequence"] is True and "consequence" not in f.evidence["ranks"]["0"]


def test_a_rank_that_broke_out_of_its_loop_into_a_barrier_is_named() -> None:
    # rank 1 sees a NaN at step 4 and breaks to the barrier before destroy; rank 0 is in step 5
    done = ddp_construction() + steps(4, 4)
    a = done + [entry(8, "all_reduce", [[10]], retired=False)]
    b = [dict(e) for e in done] + [entry(8, "barrier", user_site="train.py:31", retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung", steps=4), 1: ledger(1, b, "hung", steps=4)})
    assert f.id == "DDP893" and f.ranks == [1]
    assert "rank 1 went its own way at call #8" in f.message and "barrier at train.py:31" in f.message


def test_a_metric_reduced_on_rank_0_only_is_named_with_its_line() -> None:
    # Lightning's self.log(..., sync_dist=True) under is_global_zero: a scalar all_reduce
    done = ddp_construction() + steps(4, 2)
    a = done + [entry(6, "all_reduce", [[]], user_site="model.py:40", retired=False)]
    b = [dict(e) for e in done] + [entry(6, "all_reduce", [[10]], retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, b, "hung")})
    assert f.id == "DDP893" and f.ranks == [0] and "all_reduce Float[] at model.py:40" in f.message


def test_an_extra_collective_after_training_names_the_rank_that_issued_it_not_the_one_that_ended() -> None:
    # both ranks ran the same 3 steps; then rank 0 alone evaluates, and its evaluation gathers
    done = ddp_construction() + steps(4, 3)
    a = done + [entry(7, "all_reduce", [[1]], user_site="train.py:44", retired=False)]
    b = [dict(e) for e in done]
    (f,) = ledger_findings({0: ledger(0, a, "hung", steps=3), 1: ledger(1, b, "finished", steps=3)})
    assert f.id == "DDP893" and f.ranks == [0]
    assert f.message == ("rank 0 went its own way after call #6 of process group 0 (default_pg): waits in "
                         "all_reduce Float[1] at train.py:44 (#7), a collective no other rank issued; rank 1 "
                         "finished after the same 6 collectives (3 steps done on each)")


def test_a_rank_that_ran_fewer_steps_left_early_whatever_the_others_wait_in() -> None:
    # uneven inputs with an epoch-end metric: rank 1 ran out after 2 steps; rank 0 ran 3, then waits
    # in the epoch-end all_reduce rank 1 never reached
    a = ddp_construction() + steps(4, 3) + [entry(7, "all_reduce", [[1]], user_site="train.py:44", retired=False)]
    b = ddp_construction() + steps(4, 2)
    (f,) = ledger_findings({0: ledger(0, a, "hung", steps=3), 1: ledger(1, b, "finished", steps=2)})
    assert f.id == "DDP892" and f.ranks == [1] and f.evidence["decided_by"] == "left_early"


def test_a_call_out_of_the_kept_order_is_the_odd_one() -> None:
    # a model with buffers: every step broadcasts them, then reduces gradients. Rank 0 runs one
    # evaluation forward through the DDP wrapper: broadcast, broadcast; rank 1 keeps the order
    bcast = lambda seq, **kw: entry(seq, "broadcast", [[4]], **kw)  # noqa: E731
    grads = lambda seq, **kw: entry(seq, "all_reduce", [[10]], **kw)  # noqa: E731
    done = ddp_construction() + [bcast(4), grads(5), bcast(6), grads(7), bcast(8)]
    a = done + [bcast(9, retired=False)]
    b = [dict(e) for e in done] + [grads(9, retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung", where="train.py:50 in evaluate"), 1: ledger(1, b, "hung")})
    assert f.id == "DDP893" and f.ranks == [0] and f.evidence["decided_by"] == "new_order"
    assert "out of the order every rank had kept (never before right after broadcast Float[4])" in f.message


def test_a_new_call_outweighs_the_majority() -> None:
    # `if rank in (0, 1): dist.barrier()` in a world of 3: the two ranks with the barrier went their way
    done = ddp_construction() + steps(4, 2)
    mine = [entry(6, "barrier", user_site="train.py:9", retired=False)]
    theirs = [entry(6, "all_reduce", [[10]], retired=False)]
    (f,) = ledger_findings({0: ledger(0, done + mine), 1: ledger(1, [dict(e) for e in done] + mine),
                            2: ledger(2, [dict(e) for e in done] + theirs)})
    assert f.id == "DDP893" and f.ranks == [0, 1]


def test_the_same_line_with_other_shapes_says_the_shape_depends_on_the_data() -> None:
    a = real_prefix() + [entry(7, "all_gather", [[3]], user_site="train.py:20", retired=False)]
    b = real_prefix() + [entry(7, "all_gather", [[5]], user_site="train.py:20", retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, b, "hung")})
    assert f.id == "DDP890" and f.ranks == [0, 1] and f.evidence["undecided"] is True
    assert f.message.endswith("every rank issued it from the same line with other tensors: their shape "
                              "depends on each rank's data")


def test_the_same_line_with_another_dtype_says_the_dtype_differs() -> None:
    # `torch.tensor([loss], dtype=torch.float32 if rank == 0 else torch.float64)`: one shape, two dtypes
    a = real_prefix() + [entry(7, "all_reduce", [[1]], ["Float"], user_site="train.py:20", retired=False)]
    b = real_prefix() + [entry(7, "all_reduce", [[1]], ["Double"], user_site="train.py:20", retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, b, "hung")})
    assert f.id == "DDP890" and f.ranks == [0, 1] and f.evidence["undecided"] is True
    assert "rank 0 all_reduce Float[1] at train.py:20, rank 1 all_reduce Double[1] at train.py:20" in f.message
    assert f.message.endswith("their dtype differs between ranks (each rank made or cast its tensor by a rule "
                              "that depends on the rank or its data)")
    assert "shape" not in f.message.split("; ")[-1]
    both = real_prefix() + [entry(7, "all_reduce", [[2]], ["Double"], user_site="train.py:20", retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung"), 1: ledger(1, both, "hung")})
    assert f.message.endswith("their shape and dtype depend on each rank's data")


def test_a_finished_rank_whose_last_call_was_not_yet_retired_waits_in_nothing() -> None:
    # seen on gloo: the script ended right after DDP's last bucket, before the recorder retired it
    done = ddp_construction() + steps(4, 2)
    a = done + steps(6, 1) + [entry(7, "all_reduce", [[1]], user_site="train.py:44", retired=False)]
    b = [dict(e) for e in done] + steps(6, 1)
    b[-1]["retired"] = False
    (f,) = ledger_findings({0: ledger(0, a, "failed", steps=3), 1: ledger(1, b, "finished", steps=3)})
    assert f.id == "DDP893" and f.ranks == [0]


def test_with_no_call_before_it_a_waiting_ranks_call_is_not_its_own_way() -> None:
    # a test where rank 0 calls barrier() and rank 1 returns: nothing was issued before, so nothing
    # is routine; the rank that never entered the barrier left first (DDP892)
    a = [entry(1, "barrier", user_site="test_x.py:10", retired=False)]
    (f,) = ledger_findings({0: ledger(0, a, "hung"), 1: {"rank": 1, "entries": [], "complete": True,
                                                          "position": "finished"}})
    assert f.id == "DDP892" and f.ranks == [1]
