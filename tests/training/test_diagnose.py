"""From rank records to findings and the job's exit status (ddp_doctor/checks/rank_endings.py, stalls.py)."""
from __future__ import annotations

import json
import signal
import sysconfig

from ddp_doctor.checks.rank_endings import early_os_exits, training_findings
from ddp_doctor.checks.stalls import hang_finding, p2p_cycle
from ddp_doctor.report.build import merge_findings, root_cause


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
    assert f["DDP802"].ranks == [0] and f["DDP802"].caused_by is not None
    assert code == 1


def test_same_error_on_every_rank_is_one_cause_not_peers():
    outcomes = {0: outcome(1, exc(10.0)), 1: outcome(1, exc(10.2))}
    findings, _ = training_findings(outcomes, {}, [0, 1])
    assert {f.id for f in findings} == {"DDP800"}


def test_scripts_own_exit_status_passes_through_and_is_a_failure_never_a_pass():
    findings, code = training_findings({0: outcome(7), 1: outcome(7)}, {0: 7, 1: 7}, [0, 1])
    assert code == 7
    assert [(f.id, f.severity, f.ranks) for f in findings] == [("DDP814", "error", [0]), ("DDP814", "error", [1])]
    merged = merge_findings(findings)  # one finding: "ranks 0-1"
    assert len(merged) == 1 and merged[0].ranks == [0, 1] and "status 7" in merged[0].message
    # every rank ended itself alike: none is the others' cause, and no "errors below" that are not there
    assert "other ranks" not in merged[0].message and "consequence" not in merged[0].message


def test_an_own_exit_names_as_consequences_only_lost_peers_and_stopped_ranks():
    lost = exc(11.0, "RuntimeError", "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")
    for others, exits, said in [
            ({1: outcome(1, lost)}, {1: 1}, True),  # its peer's lost-peer error: its consequence
            ({}, {1: -signal.SIGTERM}, True),  # stopped by the launcher after it left
            ({1: outcome(1, exc(10.5))}, {1: 1}, False),  # a peer that raised its own error: no consequence
    ]:
        findings, _ = training_findings({0: outcome(7), **others}, {0: 7, **exits}, [0, 1])
        [own] = [f for f in findings if f.id == "DDP814"]
        assert ("their errors below are its consequence" in own.message) is said, own.message


def test_the_same_error_raised_by_every_rank_says_fix_it_once_not_read_the_first():
    for texts in (("bad batch", "bad batch"), ("bad batch on rank 0", "bad batch on rank 1")):
        findings, _ = training_findings({r: outcome(1, exc(10.0 + r, message=t)) for r, t in enumerate(texts)},
                                        {0: 1, 1: 1}, [0, 1])
        [f] = merge_findings(findings)
        assert f.id == "DDP800" and f.ranks == [0, 1] and "fix it once" in f.hint and "peers" not in f.hint, f.hint
    findings, _ = training_findings({0: outcome(1, exc(12.0, "RuntimeError", "odd")), 1: outcome(1, exc(10.0))},
                                    {0: 1, 1: 1}, [0, 1])
    assert "fix it once" not in by_id(findings)["DDP800"].hint  # one rank's own error: read that one


def test_a_rank_that_raised_on_its_own_and_then_hung_at_exit_is_no_consequence():
    # both ranks raised the same error on their own; rank 1's process then did not exit (SIGKILL past the bound)
    outcomes = {0: outcome(1, exc(10.0)), 1: outcome(1, exc(10.2))}
    stuck = by_id(training_findings(outcomes, {0: 1, 1: -signal.SIGKILL}, [0, 1])[0])["DDP806"]
    assert "consequence" not in stuck.message and stuck.caused_by is None and stuck.severity == "info"
    assert "after its own error" in stuck.message


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
    assert f["DDP802"].ranks == [0] and "SIGTERM" in f["DDP802"].message and f["DDP802"].caused_by is not None
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


def test_hang_with_two_ranks_in_two_collectives_names_no_one_whatever_the_order():
    a = {"where": "a.py:3 in f", "in_collective": True}
    b = {"where": "a.py:5 in f", "in_collective": True}
    for hbs in ({0: a, 1: b}, {1: b, 0: a}):
        f = hang_finding(hbs, {}, 5)
        assert f.ranks == [0, 1] and f.message.startswith(
            "no progress on any rank for 5 s; the ranks are in different places. rank 0: a.py:3"), f.message


C10D = sysconfig.get_paths()["purelib"] + "/torch/distributed/distributed_c10d.py"


def dump(call: str, line: int = 9) -> str:
    """A faulthandler dump whose main thread is inside torch.distributed's `call`."""
    return (f'Thread 0x00007f01 (most recent call first):\n'
            f'  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
            f'\nCurrent thread 0x00007f02 (most recent call first):\n  File "{C10D}", line 2500 in {call}\n'
            f'  File "{C10D.replace("distributed_c10d", "c10d_logger")}", line 83 in wrapper\n'
            f'  File "/job/train.py", line {line} in <module>\n')


def test_every_rank_in_send_is_a_send_cycle_and_the_hang_its_consequence():
    hbs = {r: {"where": "/job/train.py:9 in <module>", "in_collective": True} for r in range(2)}
    hang = hang_finding(hbs, {0: dump("send"), 1: dump("send")}, 15)
    cycle = p2p_cycle(hang, {0: dump("send"), 1: dump("send")})
    assert cycle is not None and cycle.id == "DDP894" and cycle.ranks == [0, 1] and cycle.cause_class == "code"
    assert cycle.message.startswith("every rank waits in torch.distributed.send: each sends to a peer that is "
                                    "itself sending (a send/recv cycle), and no rank receives. rank 0: /job/train.py:9")
    assert hang.caused_by == "DDP894" and "every rank waits in send (DDP894, the root cause)" in hang.message
    recv = p2p_cycle(hang_finding(hbs, {}, 15), {0: dump("recv"), 1: dump("recv")})
    assert recv is not None and "each waits to receive what no rank sends" in recv.message


def test_ranks_on_both_sides_of_a_send_or_elsewhere_are_no_cycle():
    hbs = {r: {"where": "/job/train.py:9 in <module>", "in_collective": True} for r in range(2)}
    for stacks in ({0: dump("send"), 1: dump("recv")},  # a send meets a receive: slow, not a cycle
                   {0: dump("send"), 1: dump("all_reduce")},  # one rank elsewhere: the hang's own rules
                   {0: dump("send")}):  # a rank's stack missing: not every rank is known
        hang = hang_finding(hbs, stacks, 15)
        assert p2p_cycle(hang, stacks) is None and hang.caused_by is None
    one = {0: hbs[0]}
    assert p2p_cycle(hang_finding(one, {0: dump("send")}, 15), {0: dump("send")}) is None


def test_a_rank_that_called_os_exit_before_a_peer_failed_is_the_cause():
    peer_error = training_findings({0: outcome(1, exc(20.0, "RuntimeError", "Connection closed by peer"))},
                                   {0: 1}, [0, 1])[0]
    left = {1: {"steps": 3, "ended": {"how": "os_exit", "status": 0, "site": "train.py:12", "t": 10.0}}}
    [f] = early_os_exits(left, {}, peer_error)
    assert f.id == "DDP812" and f.ranks == [1] and f.time == 10.0 and f.cause_class == "code"
    assert f.message == ("rank 1 ended its process with os._exit(0) at train.py:12 after 3 optimizer step(s) "
                         "while rank 0 still ran, and failed after it")
    assert all(p.caused_by == "DDP812" for p in peer_error)
    assert root_cause(merge_findings(peer_error + [f])).id == "DDP812"


def test_os_exit_after_the_work_or_after_a_peers_failure_is_not_a_cause():
    peer_error = training_findings({0: outcome(1, exc(20.0))}, {0: 1}, [0, 1])[0]
    later = {1: {"ended": {"how": "os_exit", "status": 0, "t": 30.0}}}  # the peer had failed already
    assert early_os_exits(later, {}, peer_error) == [] and peer_error[0].caused_by is None
    every = {r: {"ended": {"how": "os_exit", "status": 0, "t": 10.0}} for r in range(2)}  # the job ended well
    assert early_os_exits(every, {}, []) == []
    script = {1: {"ended": {"how": "script", "t": 10.0}}}  # the script returned
    assert early_os_exits(script, {}, peer_error) == []


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


# faulthandler's text for a SIGSEGV in ctypes (this interpreter's stdlib) called from the user's line 10,
# two threads
# (CPython 3.11's format: "Current thread" first, then the other threads).
STDLIB = sysconfig.get_paths()["stdlib"]
SEGV_DUMP = f"""Fatal Python error: Segmentation fault

Thread 0x00007f3a2d7fe640 (most recent call first):
  File "{STDLIB}/threading.py", line 327 in wait
  File "/site/ddp_doctor/training/run/watchdog.py", line 90 in _loop

Current thread 0x00007f3a3c8b1740 (most recent call first):
  File "{STDLIB}/ctypes/__init__.py", line 519 in string_at
  File "/work/train.py", line 10 in step
  File "/work/train.py", line 20 in <module>

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


def test_crashing_frames_are_the_current_threads_innermost_first():
    from ddp_doctor.checks.rank_endings import crashing_frames
    assert crashing_frames(SEGV_DUMP) == [(f"{STDLIB}/ctypes/__init__.py", 519, "string_at"),
                                          ("/work/train.py", 10, "step"), ("/work/train.py", 20, "<module>")]
    one_thread = "Fatal Python error: Aborted\n\nStack (most recent call first):\n  File \"/w/a.py\", line 3 in f\n"
    assert crashing_frames(one_thread) == [("/w/a.py", 3, "f")]
    assert crashing_frames("") == []


def test_native_crash_is_the_root_cause_with_the_users_line_and_a_hint_for_its_signal():
    outcomes = {0: outcome(1, exc(30.0, "RuntimeError", "[gloo/transport/tcp/pair.cc:534] Connection closed by "
                                                         "peer [127.0.0.1]:1234"))}
    findings, code = training_findings(outcomes, {0: 1, 1: -signal.SIGSEGV}, [0, 1], {1: (SEGV_DUMP, 20.0)})
    f = by_id(findings)
    crash = f["DDP807"]
    assert crash.ranks == [1] and crash.time == 20.0
    assert "SIGSEGV" in crash.message and "/work/train.py:10 in step" in crash.message  # not ctypes' frame
    assert "extensions" in crash.hint and "memory" not in crash.hint.lower()
    assert "/work/train.py:20 in <module>" in crash.evidence["python_stack"]
    assert f["DDP802"].caused_by is not None
    assert code == 128 + signal.SIGSEGV


def test_each_native_signal_has_its_own_hint_and_sigkill_is_not_a_native_crash():
    from ddp_doctor.checks.rank_endings import NATIVE_HINTS, native_crash_finding
    hints = {native_crash_finding(1, -s, SEGV_DUMP).hint for s in NATIVE_HINTS}
    assert len(hints) == len(NATIVE_HINTS)
    assert "/dev/shm" in native_crash_finding(1, -signal.SIGBUS, "").hint
    assert "no Python frame" in native_crash_finding(1, -signal.SIGBUS, "").message
    findings, _ = training_findings({}, {0: -signal.SIGKILL}, [0], {0: ("", 1.0)})
    assert [x.id for x in findings] == ["DDP803"]


def test_a_crashed_rank_sets_the_status_when_the_launcher_stopped_a_lower_rank_first():
    # torchrun's agent may SIGTERM rank 0 before rank 0 records the peer's loss: rank 1's crash
    # is still the job's status (seen on real ranks, tests/training/test_run_e2e.py).
    findings, code = training_findings({}, {0: -signal.SIGTERM, 1: -signal.SIGSEGV}, [0, 1],
                                       {1: (SEGV_DUMP, 20.0)})
    assert code == 128 + signal.SIGSEGV
    f = by_id(findings)
    assert f["DDP807"].ranks == [1] and f["DDP802"].ranks == [0] and f["DDP802"].caused_by is not None


def test_a_launcher_that_fails_before_any_rank_is_never_a_pass(tmp_path):
    from types import SimpleNamespace

    from ddp_doctor.training.run.parent_report import finish
    report = tmp_path / "r.json"
    opts = SimpleNamespace(report_path=str(report), hang_timeout=None, trace_path=None, run_dir=None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code = finish(str(run_dir), 1, None, opts, [])
    rep = json.loads(report.read_text())
    assert code == 1 and rep["status"] == "fail"
    cause = rep["root_cause"]
    assert cause["id"] == "DDP003" and "exited with status 1 before any rank" in cause["message"]


def test_a_rank_that_exits_with_its_own_status_gives_the_job_that_status():
    # rank 1 called sys.exit(5) while rank 0 waited: rank 0 raised only the lost-peer symptom
    lost = {"type": "RuntimeError", "message": "[gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:1", "traceback": "", "time": 11.0}
    outcomes = {0: {"rank": 0, "time": 11.0, "exit_code": 1, "exception": lost},
                1: {"rank": 1, "time": 10.0, "exit_code": 5, "exception": None,
                    "exited": {"where": "train.py:7 in <module>", "time": 10.0}}}
    findings, code = training_findings(outcomes, {0: 1, 1: 5}, [0, 1])
    assert code == 5
    cause = root_cause(findings)  # the rank that left, at its line; never the rank that only waited
    assert cause.id == "DDP814" and cause.ranks == [1], [f.to_dict() for f in findings]
    assert "status 5" in cause.message and "train.py:7" in cause.message
    assert [f.id for f in findings if f.ranks == [0]] == ["DDP802"]


def test_a_rank_that_exits_0_and_a_stopped_or_raising_rank_are_not_an_own_exit():
    outcomes = {0: {"rank": 0, "time": 10.0, "exit_code": 0, "exception": None},
                1: {"rank": 1, "time": 10.0, "exit_code": 143, "exception": None, "interrupted": {"signo": 15}},
                2: {"rank": 2, "time": 10.0, "exit_code": 1, "exception": {
                    "type": "ValueError", "message": "bad", "traceback": "", "time": 10.0}}}
    findings, _ = training_findings(outcomes, {}, [0, 1, 2])
    assert "DDP814" not in {f.id for f in findings}
