"""init_waits.py: what the ranks' init_process_group timeouts say about init's arguments when no
record of the calls exists (a post-mortem). Pure: outcome records as analyze builds them from
the ranks' tracebacks (tests/postmortem/test_analyze_recorded.py reads those real torchrun jobs left)."""
from __future__ import annotations

from ddp_doctor.checks.init_waits import init_wait_findings, init_wait_verdict
from ddp_doctor.checks.internal import event_finding
from ddp_doctor.checks.signatures import classify

TB = ('Traceback (most recent call last):\n  File "/job/train.py", line 9, in <module>\n'
      '    dist.init_process_group("gloo", rank=0, world_size=2)\n'
      '  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 1899, in '
      'init_process_group\n    default_pg, _ = _new_process_group_helper(\n'
      'torch.distributed.DistStoreError: {msg}\n')


def _timed_out(msg: str, t: float = 100.0) -> dict:
    return {"exit_code": 1, "time": t, "phase": "training",
            "exception": {"type": "torch.distributed.DistStoreError", "message": msg, "traceback": TB.format(msg=msg)}}


def _key(rank: int) -> str:
    return f"wait timeout after 8000ms, keys: /default_pg/0//cpu//0/{rank}"


def test_a_process_waiting_for_its_own_ranks_key_joined_as_another_rank():
    found = init_wait_findings({0: _timed_out(_key(1)), 1: _timed_out(_key(1))}, [0, 1], launched_known="one node")
    (f,) = found
    assert f.id == "DDP867" and f.ranks == [0, 1] and f.severity == "error"
    assert "the process the launcher started as rank 1 waited for it too" in f.message
    assert "at /job/train.py:9" in f.message  # the user's call, not torch's frame


def test_a_wait_for_a_rank_the_launcher_never_started_is_a_larger_world():
    outcomes = {0: _timed_out(_key(2)), 1: _timed_out(_key(2))}
    (stated,) = init_wait_findings(outcomes, [0, 1], launched_known="stated")
    assert stated.id == "DDP868" and stated.ranks == [0, 1]
    assert "waited for rank 2 to join" in stated.message and "the launcher started 2" in stated.message
    assert "one node's ranks" not in stated.message
    (one_node,) = init_wait_findings(outcomes, [0, 1], launched_known="one node")
    assert "if the job had more nodes, their ranks never joined instead" in one_node.message
    # the ranks the launcher started are not known (several nodes, some without output): no verdict
    assert init_wait_findings(outcomes, [0, 1], launched_known="") == []


def test_a_store_waiting_for_more_clients_than_launched_is_a_larger_world():
    msg = "Timed out after 1801 seconds waiting for clients. 2/4 clients joined."
    (f,) = init_wait_findings({0: _timed_out(msg)}, [0, 1], launched_known="stated")
    assert f.id == "DDP868" and "waited for 4 processes (2 joined)" in f.message


def test_waits_that_do_not_decide_give_nothing():
    # rank 1 never wrote its key and has no wait of its own (it died before init): its own error says why
    assert init_wait_findings({0: _timed_out(_key(1))}, [0, 1], launched_known="one node") == []
    # a timeout outside init (a collective's): not init's arguments
    later = _timed_out(_key(1))
    later["exception"]["traceback"] = later["exception"]["traceback"].replace("init_process_group", "barrier")
    assert init_wait_findings({0: later, 1: later}, [0, 1], launched_known="one node") == []
    # the launcher's ranks not all known
    assert init_wait_findings({0: _timed_out(_key(1)), 1: _timed_out(_key(1))}, [0, 2], launched_known="stated") == []


def test_the_ranks_own_store_timeouts_become_its_consequences():
    sig = classify(f"torch.distributed.DistStoreError: {_key(1)}")
    assert sig is not None and sig.entry.id == "DDP835"
    timeouts = [event_finding(sig.entry, f"rank {r} raised DistStoreError: {_key(1)}", rank=r, phase="training")
                for r in (0, 1)]
    out = init_wait_verdict(timeouts, {0: _timed_out(_key(1)), 1: _timed_out(_key(1))}, [0, 1],
                            launched_known="one node")
    assert [f.caused_by for f in out if f.id == "DDP835"] == ["DDP867", "DDP867"]
    assert [f.id for f in out if f.caused_by is None] == ["DDP867"]


def test_a_wait_that_does_not_decide_names_the_rank_it_waited_for_and_says_what_is_not_known():
    """torchrun stops the other ranks at the first exit: rank 1 may be stopped before its own init
    wait ends. Rank 0's timeout then names rank 1 and says the waits do not tell why it lacked."""
    sig = classify(f"torch.distributed.DistStoreError: {_key(1)}")
    timeout = event_finding(sig.entry, f"rank 0 raised DistStoreError: {_key(1)}", rank=0, phase="training")
    out = init_wait_verdict([timeout], {0: _timed_out(_key(1))}, [0, 1], launched_known="one node")
    assert [f.id for f in out] == ["DDP835"] and out[0].caused_by is None
    assert "waited for rank 1 to join" in out[0].message and "not known" in out[0].message
    assert out[0].evidence["awaited_rank"] == 1
    # both waits there: decided (DDP867), and the timeouts say nothing more
    both = [event_finding(sig.entry, f"rank {r} raised DistStoreError: {_key(1)}", rank=r, phase="training")
            for r in (0, 1)]
    out = init_wait_verdict(both, {0: _timed_out(_key(1)), 1: _timed_out(_key(1))}, [0, 1], launched_known="one node")
    assert not [f for f in out if "not known" in f.message]
