"""DDP806 on a rank stuck at exit because a peer failed first is a consequence."""
from __future__ import annotations

import signal

from ddp_doctor.checks.rank_endings import training_findings


def exc(t: float, type_: str = "ValueError", message: str = "bad batch") -> dict:
    return {"type": type_, "message": message, "traceback": f"Traceback...\n{type_}: {message}\n", "time": t}


def outcome(code: int = 0, exception: dict | None = None, t: float = 100.0) -> dict:
    return {"exit_code": code, "exception": exception, "time": t}


def test_stuck_at_exit_after_a_peer_raised_is_info_and_a_consequence():
    # rank 1 raised; rank 0 was blocked with it in a collective, its script then ended (status 1),
    # and the process hung in teardown until ddp-doctor ended it
    outcomes = {0: outcome(1, exc(12.0, "RuntimeError", "Connection closed by peer")),
                1: outcome(1, exc(10.0))}
    findings, code = training_findings(outcomes, {0: -signal.SIGKILL, 1: 1}, [0, 1])
    stuck = [f for f in findings if f.id == "DDP806"]
    assert len(stuck) == 1 and stuck[0].ranks == [0]
    assert stuck[0].severity == "info" and stuck[0].caused_by is not None
    assert "after rank 1 failed" in stuck[0].message
    assert code == 1


def test_stuck_at_exit_after_a_peer_crashed_in_native_code_is_info():
    outcomes = {0: outcome(0)}
    findings, _ = training_findings(outcomes, {0: -signal.SIGKILL, 1: -signal.SIGSEGV}, [0, 1])
    stuck = [f for f in findings if f.id == "DDP806"]
    assert stuck[0].severity == "info" and stuck[0].evidence["after_rank"] == 1


def test_two_ranks_stuck_at_exit_on_their_own_stay_warnings():
    findings, code = training_findings({0: outcome(0), 1: outcome(0)}, {0: -signal.SIGKILL, 1: -signal.SIGKILL},
                                       [0, 1])
    assert [f.severity for f in findings] == ["warning", "warning"] and code == 0
    assert not any(f.caused_by is not None for f in findings)


def test_exit_status_139_keeps_the_segfault_hint_not_the_oom_one():
    # 128 + SIGSEGV, as a shell or mpirun reports it: DDP803's own hint is about the OOM killer's SIGKILL
    findings, code = training_findings({0: outcome(0)}, {1: 128 + signal.SIGSEGV}, [0, 1])
    (f,) = findings
    assert f.id == "DDP803" and "139 is 128 + SIGSEGV" in f.message
    assert "segmentation fault" in f.hint and "Out of memory" not in f.hint and code == 139
    findings, _ = training_findings({0: outcome(0)}, {1: 128 + signal.SIGKILL}, [0, 1])
    assert "Out of memory" in findings[0].hint  # SIGKILL keeps it
    findings, _ = training_findings({0: outcome(0)}, {1: -signal.SIGSEGV}, [0, 1])
    assert findings[0].id == "DDP807" and "Out of memory" not in findings[0].hint
