"""The job's exit status is the root-cause rank's own: a rank that died without an ending
(`os._exit(7)`, no outcome record, the launcher saw status 7) is the cause, and a peer's lost-peer
error ("Connection closed by peer", exit 1) is its consequence, whichever came first in time and
whichever order the launcher listed them in."""
from __future__ import annotations

import signal

import pytest

from ddp_doctor.checks.job import JobEvidence, job_findings
from ddp_doctor.checks.rank_endings import training_findings

LOST_PEER = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"


def lost_peer_outcome(t: float) -> dict:
    exc = {"type": "RuntimeError", "message": LOST_PEER, "time": t,
           "traceback": f"Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
                        f"    dist.all_reduce(t)\nRuntimeError: {LOST_PEER}\n"}
    return {"exit_code": 1, "exception": exc, "time": t}


# rank 0's lost-peer error recorded before rank 1's death was seen (its last heartbeat after), and after
ORDERS = {"peer-error-first": (100.0, 101.0), "death-first": (102.0, 101.0)}
# what the launcher listed: both failures (either order), or only the first it saw
EXITS = {"both": {0: 1, 1: 7}, "both-reversed": {1: 7, 0: 1}, "dead-rank-only": {1: 7}}


@pytest.mark.parametrize("exits", EXITS.values(), ids=EXITS.keys())
@pytest.mark.parametrize("times", ORDERS.values(), ids=ORDERS.keys())
def test_a_rank_that_died_with_its_own_status_gives_the_job_its_status(times, exits):
    peer_error_at, _ = times
    _, code = training_findings({0: lost_peer_outcome(peer_error_at)}, dict(exits), [0, 1])
    assert code == 7


@pytest.mark.parametrize("exits", EXITS.values(), ids=EXITS.keys())
@pytest.mark.parametrize("times", ORDERS.values(), ids=ORDERS.keys())
def test_the_job_verdict_names_the_dead_rank_and_keeps_its_status(times, exits):
    peer_error_at, death_seen_at = times
    beats = {0: {"time": peer_error_at, "pid": 10, "phase": "training"},
             1: {"time": death_seen_at, "pid": 11, "phase": "training"}}
    ev = JobEvidence(ranks=[0, 1], outcomes={0: lost_peer_outcome(peer_error_at)}, exits=dict(exits),
                     heartbeats=beats, launched_alone=True)
    findings, code = job_findings(ev)
    assert code == 7
    dead = [f for f in findings if f.ranks == [1] and f.severity == "error"]
    assert dead and "status 7" in dead[0].message, [(f.id, f.ranks, f.message) for f in findings]


def test_a_killed_rank_still_gives_128_plus_its_signal():
    _, code = training_findings({0: lost_peer_outcome(100.0)}, {0: 1, 1: -signal.SIGKILL}, [0, 1])
    assert code == 128 + signal.SIGKILL


def test_a_rank_stopped_by_the_launcher_is_never_the_cause_of_the_dead_ranks_failure():
    # rank 2 was stopped (SIGTERM) by the launcher after rank 1 died: rank 1's status is the job's
    _, code = training_findings({0: lost_peer_outcome(100.0)}, {0: 1, 1: 7, 2: -signal.SIGTERM}, [0, 1, 2])
    assert code == 7
    _, code = training_findings({0: lost_peer_outcome(100.0)}, {2: -signal.SIGTERM, 1: 7}, [0, 1, 2])
    assert code == 7


def test_a_real_error_stays_the_cause_over_a_dead_rank():
    real = {"type": "ValueError", "message": "bad batch", "time": 100.0,
            "traceback": "Traceback...\nValueError: bad batch\n"}
    _, code = training_findings({0: {"exit_code": 2, "exception": real, "time": 100.0}}, {0: 2, 1: 7}, [0, 1])
    assert code == 2


@pytest.mark.parametrize("launcher_code,status", [(-signal.SIGKILL, 137), (5, 5)])
def test_a_launcher_that_ended_before_its_ranks_gives_the_job_its_ending(launcher_code, status):
    """DDP810 (the launcher died while its ranks trained) among the findings before training: the
    judge gives the job the launcher's ending, 128 + its signal or its own status."""
    from ddp_doctor.checks.stops import launcher_ended_finding
    ended = launcher_ended_finding(launcher_code, 4242, {0: {"where": "train.py:9"}, 1: {"where": "train.py:9"}})
    ev = JobEvidence(ranks=[0, 1], heartbeats={0: {}, 1: {}}, launcher_code=launcher_code)
    assert job_findings(ev, earlier=[ended])[1] == status


def test_a_stop_keeps_its_status_over_a_stuck_init():
    from ddp_doctor.processes.stop_signals import Interrupt
    ev = JobEvidence(ranks=[0, 1], interrupted=Interrupt(signal.SIGTERM), stuck_in_init=True)
    assert job_findings(ev)[1] == 128 + signal.SIGTERM
