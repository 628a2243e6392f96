"""From rank records to findings and the job's exit status (training/diagnose.py)."""
from __future__ import annotations

import signal

from ddp_doctor.training.run.diagnose import hang_finding, training_findings


def exc(t: float, type_: str = "ValueError", message: str = "bad batch") -> dict:
    return {"type": type_, "message": message, "traceback": f"Traceback...\n{type_}: {message}\n", "time": t}


def outcome(code: int = 0, exception: dict | None = None, t: float = 100.0) -> dict:
    return {"exit_code": code, "exception": exception, "time": t}


def by_id(findings):
    return {f.id: f for f in findings}


def test_first_failing_rank_is_the_cause_and_later_ones_are_peers():
    outcomes = {0: outcome(1, exc(12.0, "RuntimeError", "Something odd happened")), 1: outcome(1, exc(10.0))}
    findings, code = training_findings(outcomes, {0: 1, 1: 1}, [0, 1])
    f = by_id(findings)
    assert f["DDP800"].ranks == [1] and "ValueError: bad batch" in f["DDP800"].message
    assert f["DDP802"].ranks == [0] and f["DDP802"].evidence["consequence"]
    assert code == 1


def test_same_error_on_every_rank_is_one_cause_not_peers():
    outcomes = {0: outcome(1, exc(10.0)), 1: outcome(1, exc(10.2))}
    findings, _ = training_findings(outcomes, {}, [0, 1])
    assert {f.id for f in findings} == {"DDP800"}


def test_scripts_own_exit_status_passes_through():
    findings, code = training_findings({0: outcome(7), 1: outcome(7)}, {0: 7, 1: 7}, [0, 1])
    assert findings == [] and code == 7


def test_abort_at_exit_after_status_0_is_teardown_info_and_exit_0():
    findings, code = training_findings({0: outcome(0), 1: outcome(0)}, {1: -signal.SIGABRT}, [0, 1])
    (f,) = findings
    assert f.id == "DDP804" and f.severity == "info" and f.ranks == [1] and code == 0


def test_killed_rank_without_python_error_is_named_with_the_signal():
    findings, code = training_findings({0: outcome(0)}, {1: -signal.SIGKILL}, [0, 1])
    (f,) = findings
    assert f.id == "DDP803" and "SIGKILL" in f.message and code == 137


def test_survivors_stopped_by_the_launcher_are_labelled_consequences():
    outcomes = {1: outcome(1, exc(10.0))}
    findings, code = training_findings(outcomes, {0: -signal.SIGTERM, 1: 1}, [0, 1])
    f = by_id(findings)
    assert f["DDP802"].ranks == [0] and "SIGTERM" in f["DDP802"].message and f["DDP802"].evidence["consequence"]
    assert f["DDP800"].ranks == [1] and code == 1


def test_nonzero_exit_without_a_record_is_reported():
    findings, code = training_findings({0: outcome(0)}, {1: 3}, [0, 1])
    (f,) = findings
    assert f.id == "DDP803" and "status 3" in f.message and code == 3


def test_hang_names_the_rank_outside_the_collective():
    hbs = {0: {"where": "train.py:10 in step", "in_collective": True},
           1: {"where": "train.py:7 in load", "in_collective": False}}
    f = hang_finding(hbs, {0: "stack0", 1: "stack1"}, 30)
    assert f.id == "DDP801" and f.ranks == [1] and "train.py:7" in f.message
    assert f.evidence["stacks"] == {"0": "stack0", "1": "stack1"}


def test_hang_without_collectives_names_the_minority_location():
    hbs = {r: {"where": "a.py:1 in f", "in_collective": False} for r in range(3)}
    hbs[2] = {"where": "a.py:9 in g", "in_collective": False}
    f = hang_finding(hbs, {}, 5)
    assert f.ranks == [2]


def test_rank_ended_after_hanging_at_exit_keeps_the_scripts_status():
    findings, code = training_findings({0: outcome(0), 1: outcome(0)}, {1: -signal.SIGKILL}, [0, 1])
    (f,) = findings
    assert f.id == "DDP806" and f.severity == "warning" and f.ranks == [1] and code == 0


def test_peer_terminated_by_the_launcher_after_its_script_ended_is_stuck_at_exit_too():
    # ddp-doctor ended rank 0 past the bound; torchrun then sent SIGTERM to rank 1, also past its script.
    findings, code = training_findings({0: outcome(0), 1: outcome(0)}, {0: -signal.SIGKILL, 1: -signal.SIGTERM},
                                       [0, 1])
    assert sorted((f.id, tuple(f.ranks)) for f in findings) == [("DDP806", (0,)), ("DDP806", (1,))]
    assert "SIGTERM" in findings[1].message and code == 0
