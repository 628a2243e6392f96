"""A rank that crashed inside a collective (a native abort: gloo's "Received data size doesn't
match ... collective mismatch?") leaves no ledger, only faulthandler's dump: what it issued is
inferred from the dump and its peers' ledgers (ddp_doctor/checks/crash_ledgers.py) and judged with
them (checks/collectives.py), and the source's rank-conditional branches decide what the ledgers
cannot. The dumps are shaped as torch 2.13's gloo abort leaves them: no Python thread "current"."""
from __future__ import annotations

import signal
from typing import Any

from checks.test_collectives import ddp_construction, entry, ledger, steps

from ddp_doctor.checks.collectives import ledger_findings
from ddp_doctor.checks.crash_ledgers import crash_ledgers, crash_site
from ddp_doctor.checks.job import JobEvidence, job_findings
from ddp_doctor.checks.rank_endings import crashing_frames, native_crash_finding
from ddp_doctor.facts.frames import collective_of_frame, dumped_threads, thread_in_collective

LIB = "/usr/lib/python3.11/site-packages/torch"
SCRIPT = "/work/job/train.py"


def abort_dump(*inner: tuple[str, int, str], current: bool = False) -> str:
    """faulthandler's text at a SIGABRT raised on a thread of gloo's own: the watchdog's Python
    thread, then the main thread, `inner` its innermost frames (above the script's module frame)."""
    main = [f'  File "{f}", line {ln} in {fn}' for f, ln, fn in inner]
    main += ['  File "<frozen runpy>", line 88 in _run_code']
    header = "Current thread 0x00007f00d89f7b80" if current else "Thread 0x00007f00d89f7b80"
    return "\n".join([
        "Fatal Python error: Aborted", "",
        "Thread 0x00007f00b8b296c0 (most recent call first):",
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait',
        '  File "/opt/ddp_doctor/training/run/watchdog.py", line 260 in _tick', "",
        f"{header} (most recent call first):", *main, "",
        "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)"])


def in_all_reduce(line: int, op: str = "all_reduce") -> str:
    return abort_dump((f"{LIB}/distributed/distributed_c10d.py", 3252, op),
                      (f"{LIB}/distributed/c10d_logger.py", 83, "wrapper"),
                      (f"{SCRIPT}", line, "<module>"))


def in_backward(line: int) -> str:
    return abort_dump((f"{LIB}/autograd/graph.py", 979, "_engine_run_backward"),
                      (f"{LIB}/autograd/__init__.py", 395, "backward"),
                      (f"{LIB}/_tensor.py", 623, "backward"),
                      (f"{SCRIPT}", line, "<module>"))


def at(line: int) -> str:
    return f"{SCRIPT}:{line}"


# ------------------------------------------------------------------------------ the dump

def test_the_thread_inside_a_collective_is_found_when_no_thread_took_the_signal() -> None:
    dump = in_all_reduce(11)
    assert [t.current for t in dumped_threads(dump)] == [False, False]
    thread, op, index = thread_in_collective(dump)
    assert op == "all_reduce" and thread.frames[index][2] == "all_reduce"
    assert crash_site(dump) == {"op": "all_reduce", "site": at(11), "function": "<module>", "callers": [],
                                "ops": ["all_reduce"]}
    assert crashing_frames(dump)[-2] == (SCRIPT, 11, "<module>")  # the main thread, not the watchdog's


def test_a_backward_is_a_ddp_gradient_all_reduce() -> None:
    assert crash_site(in_backward(9))["op"] == "backward" and crash_site(in_backward(9))["site"] == at(9)
    assert collective_of_frame(f"{LIB}/autograd/graph.py", "_engine_run_backward") == "backward"
    # a user's own file that happens to share a name is not torch's
    assert collective_of_frame("/work/job/graph.py", "_engine_run_backward") is None
    assert collective_of_frame("/work/job/distributed_c10d.py", "all_reduce") is None


def test_no_collective_in_the_dump_infers_nothing() -> None:
    dump = abort_dump((f"{SCRIPT}", 5, "<module>"))
    assert crash_site(dump) is None
    peer = ledger(1, ddp_construction() + [entry(4, "all_reduce", [[10]], failed_here=True)], "failed")
    assert crash_ledgers({0: (dump, 1.0)}, {1: peer}) == {}


def test_the_native_crash_says_where_and_inside_what() -> None:
    f = native_crash_finding(0, -signal.SIGABRT, in_all_reduce(11), 2.0)
    assert f"at {SCRIPT}:11 in <module> (inside torch.distributed.all_reduce)" in f.message
    assert "no Python frame" not in f.message
    f = native_crash_finding(0, -signal.SIGABRT, in_backward(9), 2.0)
    assert "in a DDP model's backward" in f.message


# ------------------------------------------------------------------------------ the verdict

def crashed(rank: int, dump: str, peer: dict[str, Any], **kw: Any) -> tuple[list[Any], int]:
    """The job's verdict when `rank` aborted with `dump` and its peer left `peer`."""
    other = int(peer["rank"])
    ev = JobEvidence(ranks=[0, 1], exits={rank: -signal.SIGABRT, other: 1},
                     outcomes={other: {"exit_code": 1, "time": 3.0, "exception": {
                         "type": "RuntimeError", "time": 3.0,
                         "message": "[pair.cc:537] Read error [127.0.0.1]:5025: Connection reset by peer"}}},
                     crashes={rank: (dump, 2.5)}, ledgers={other: peer}, **kw)
    return job_findings(ev)


def test_a_metric_all_reduce_only_rank_0_reaches_is_named_at_its_line() -> None:
    """Rank 0 reduces a metric in `if rank == 0:` after its steps; rank 1's next backward pairs with
    it and gloo aborts rank 0. Rank 1's ledger fails in its gradient all_reduce."""
    peer = ledger(1, ddp_construction() + steps(4, 3) + [entry(7, "all_reduce", [[10]], failed_here=True)],
                  "failed", steps=3, complete=True)
    findings, code = crashed(0, in_all_reduce(11), peer)
    cause = [f for f in findings if f.severity == "error" and f.caused_by is None]
    assert [f.id for f in cause] == ["DDP893"] and cause[0].ranks == [0], findings
    assert f"issued all_reduce (where it crashed) at {at(11)}" in cause[0].message
    assert "a collective no other rank issued" in cause[0].message
    assert "rank 1 issued all_reduce Float[10]" in cause[0].message
    crash = next(f for f in findings if f.id == "DDP807")
    assert crash.caused_by == "DDP893"  # gloo's abort answered the mismatch
    assert code == 134


def test_the_rank_that_skipped_a_routine_call_is_named_not_the_one_that_crashed() -> None:
    """Every step both ranks run backward then a metric all_reduce at line 13; rank 0 skips the
    metric on step 1 (a branch on its own data), so its next backward pairs with rank 1's metric.
    Rank 1 aborts in the metric at line 13, a routine call; rank 0's backward came out of order."""
    metric = dict(user_site=at(13))
    history = ddp_construction() + [entry(4, "all_reduce", [[10]]), entry(5, "all_reduce", [[1]], **metric),
                                    entry(6, "all_reduce", [[10]])]
    peer = ledger(0, history + [entry(7, "all_reduce", [[10]], failed_here=True)], "failed", steps=2, complete=True)
    findings, _ = crashed(1, in_all_reduce(13), peer)
    cause = next(f for f in findings if f.severity == "error" and f.caused_by is None)
    assert cause.id == "DDP893" and cause.ranks == [0], findings
    assert "out of the order every rank had kept" in cause.message
    assert f"rank 1 issued all_reduce (where it crashed) at {at(13)}" in cause.message


def test_a_call_the_peer_completed_is_not_a_new_call() -> None:
    """all_gather of tensors sized by each rank's data: rank 1 got what it expected and went on,
    rank 0 aborted inside the same call (same line): the ledgers cannot say more than the crash,
    and no rank is blamed for a call it never made."""
    peer = ledger(1, [entry(1, "all_gather", [[4]], user_site=at(7))], "destroyed", steps=0, complete=True)
    inferred = crash_ledgers({0: (in_all_reduce(7, "all_gather"), 2.5)}, {1: peer})
    assert [e["collective_seq_id"] for e in inferred[0]["entries"]] == [1]  # the call rank 1 took part in
    assert ledger_findings({1: peer, **inferred}) == []
    findings, _ = crashed(0, in_all_reduce(7, "all_gather"), peer)
    cause = next(f for f in findings if f.severity == "error" and f.caused_by is None)
    assert cause.id == "DDP807" and "inside torch.distributed.all_gather" in cause.message


def test_the_inferred_ledger_copies_what_the_peer_saw_complete() -> None:
    peer = ledger(1, ddp_construction() + steps(4, 2) + [entry(6, "all_reduce", [[10]], failed_here=True)],
                  "failed", complete=True)
    inferred = crash_ledgers({0: (in_all_reduce(11), 2.5)}, {1: peer})[0]
    seqs = [(e["collective_seq_id"], e.get("failed_here", False)) for e in inferred["entries"]]
    assert seqs == [(1, False), (2, False), (3, False), (4, False), (5, False), (6, True)]
    assert inferred["source"] == "crash_dump" and inferred["where"] == f"{at(11)} in <module>"
    assert all(e["inferred"] == "crash_dump" for e in inferred["entries"])
    # a rank that left a ledger of its own keeps it
    assert crash_ledgers({1: (in_all_reduce(11), 2.5)}, {1: peer}) == {}


# ------------------------------------------------------------------------------ the source decides

def test_a_first_call_inside_a_rank_branch_is_the_rank_that_went_its_own_way() -> None:
    """No history: rank 0's all_reduce and rank 1's barrier are both first calls; the source shows
    rank 0's inside `if dist.get_rank() == 0:` and rank 1's outside any rank branch."""
    branch = {at(7): [{"line": 6, "condition": "dist.get_rank() == 0", "taken_when": "true", "reads": "get_rank()"}],
              at(8): []}
    leds = {0: ledger(0, [entry(1, "all_reduce", [[2]], retired=False, user_site=at(7))], "hung"),
            1: ledger(1, [entry(1, "barrier", retired=False, user_site=at(8))], "hung")}
    [f] = ledger_findings(leds, branches=branch)
    assert f.id == "DDP893" and f.ranks == [0], f.message
    assert "in a branch that reads the rank (`dist.get_rank() == 0` true there, line 6)" in f.message
    assert "which the other ranks did not enter" in f.message
    assert f.evidence["decided_by"] == "rank_branch"
    assert f.evidence["ranks"]["0"]["rank_branches"][0]["condition"] == "dist.get_rank() == 0"
    # without the source, the ledgers alone cannot tell
    [g] = ledger_findings(leds)
    assert g.id == "DDP890" and g.ranks == [0, 1] and "cannot be told" in g.message


def test_both_calls_in_rank_branches_stay_undecided() -> None:
    branch = {at(7): [{"line": 6, "condition": "rank == 0", "taken_when": "true", "reads": "rank"}],
              at(9): [{"line": 6, "condition": "rank == 0", "taken_when": "false", "reads": "rank"}]}
    leds = {0: ledger(0, [entry(1, "all_reduce", [[2]], retired=False, user_site=at(7))], "hung"),
            1: ledger(1, [entry(1, "barrier", retired=False, user_site=at(9))], "hung")}
    [f] = ledger_findings(leds, branches=branch)
    assert f.id == "DDP890" and f.ranks == [0, 1]
    assert "`rank == 0` true there" in f.message and "`rank == 0` false there" in f.message


# ------------------------------------------------------------------------------ the data decides

def test_a_rank_whose_data_pass_ended_with_fewer_batches_ran_out_first() -> None:
    """Rank 1 left its loop after 4 batches and waits in a barrier; rank 0 drew a 5th and its
    backward issued the next gradient all_reduce: uneven inputs (DDP892), not a barrier of rank
    1's own."""
    common = ddp_construction() + steps(4, 4, params=8)
    leds = {0: ledger(0, common + [entry(8, "all_reduce", [[8]], retired=False)], "hung", steps=4,
                      data_pass={"loader": 0, "batches": 5, "ended": False, "length": 5}),
            1: ledger(1, common + [entry(8, "barrier", retired=False, user_site=at(20))], "hung", steps=4,
                      data_pass={"loader": 0, "batches": 4, "ended": True, "length": 4})}
    [f] = ledger_findings(leds)
    assert f.id == "DDP892" and f.ranks == [1], f.message
    assert "rank 1 ran out of batches first: its DataLoader pass ended after 4 batches, while rank 0 drew 5" \
        in f.message and f"issued barrier at {at(20)}" in f.message
    # a loader that fetches ahead (accelerate's) ends its pass on every rank: fewer batches decide
    leds[0]["data_pass"]["ended"] = True
    assert [g.id for g in ledger_findings(leds)] == ["DDP892"]
    # the same batches on both (a NaN check that left the loop early): the ledgers decide
    leds[1]["data_pass"] = {"loader": 0, "batches": 5, "ended": False, "length": 4}
    leds[0]["data_pass"]["ended"] = False
    [g] = ledger_findings(leds)
    assert g.id == "DDP893" and g.ranks == [1]
    # passes over different loaders say nothing
    leds[1]["data_pass"] = {"loader": 3, "batches": 1, "ended": True, "length": 1}
    assert ledger_findings(leds)[0].id == "DDP893"


def test_a_helper_that_reduces_called_in_a_rank_branch_is_decided_by_its_caller() -> None:
    """`evaluate()` all_reduces at line 5 (no branch there); it is called at line 20 under
    `if rank == 0:`: the caller's branch decides and is quoted with the call's line."""
    branch = {at(5): [], at(20): [{"line": 19, "condition": "rank == 0", "taken_when": "true", "reads": "rank"}],
              at(22): []}
    leds = {0: ledger(0, [entry(1, "all_reduce", [[1]], retired=False, user_site=at(5), user_callers=[at(20)])],
                      "hung"),
            1: ledger(1, [entry(1, "barrier", retired=False, user_site=at(22))], "hung")}
    [f] = ledger_findings(leds, branches=branch)
    assert f.id == "DDP893" and f.ranks == [0], f.message
    assert f"(`rank == 0` true there, line 19, around the call at {at(20)})" in f.message


def test_the_call_a_crashed_rank_kept_gives_its_tensors() -> None:
    """The same all_gather line on both ranks, tensors sized by each rank's data: rank 1 completed
    it, rank 0 aborted inside it. The call rank 0 kept through the crash (its note) gives its
    tensors: the ranks' shapes differ at that line (DDP890), not just "a crash"."""
    peer = ledger(1, [entry(1, "all_gather", [[4]], user_site=at(7))], "destroyed", steps=0, complete=True)
    note = {"n": 1, "op": "all_gather", "pg": "0", "input_sizes": [[3]], "input_dtypes": ["Float"], "time_ns": 1}
    inferred = crash_ledgers({0: (in_all_reduce(7, "all_gather"), 2.5)}, {1: peer}, {0: note})
    assert inferred[0]["entries"][-1]["input_sizes"] == [[3]]
    [f] = ledger_findings({1: peer, **inferred})
    assert f.id == "DDP890" and f.ranks == [0, 1], f.message
    assert "rank 0 all_gather Float[3] at" in f.message and "rank 1 all_gather Float[4] at" in f.message
    assert "their shape depends on each rank's data" in f.message
    # a note of another call (the crash was elsewhere) is not used
    other = {**note, "op": "broadcast"}
    assert crash_ledgers({0: (in_all_reduce(7, "all_gather"), 2.5)}, {1: peer}, {0: other})[0]["entries"][-1][
        "input_sizes"] == []
