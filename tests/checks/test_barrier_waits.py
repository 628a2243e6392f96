"""A monitored barrier that timed out names the ranks that did not come (checks/barrier_waits.py,
DDP819), from outcomes and heartbeats shaped as the ranks write them."""
from __future__ import annotations

from ddp_doctor.checks.barrier_waits import monitored_barrier_verdict
from ddp_doctor.checks.rank_endings import training_findings

MSG = ("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 3000 ms Original exception: [.../unbound_buffer.cc:78] "
       "Timed out waiting 3000ms for recv operation to complete")


def outcomes(message: str) -> dict:
    tb = f'Traceback (most recent call last):\n  File "/job/train.py", line 9, in <module>\nRuntimeError: {message}\n'
    return {0: {"exit_code": 1, "time": 12.0, "exception": {"type": "RuntimeError", "message": message,
                                                           "traceback": tb, "time": 11.0}}}


def test_the_late_rank_is_the_cause_with_where_it_was():
    outs = outcomes(MSG)
    findings, _ = training_findings(outs, {0: 1}, [0, 1])
    beats = {1: {"where": "/job/train.py:7 in <module>", "time": 11.5}}
    out = monitored_barrier_verdict(findings, outcomes=outs, ledgers={}, heartbeats=beats)
    [cause] = [f for f in out if f.id == "DDP819"]
    assert cause.ranks == [1] and cause.time == 11.0
    assert cause.message == ("rank 1 did not reach the monitored barrier that rank 0 waited in (at /job/train.py:9 "
                             "in <module>) for 3 s: rank 1 was at /job/train.py:7 in <module>")
    assert [f.caused_by for f in out if f.ranks == [0]] == ["DDP819"]


def test_every_late_rank_is_named_and_an_unknown_place_said_so():
    outs = outcomes(MSG.replace("Rank 1 failed", "Ranks 1, 3 failed"))
    findings, _ = training_findings(outs, {0: 1}, [0, 1, 2, 3])
    out = monitored_barrier_verdict(findings, outcomes=outs, ledgers={}, heartbeats={})
    [cause] = [f for f in out if f.id == "DDP819"]
    assert cause.ranks == [1, 3] and cause.message.startswith("ranks 1, 3 did not")
    assert cause.message.endswith("where rank 1 was is not known; where rank 3 was is not known")


def test_another_timeout_is_left_as_it_is():
    outs = outcomes("[.../unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete")
    findings, _ = training_findings(outs, {0: 1}, [0, 1])
    out = monitored_barrier_verdict(findings, outcomes=outs, ledgers={}, heartbeats={})
    assert not [f for f in out if f.id == "DDP819"] and all(f.caused_by is None for f in out)
