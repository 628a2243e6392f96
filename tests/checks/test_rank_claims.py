"""A rank claimed twice by processes on different nodes (DDP867 across nodes): the rule over an
init record carrying the other processes' claims from the job's store, and the claims themselves
through a real TCPStore (probes/rank_claims.py)."""
from __future__ import annotations

import threading

import pytest

from ddp_doctor.checks.init_arguments import blocking, init_argument_findings, other_claims, waiting_in_init
from ddp_doctor.training.probes.rank_claims import claim_of, claim_rank

LOCAL = "int(os.environ['LOCAL_RANK'])"


def record(host: str, launcher_rank: int, *, rank_passed: int, pid: int = 4242, done: bool = False,
           ok: bool | None = None, port: str = "29500") -> dict:
    """A launched process's init record on `host` (one process a node: LOCAL_RANK is 0 on each)."""
    env = {"RANK": str(launcher_rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "algo-1",
           "MASTER_PORT": port}
    rec = {"pid": pid, "host": host, "time": 1.0 + launcher_rank, "done": done, "site": "dup.py:6",
           "rank_arg": rank_passed, "world_size_arg": 2, "rank_passed": rank_passed, "world_size_passed": 2,
           "arg_text": {"rank": LOCAL, "world_size": "int(os.environ['WORLD_SIZE'])"}, "init_method": None,
           "store_given": False, "env": env, "launched_rank": True,
           "launcher": {"rank": launcher_rank, "world_size": 2, "env": dict(env)}}
    if ok is not None:
        rec["ok"] = ok
    return rec


def with_claims(rec: dict, *others: dict) -> dict:
    return {**rec, "claims": {"rank": rec["rank_passed"], "number": len(others) + 1,
                              "others": [claim_of(o, o["rank_passed"]) for o in others]}}


def test_a_rank_claimed_on_two_hosts_is_named_with_both_hosts_pids_and_the_line():
    first = record("algo-1", 0, rank_passed=0, pid=4242)
    second = record("algo-2", 1, rank_passed=0, pid=4242)  # the same pid on another host: another process
    for seen_on in (with_claims(second, first), with_claims(first, second)):  # each node's own record
        found = [f for f in init_argument_findings([seen_on]) if f.id == "DDP867"]
        assert len(found) == 1, found
        f = found[0]
        assert f.severity == "error" and list(f.ranks) == [0, 1]
        assert f"ranks 0-1 all joined with rank 0 (rank={LOCAL} passed at dup.py:6)" in f.message
        assert "the launcher gave RANK=0, RANK=1" in f.message
        assert "rank 0 on algo-1 (pid 4242, claimed rank 0, RANK=0)" in f.message
        assert "rank 1 on algo-2 (pid 4242, claimed rank 0, RANK=1)" in f.message
        assert f.evidence["hosts"] == ["algo-1", "algo-2"]
        assert "RANK" in (f.hint or "") and "GROUP_RANK" in (f.hint or "")
        assert not [g for g in init_argument_findings([seen_on]) if g.id == "DDP869"]  # not a mere renumbering
        assert blocking(init_argument_findings([seen_on]), [seen_on])


def test_a_failed_init_after_the_other_node_ended_the_job_still_counts_as_waiting():
    failed = with_claims(record("algo-2", 1, rank_passed=0, done=True, ok=False), record("algo-1", 0, rank_passed=0))
    assert waiting_in_init(failed)
    assert blocking(init_argument_findings([failed]), [failed])
    plain_failure = record("algo-2", 1, rank_passed=1, done=True, ok=False)
    assert not waiting_in_init(plain_failure)


def test_the_right_rank_on_each_host_gives_no_finding():
    one = {**record("algo-1", 0, rank_passed=0), "claims": {"rank": 0, "number": 1}}
    two = {**record("algo-2", 1, rank_passed=1), "claims": {"rank": 1, "number": 1}}
    assert init_argument_findings([one]) == [] and init_argument_findings([two]) == []
    # a second init in the same process claims its rank again: its own earlier claim is no duplicate
    again = with_claims(record("algo-1", 0, rank_passed=0), record("algo-1", 0, rank_passed=0))
    assert other_claims(again) == [] and init_argument_findings([again]) == []


def test_a_duplicate_on_one_node_is_named_once_from_the_records_and_the_claims():
    a, b = record("algo-1", 0, rank_passed=0, pid=10), record("algo-1", 1, rank_passed=0, pid=11)
    found = [f for f in init_argument_findings([a, with_claims(b, a)]) if f.id == "DDP867"]
    assert len(found) == 1 and len(found[0].evidence["calls"]) == 2
    assert "algo-1 (pid" not in found[0].message  # one host: no per-host list


def test_claims_through_the_store_find_the_other_process_both_ways(tmp_path):
    """Two processes' claims (different hosts) in a real TCPStore: the second finds the first at
    once; the first, waiting on the store's side, is told of the second."""
    import torch.distributed as dist
    from helpers.procs import free_port

    port = free_port()
    host_store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": f"t{port}", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    told = threading.Event()
    seen: list[dict] = []

    def update(claims: dict) -> None:
        seen.append(dict(claims))
        told.set()

    first = record("algo-1", 0, rank_passed=0, port=str(port))
    second = record("algo-2", 1, rank_passed=0, port=str(port))
    mine = claim_rank(first, update, env=env)
    assert mine.get("number") == 1 and "error" not in mine, mine
    theirs = claim_rank(second, lambda c: None, env=env)
    assert theirs.get("number") == 2, theirs
    assert [(o["host"], o["rank"]) for o in theirs["others"]] == [("algo-1", 0)]
    assert told.wait(10.0), "the first claim was never told of the second"
    assert [(o["host"], o["rank"]) for o in seen[-1]["others"]] == [("algo-2", 0)]
    del host_store


@pytest.mark.slow
def test_no_store_is_said_in_the_record_and_nothing_is_claimed_without_an_agent_store():
    rec = record("algo-1", 0, rank_passed=0)
    assert claim_rank(rec, lambda c: None, env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}) == {}
    from helpers.procs import free_port
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}  # nobody listens there
    out = claim_rank(rec, lambda c: None, env=env)
    assert out.get("error") and out.get("store") and "number" not in out


def test_the_line_that_computed_the_rank_is_named():
    from ddp_doctor.training.probes.init_calls import argument_texts, assignment_of
    source = ["import os\n", "rank = 3\n", "rank = int(os.environ['LOCAL_RANK'])\n",
              "dist.init_process_group('gloo', rank=rank, world_size=2)\n"]
    texts = argument_texts("dup.py:4", lambda p: source)
    assert texts["rank"] == "rank"
    assert assignment_of("dup.py:4", "rank", lambda p: source) == {"text": f"rank = {LOCAL}", "site": "dup.py:3"}
    assert assignment_of("dup.py:4", "int(x)", lambda p: source) is None
    computed = {"text": f"rank = {LOCAL}", "site": "dup.py:5"}
    one = {**record("algo-1", 0, rank_passed=0), "arg_text": {"rank": "rank"}, "rank_computed": computed}
    two = {**record("algo-2", 1, rank_passed=0), "arg_text": {"rank": "rank"}, "rank_computed": computed}
    [f] = [f for f in init_argument_findings([with_claims(two, one)]) if f.id == "DDP867"]
    assert f"(rank=rank passed at dup.py:6, computed by `rank = {LOCAL}` at dup.py:5)" in f.message, f.message
