"""The pytest plugin, driven through pytester in a subprocess: N-rank tests (pass, fail on one rank,
skip, hang, abort at exit, unpicklable fixture), xdist, the session preflight, settings.

Inner pytest runs that neither send signals nor assert a bound on time are started together by a
module fixture, a few at a time, as pytester's runpytest_subprocess would start them (`inner`),
and each test reads its own run. The bounded runs run alone: all rank outcomes in its own test;
the hangs ended by their timeouts (a rank that returned, raised or left a loop early, a rank that
never came) in one inner run that several tests read; those that kill or signal pytest in their
own tests.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers.procs import Launch, Result, run, run_all, wait_for

from ddp_doctor.facts.host import visible_gpu_count
from ddp_doctor.pytest_plugin.rank_pool import wire
from ddp_doctor.pytest_plugin.rank_pool.results import RankEnd, RunResult
from ddp_doctor.pytest_plugin.rank_pool.verdict import classify
from ddp_doctor.testing import LocalChecks, simulated_sagemaker

pytest_plugins = ["pytester"]
TAG_ENV = "DDP_DOCTOR_TEST_TAG"
CHEAP_PREFLIGHT = "--ddp-preflight-args=--select gpu,launcher_env"
AT_ONCE = 3  # inner pytest runs at a time on 2 cores
OVERRUN = 300  # seconds: ends an inner run that would never end (a bound on the test, not a verdict)


@pytest.fixture
def tag(monkeypatch: pytest.MonkeyPatch) -> str:
    """A mark in the environment of every process the inner pytest starts, to find survivors."""
    value = uuid.uuid4().hex
    monkeypatch.setenv(TAG_ENV, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("DDP_DOCTOR_REPORT", raising=False)
    return value


def tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(TAG_ENV) == tag:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def assert_no_survivors(tag: str, within: float = 30.0) -> None:
    """Every process of the inner run gone, within a bound that only ends a wait for processes that
    will not go (then they are killed, and the test fails naming them)."""
    try:
        wait_for(lambda: not tagged(tag), within, "the inner run's processes to end")
    except AssertionError:
        left = tagged(tag)
        for p in left:
            p.kill()
        raise AssertionError(f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}") from None


def inner(path: Path, files: dict[str, str], args: list[str], *, tag: str | None = None,
          env: dict[str, str] | None = None, unset: tuple[str, ...] = (), ini: str | None = None) -> Launch:
    """What pytester.makepyfile/makeini and runpytest_subprocess do, in `path`: the files, pytest in a
    subprocess with a --basetemp of its own, and pytester's environment (its HOME, PY_COLORS=0, no
    PYTEST_ADDOPTS, the directory on PYTHONPATH); with `tag`, what the `tag` fixture sets."""
    for name, text in files.items():
        (path / f"{name}.py").write_text(textwrap.dedent(text).strip())
    if ini is not None:
        (path / "tox.ini").write_text(textwrap.dedent(ini).strip())
    e = {k: v for k, v in os.environ.items() if k not in ("TOX_ENV_DIR", "PYTEST_ADDOPTS")}
    (path / "tmproot").mkdir()
    e.update(PYTEST_DEBUG_TEMPROOT=str(path / "tmproot"), HOME=str(path), USERPROFILE=str(path), PY_COLORS="0",
             PYTHONPATH=os.pathsep.join(filter(None, [str(path), e.get("PYTHONPATH", "")])))
    if tag is not None:
        e.update({TAG_ENV: tag, "OMP_NUM_THREADS": "1"})
        e.pop("DDP_DOCTOR_REPORT", None)
    e.update(env or {})
    for name in unset:
        e.pop(name, None)
    return Launch([sys.executable, "-mpytest", f"--basetemp={path / 'runpytest-0'}", *args], e, str(path),
                  timeout=300)  # runpytest_subprocess has no bound; this one only stops a stuck run


def as_run_result(res: Result) -> pytest.RunResult:
    ret: int | pytest.ExitCode = res.rc
    try:
        ret = pytest.ExitCode(res.rc)
    except ValueError:
        pass
    return pytest.RunResult(ret, res.stdout.splitlines(), res.stderr.splitlines(), res.seconds)


def run_inner(launches: dict[str, tuple[Launch, str | None]], at_once: int = AT_ONCE) -> dict[str, tuple]:
    """Inner runs, `at_once` at a time (procs.run_all): name -> (RunResult or exception, the survivor
    check's failure or None). A tagged run's survivors are looked for as soon as it ends, as
    assert_no_survivors does."""
    def job(launch: Launch, tag: str | None):
        def one() -> tuple:
            res = as_run_result(run(launch.cmd, launch.env, launch.cwd, launch.timeout))
            try:
                if tag is not None:
                    assert_no_survivors(tag)
            except AssertionError as e:
                return res, e
            return res, None
        return one

    done = run_all({name: job(launch, tag) for name, (launch, tag) in launches.items()}, at_once)
    return {name: got if isinstance(got, tuple) else (got, None) for name, got in done.items()}


def inner_result(runs: dict[str, tuple], name: str) -> pytest.RunResult:
    got, _ = runs[name]
    if isinstance(got, BaseException):
        raise got
    return got


def inner_survivors(runs: dict[str, tuple], name: str) -> None:
    """assert_no_survivors for a run of the fixture, as checked when it ended."""
    _, failure = runs[name]
    if failure is not None:
        raise failure


# ---------------------------------------------------------------- pure: how a rank ended
def _end(rank: int, outcome: str | None, status: int, t: float = 1.0, **kw: object) -> RankEnd:
    result = None if outcome is None else {"rank": rank, "outcome": outcome, "message": kw.pop("message", ""),
                                           "traceback": kw.pop("tb", ""), "time": t}
    return RankEnd(rank, status=status, exit_time=t + 0.01, result=result, **kw)  # type: ignore[arg-type]


def test_abort_after_reported_success_is_not_a_failure():
    res = RunResult(2, {0: _end(0, "passed", 0), 1: _end(1, "passed", int(signal.SIGABRT))})
    v = classify(res)
    assert v.outcome == "passed"
    assert any("rank 1" in n and "SIGABRT" in n and "teardown" in n for n in v.notes)


def test_abort_without_a_report_is_a_failure():
    res = RunResult(2, {0: _end(0, "passed", 0), 1: _end(1, None, int(signal.SIGABRT), stderr="terminate called")})
    v = classify(res)
    assert v.outcome == "failed"
    assert v.summary.startswith("rank 1 failed first: killed by SIGABRT without reporting")


def test_root_cause_is_the_earliest_failure():
    res = RunResult(3, {0: _end(0, "failed", 0, t=2.0, message="RuntimeError: peer gone"),
                        1: _end(1, "failed", 0, t=1.0, message="AssertionError: x"),
                        2: _end(2, "passed", 0)})
    v = classify(res)
    assert v.summary == "rank 1 failed first: AssertionError: x"
    assert "rank 0: a peer that failed after rank 1" in v.text


def test_the_same_failure_on_every_rank_is_shown_once_naming_them_all():
    tb = 'Traceback (most recent call last):\n  File "t.py", line 9, in test_x\nAssertionError: x'
    res = RunResult(2, {r: _end(r, "failed", 0, t=1.0 + r / 10, message="AssertionError: x", tb=tb) for r in (0, 1)})
    j = {"root_cause": {"id": "DDP800", "message": "ranks 0-1 raised AssertionError: x"}, "cause_ranks": [0, 1],
         "findings": []}
    v = classify(res, j)
    assert v.outcome == "failed"
    assert v.text.count('File "t.py", line 9') == 1, v.text  # the traceback once
    assert "---- ranks 0, 1, the same text: root cause (DDP800): " in v.text, v.text


def _fr_entry(seq: int, retired: bool = True, site: str = "t.py:8") -> dict:
    """A flight recorder entry as torch 2.13 dumps it on gloo, with its call site."""
    return {"record_id": seq - 1, "collective_seq_id": seq, "profiling_name": "gloo:all_reduce",
            "input_sizes": [[2]], "input_dtypes": ["Float"], "retired": retired, "is_p2p": False,
            "process_group": ["0", "default_pg"], "time_created_ns": 1_000_000_000 * seq, "user_site": site}


def test_the_judgement_names_the_rank_that_left_and_labels_the_waiting_one():
    # the judgement of `ddp-doctor run`, in process: rank 1 returned after one all_reduce, rank 0
    # waits in a second one from the same line (what the judging child of the forkserver computes)
    from ddp_doctor.pytest_plugin.rank_pool.judge import judge, judge_inputs
    ledgers = {0: {"rank": 0, "time": 9.0, "position": "hung", "complete": True, "where": "t.py:8 in test_x",
                   "entries": [_fr_entry(1), _fr_entry(2, retired=False)]},
               1: {"rank": 1, "time": 9.0, "position": "finished", "complete": True, "where": "returned from test_x",
                   "entries": [_fr_entry(1)]}}
    ends = {0: RankEnd(0, killed="timeout", ledger=ledgers[0], stack='Current thread 0x1 (most recent call first):\n'
                       '  File "t.py", line 8 in test_x',
                       whereabouts={"where": "t.py:8 in test_x", "in_collective": True}),
            1: RankEnd(1, killed="timeout", ledger=ledgers[1],
                       whereabouts={"where": "returned from test_x", "in_collective": False})}
    res = RunResult(2, ends, timed_out=True, timeout=5.0)
    j = judge(judge_inputs(res), ledgers)
    assert j["root_cause"]["id"] == "DDP892" and j["cause_ranks"] == [1], j["root_cause"]
    assert j["waiting"]["0"]["collective_seq_id"] == 2
    v = classify(res, j)
    assert v.outcome == "failed"
    assert v.summary == ("timed out after 5 s; root cause: rank 1 finished after 1 collectives of process group 0 "
                         "(default_pg); rank 0 waits in all_reduce #2 (issued at t.py:8), which rank 1 never issued "
                         "[DDP892]")
    lines = v.text.splitlines()
    assert lines[1] == "timed out after 5 s: rank(s) 0, 1 still running"
    assert ("  rank 0: waiting in #2 all_reduce Float[2] at t.py:8, a consequence of rank 1; running at t.py:8 in "
            "test_x; killed at the 5 s timeout") in lines
    assert "      #2 all_reduce Float[2] at t.py:8 (not completed)" in lines
    assert ("  rank 1: root cause (DDP892); returned from test_x (finished), waited for its peers; killed at the "
            "5 s timeout") in lines
    assert [ln for ln in lines if ln.startswith("---- ")] == [
        "---- rank 1: root cause (DDP892): returned from the test; waiting for its peers at the 5 s timeout; "
        "killed ----",
        "---- rank 0: waiting in #2 all_reduce Float[2] at t.py:8, a consequence of rank 1: still running at the "
        "5 s timeout; killed. Its Python stack: ----"]


def test_a_stack_leaves_out_the_rank_pools_own_thread_and_frames():
    from ddp_doctor.pytest_plugin.rank_pool import ledgers
    from ddp_doctor.pytest_plugin.rank_pool import worker as rank
    from ddp_doctor.pytest_plugin.rank_pool.verdict import stopped_stack
    dump = (f'Thread 0x2 (most recent call first):\n  File "{ledgers.__file__}", line 87 in _serve\n'
            '  File "/usr/lib/python3.11/threading.py", line 982 in run\n\n'
            'Current thread 0x1 (most recent call first):\n  File "/t/test_a.py", line 9 in test_a\n'
            f'  File "{rank.__file__}", line 139 in run_test\n')
    assert stopped_stack(RankEnd(0, killed="timeout", stack=dump)) == (
        'Current thread 0x1 (most recent call first):\n  File "/t/test_a.py", line 9 in test_a')


def test_asking_a_rank_that_does_not_listen_for_its_ledger_does_not_block(tmp_path):
    from ddp_doctor.pytest_plugin.rank_pool import ledgers
    os.mkfifo(wire.ledger_request_path(str(tmp_path), 0))
    assert ledgers.ask(str(tmp_path), [0, 1]) == []  # no reader on 0, no FIFO for 1


# ---------------------------------------------------------------- real ranks
RANK_TESTS = r'''
import os
import threading

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def config_value():
    return {"lr": 0.1}


@pytest.fixture
def a_lock():
    return threading.Lock()


@pytest.mark.parametrize("scale", [1, 3])
@pytest.mark.distributed(world_size=2)
def test_all_reduce(rank, world_size, tmp_path, config_value, scale):
    t = torch.ones(1) * (rank + 1) * scale
    dist.all_reduce(t)
    assert t.item() == 3 * scale and world_size == 2 and dist.get_rank() == rank
    assert config_value == {"lr": 0.1}
    (tmp_path / f"rank{rank}").write_text("seen")
    print(f"hello from rank {rank}")


@pytest.mark.distributed(world_size=2)
def test_fails_on_rank1(rank):
    print(f"rank {rank} before")
    if rank == 1:
        assert rank + 1 == 5, "rank one disagrees"
    dist.barrier()


@pytest.mark.distributed(world_size=2)
def test_skips_everywhere(rank):
    pytest.skip("not on this runner")


@pytest.mark.distributed(world_size=2)
def test_unpicklable(a_lock, rank):
    pass


@pytest.mark.distributed(world_size=2)
def test_gloo_abort_after_report(rank):
    dist.barrier()
    if rank == 1:
        # A real SIGABRT after the rank reported success, where the gloo abort strikes: at exit.
        os._exit = lambda code: os.abort()


@pytest.mark.distributed(world_size=2)
def test_abort_before_report(rank):
    if rank == 1:
        os.abort()
    dist.barrier()


@pytest.mark.distributed(world_size=2, backend="nccl")
def test_needs_nccl(rank):
    pass


def test_plain():
    assert sum([1, 2]) == 3
'''


@pytest.mark.slow
def test_ranks_pass_fail_skip_abort_unpicklable(pytester: pytest.Pytester, tag: str):
    pytester.makepyfile(test_ranks=RANK_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--no-ddp-doctor", "-rA",
                                           "--junitxml=junit.xml", "-o", "junit_logging=all",
                                           timeout=OVERRUN)
    result.assert_outcomes(passed=4, failed=3, skipped=2)
    out = result.stdout.str()
    # every outcome came from what the ranks did (a failure, a crash, an abort), none from the timeout
    assert "timed out after" not in out and "s timeout" not in out, out
    result.stdout.fnmatch_lines([
        "*PASSED test_ranks.py::test_all_reduce[[]1[]]*",
        "*PASSED test_ranks.py::test_gloo_abort_after_report*",
        "*FAILED test_ranks.py::test_fails_on_rank1 - Failed: root cause: rank 1*",
        "*FAILED test_ranks.py::test_unpicklable - Failed: fixture 'a_lock' cannot*",
        "*FAILED test_ranks.py::test_abort_before_report - Failed: root cause: rank 1*",
    ])
    for line in ("root cause: rank 1 raised AssertionError: rank one disagrees",
                 "fixture 'a_lock' cannot be sent to the ranks (_thread.lock",
                 "root cause: rank 1 crashed with SIGABRT (abort) in native code at",
                 "not on this runner (skipped on all ranks)"):
        assert line in out, line
    if visible_gpu_count() < 2:
        assert "backend nccl with world_size=2 needs 2 GPU(s)" in out
    # the failing rank's traceback, then the peer labelled as a consequence of it
    result.stdout.fnmatch_lines([
        "*---- rank 1: root cause (DDP800): failed ----*",
        "*test_ranks.py*, line *, in test_fails_on_rank1*",
        "*AssertionError: rank one disagrees*",
        "*---- rank 0: a consequence of rank 1 (DDP802), in #1 barrier at *test_ranks.py:*: "
        "failed (+* s after rank 1) ----",
    ])
    result.stdout.fnmatch_lines(["*Captured stdout (rank 1) call*", "rank 1 before"])
    assert "rank 1 reported success, then aborted at exit (SIGABRT)" in out
    # per-rank output reaches JUnit's system-out
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    case = next(c for c in suite.findall("testcase") if c.get("name") == "test_fails_on_rank1")
    assert "rank 0 before" in (case.findtext("system-out") or "")
    assert_no_survivors(tag)


# ---------------------------------------------------------------- the judgement of `ddp-doctor run`
JUDGED_TESTS = r"""
import time

import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, timeout=6)
def test_rank1_returns(rank):
    if rank == 1:
        return
    dist.barrier()


@pytest.mark.distributed(world_size=2)
def test_rank1_raises(rank):
    if rank == 1:
        raise ValueError("rank one broke")
    t = torch.ones(2)
    dist.all_reduce(t)


@pytest.mark.distributed(world_size=2, timeout=6)
def test_rank1_leaves_the_loop_early(rank):
    t = torch.ones(2)
    for _ in range(2 if rank == 0 else 1):
        dist.all_reduce(t)


@pytest.mark.distributed(world_size=2)
def test_passes(rank):
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0]


@pytest.mark.distributed(world_size=2, timeout=3)
def test_hangs(rank):
    if rank == 0:
        time.sleep(600)
    dist.barrier()  # rank 0 never comes


@pytest.mark.distributed(world_size=2)
def test_after_the_hang(rank):
    dist.barrier()  # the session went on
"""


def lines_of(text: str, code: str) -> list[int]:
    """The lines of `code` in an inner test file as inner() writes it (dedented, stripped)."""
    return [i for i, ln in enumerate(textwrap.dedent(text).strip().splitlines(), 1) if ln.strip() == code]


def failure_text(out: str, test: str) -> str:
    """One test's section of the FAILURES block of an inner run."""
    start = out.index(f" {test} ")
    end = min([i for i in (out.find("\n___", start + 1), out.find("\n=====", start + 1)) if i > 0])
    return out[start:end]


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory):
    """One inner run of JUDGED_TESTS (two hangs bounded by their 6 s timeout, a rank that raises, a
    passing test, a hang bounded by its 3 s timeout and a test after it), read by the tests below;
    survivors are looked for as soon as it ends."""
    path, tag = tmp_path_factory.mktemp("judged"), uuid.uuid4().hex
    launches = {"judged": (inner(path, {"test_judged": JUDGED_TESTS},
                                 ["-p", "no:cacheprovider", "--no-ddp-doctor", "-rA", "--junitxml=junit.xml"],
                                 tag=tag), tag)}
    runs = run_inner(launches)
    return runs, path


@pytest.mark.slow
def test_a_rank_that_returned_while_its_peer_waits_is_judged_from_the_ranks_ledgers(judged_run):
    # rank 1 returns from the test; rank 0 waits in a barrier rank 1 never issued
    runs, path = judged_run
    result = inner_result(runs, "judged")
    result.assert_outcomes(passed=2, failed=4)  # test_passes and test_after_the_hang pass
    out = result.stdout.str()
    text = failure_text(out, "test_rank1_returns")
    (n,) = lines_of(JUDGED_TESTS, "dist.barrier()")
    # the hang is stopped by the parent, never by a rank leaving its group under its peer
    assert "Connection closed by peer" not in text and "failed first" not in text, text
    assert "rank(s)  still running" not in out
    lines = text.splitlines()
    assert re.search(r"timed out after 6 s; root cause: .* \[DDP89[123]\]$", lines[1]), lines[1]
    assert "timed out after 6 s: rank(s) 0, 1 still running" in lines
    # each rank's position and ledger, as the judgement read them
    assert re.search(rf"  rank 0: .*running at \S*test_judged\.py:{n} in test_rank1_returns; killed at the "
                     r"6 s timeout$", text, re.M), text
    assert f"      #1 barrier at {path}/test_judged.py:{n} (not completed)" in lines
    assert re.search(r"  rank 1: .*returned from test_rank1_returns \(finished\), waited for its peers; "
                     r"killed at the 6 s timeout$", text, re.M), text
    assert lines[lines.index(next(ln for ln in lines if ln.startswith("  rank 1: "))) + 1] == \
        "    ledger: no collective issued in the test"
    # each rank's stack when it was stopped, attached to the report
    result.stdout.fnmatch_lines([
        "*Captured stack when stopped (rank 0) call*",
        "Current thread 0x* (most recent call first):",
        "*distributed_c10d.py*in barrier",
        "*c10d_logger.py*",
        f'  File "{path}/test_judged.py", line {n} in test_rank1_returns',
        "*Captured stack when stopped (rank 1) call*",
        "returned from test_rank1_returns; waiting for its peers to finish",
    ])
    inner_survivors(runs, "judged")


@pytest.mark.slow
def test_the_rank_that_returned_is_the_root_cause_and_the_waiting_rank_a_consequence(judged_run):
    runs, path = judged_run
    text = failure_text(inner_result(runs, "judged").stdout.str(), "test_rank1_returns")
    (n,) = lines_of(JUDGED_TESTS, "dist.barrier()")
    assert re.search(rf"timed out after 6 s; root cause: rank 1 .*rank 0 waits in barrier #1 .*test_judged\.py:{n}"
                     r".*which rank 1 never issued \[DDP89[12]\]", text), text
    assert re.search(r"  rank 1: root cause \(DDP89[12]\); returned from test_rank1_returns", text), text
    assert f"  rank 0: waiting in #1 barrier at {path}/test_judged.py:{n}, a consequence of rank 1;" in text


@pytest.mark.slow
def test_a_rank_that_left_the_loop_early_is_the_root_cause(judged_run):
    # rank 1 runs one all_reduce, rank 0 two: rank 0 waits in #2, which rank 1 never issued
    runs, path = judged_run
    text = failure_text(inner_result(runs, "judged").stdout.str(), "test_rank1_leaves_the_loop_early")
    n = lines_of(JUDGED_TESTS, "dist.all_reduce(t)")[1]  # [0] is the raising test's
    lines = text.splitlines()
    assert lines[1] == (f"timed out after 6 s; root cause: rank 1 finished after 1 collectives of process group 0 "
                        f"(default_pg); rank 0 waits in all_reduce #2 (issued at {path}/test_judged.py:{n}), "
                        f"which rank 1 never issued [DDP892]"), lines[1]
    assert "  rank 1: root cause (DDP892); returned from test_rank1_leaves_the_loop_early (finished), waited " \
           "for its peers; killed at the 6 s timeout" in lines
    assert any(ln.startswith(f"  rank 0: waiting in #2 all_reduce Float[2] at {path}/test_judged.py:{n}, a "
                             f"consequence of rank 1; running at") for ln in lines), text
    assert "  DDP801 error (a consequence of DDP892): no progress for 6 s; rank 1 went its own way (DDP892, the root " \
           "cause). " in text
    result_lines = [ln for ln in lines if ln.startswith("---- rank ")]
    assert result_lines[0].startswith("---- rank 1: root cause (DDP892): returned from the test"), result_lines
    assert result_lines[1].startswith("---- rank 0: waiting in #2 all_reduce"), result_lines


@pytest.mark.slow
def test_the_rank_that_raised_is_the_cause_and_its_peer_in_all_reduce_a_consequence(judged_run):
    runs, path = judged_run
    result = inner_result(runs, "judged")
    text = failure_text(result.stdout.str(), "test_rank1_raises")
    (raised,) = lines_of(JUDGED_TESTS, 'raise ValueError("rank one broke")')
    reduced = lines_of(JUDGED_TESTS, "dist.all_reduce(t)")[0]
    assert text.splitlines()[1] == "root cause: rank 1 raised ValueError: rank one broke [DDP800]", text
    result.stdout.fnmatch_lines(["FAILED test_judged.py::test_rank1_raises - Failed: root cause: rank 1 raised*"])
    assert (f"  rank 1: root cause (DDP800); failed: ValueError: rank one broke (at {path}/test_judged.py:{raised} "
            f"in test_rank1_raises)") in text, text
    assert re.search(rf"  rank 0: a consequence of rank 1 \(DDP8\d\d\), in #1 all_reduce Float\[2\] at "
                     rf"\S*test_judged\.py:{reduced}; failed: RuntimeError: ", text), text
    assert f"      #1 all_reduce Float[2] at {path}/test_judged.py:{reduced} (failed here)" in text
    heads = [ln for ln in text.splitlines() if ln.startswith("---- rank ")]
    assert heads[0] == "---- rank 1: root cause (DDP800): failed ----", heads
    assert heads[1].startswith("---- rank 0: a consequence of rank 1"), heads


@pytest.mark.slow
def test_a_passing_distributed_test_stays_green_with_no_extra_text(judged_run):
    runs, path = judged_run
    result = inner_result(runs, "judged")
    result.stdout.fnmatch_lines(["PASSED test_judged.py::test_passes"])
    assert "PASSED test_judged.py::test_passes\n" in result.stdout.str() + "\n"
    assert "test_passes" not in result.stdout.str().split("short test summary info")[0]
    suite = ET.parse(path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    case = next(c for c in suite.findall("testcase") if c.get("name") == "test_passes")
    assert case.find("failure") is None and case.find("system-out") is None
    assert [p.get("name") for p in case.iter("property")] == ["ddp_doctor_ranks"]
    run_dir = path / "runpytest-0" / "ddp-test_passes0"
    assert run_dir.is_dir() and not (run_dir / "judgement.json").exists()


@pytest.mark.slow
def test_hang_is_bounded_shows_stacks_and_leaves_no_process(judged_run):
    runs, _ = judged_run
    result = inner_result(runs, "judged")
    (slept,) = lines_of(JUDGED_TESTS, "time.sleep(600)")
    (waits,) = lines_of(JUDGED_TESTS, "dist.barrier()  # rank 0 never comes")
    result.stdout.fnmatch_lines(["PASSED test_judged.py::test_after_the_hang"])  # the session went on after the hang
    result.stdout.fnmatch_lines([
        # rank 0 never issued the barrier rank 1 waits in: the ledgers name it (DDP891)
        f"*timed out after 3 s; root cause: rank 1 waits in barrier #1 *(issued at *test_judged.py:{waits}); "
        f"rank 0 never issued #1 (it issued none): it is at *test_judged.py:{slept} in test_hangs [[]DDP891[]]",
        "timed out after 3 s: rank(s) 0, 1 still running",
        "*---- rank 0: root cause (DDP891): still running at the 3 s timeout; killed. Its Python stack: ----*",
        f"*test_judged.py*line {slept} in test_hangs*",
        f"*---- rank 1: waiting in #1 barrier at *test_judged.py:{waits}, a consequence of rank 0: still running at "
        "the 3 s timeout; killed. Its Python stack: ----*",
        "*in barrier*",
    ])  # ended by the marker's 3 s bound: "timed out after 3 s", each rank "at the 3 s timeout; killed"
    inner_survivors(runs, "judged")


# A hang where each rank says when it is where the hang keeps it: rank 0 about to sleep, rank 1
# inside the barrier (a thread of its own sees the main thread's stack there), so a test can stop
# pytest while the ranks are in the hung test, not before, without guessing how long they take.
HANG_SAYS_WHERE = r'''
import os
import sys
import threading
import time
import pytest
import torch.distributed as dist


def arrived(rank):
    open(os.path.join(os.environ["HANG_MARKS"], f"rank{rank}"), "w").close()


def once_in_barrier(rank):
    main = threading.main_thread().ident

    def watch():
        while True:
            frame = sys._current_frames().get(main)
            while frame is not None and frame.f_code.co_name != "barrier":
                frame = frame.f_back
            if frame is not None:
                return arrived(rank)
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()


@pytest.mark.distributed(world_size=2, timeout=300)
def test_hangs(rank):
    if rank == 0:
        arrived(0); time.sleep(600)
    once_in_barrier(1)
    dist.barrier()
'''


def start_hung_session(pytester: pytest.Pytester, **popen: Any) -> subprocess.Popen:
    """pytest on HANG_SAYS_WHERE, returned once both ranks are in the hung test (bounded wait)."""
    pytester.makepyfile(test_hang=HANG_SAYS_WHERE)
    marks = pytester.path / "marks"
    marks.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-ddp-doctor",
                             "-k", "test_hangs"], cwd=pytester.path, env={**os.environ, "HANG_MARKS": str(marks)},
                            **popen)
    try:
        wait_for(lambda: {p.name for p in marks.iterdir()} == {"rank0", "rank1"}, 120,
                 lambda: f"both ranks in the hung test (arrived: {sorted(p.name for p in marks.iterdir())}; "
                         f"processes: {[p.cmdline() for p in tagged(os.environ[TAG_ENV])]})")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


@pytest.mark.slow
def test_killing_pytest_leaves_no_rank(pytester: pytest.Pytester, tag: str):
    proc = start_hung_session(pytester, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.kill()  # SIGKILL: no cleanup code in pytest runs
        proc.wait(10)
        assert_no_survivors(tag)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_sigterm_to_pytest_shows_where_the_ranks_were_and_exits_143(pytester: pytest.Pytester, tag: str):
    # a cancelled CI job: SIGTERM to pytest while a distributed test hangs
    proc = start_hung_session(pytester, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=OVERRUN)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "rank 0 was running when the session was stopped; its Python stack:" in out, out
    assert "test_hang.py" in out and "in test_hangs" in out
    assert "rank 1 was running when the session was stopped" in out and "barrier" in out
    assert_no_survivors(tag)


# 4 distributed tests: xdist first hands each worker two consecutive items, so each worker runs
# some (wherever the preflight's item falls) and reads the controller's one verdict
XDIST_TESTS = r'''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.parametrize("i", range(4))
@pytest.mark.distributed(world_size=2)
def test_sum(i, rank):
    t = torch.tensor([float(i + rank)])
    dist.all_reduce(t)
    assert t.item() == 2 * i + 1


def test_plain():
    pass
'''


PREFLIGHT_TESTS = r'''
import pytest
import torch.distributed as dist


@pytest.mark.parametrize("i", range(3))
@pytest.mark.distributed(world_size=2)
def test_dist(i, rank):
    dist.barrier()


def test_plain():
    pass
'''


@pytest.fixture(scope="module")
def slow_runs(tmp_path_factory):
    """The slow inner runs that neither signal pytest nor bound its time, started together."""
    import importlib.util
    launches = {}
    if importlib.util.find_spec("xdist") is not None:
        path, tag = tmp_path_factory.mktemp("xdist"), uuid.uuid4().hex
        launches["xdist"] = (inner(path, {"test_x": XDIST_TESTS}, [
            "-p", "no:cacheprovider", "-n", "2", CHEAP_PREFLIGHT, "--ddp-report", str(path / "pre.json")],
            tag=tag), tag)
    if visible_gpu_count() < 1:
        path = tmp_path_factory.mktemp("preflight_failure")
        launches["preflight_failure"] = (inner(path, {"test_p": PREFLIGHT_TESTS}, [
            "-p", "no:cacheprovider", "--ddp-expect-gpus", "1", CHEAP_PREFLIGHT, "--ddp-report",
            str(path / "runner.json"), "--junitxml=junit.xml", "-rs"], tag=uuid.uuid4().hex), None)
        path = tmp_path_factory.mktemp("deselect")
        launches["deselect"] = (inner(path, {"test_p": PREFLIGHT_TESTS}, [
            "-p", "no:cacheprovider", CHEAP_PREFLIGHT, "--ddp-preflight-failure", "deselect",
            "--ddp-expect-gpus=1"], tag=uuid.uuid4().hex), None)
    return run_inner(launches), {name: Path(launch.cwd) for name, (launch, _) in launches.items()}


@pytest.mark.slow
def test_xdist_two_workers_one_preflight(slow_runs):
    pytest.importorskip("xdist")
    runs, paths = slow_runs
    path = paths["xdist"]
    result = inner_result(runs, "xdist")
    result.assert_outcomes(passed=5)  # 4 distributed, 1 plain; the preflight is counted apart
    result.stdout.fnmatch_lines(["*5 passed*1 preflight passed*"])
    assert result.stdout.str().count("ddp-doctor runner preflight") == 1
    result.stdout.fnmatch_lines(["*verdict: PASS*", "*gloo x 2 ranks: pass in *"])
    assert (path / "pre.json").exists()
    inner_survivors(runs, "xdist")


@pytest.mark.slow
def test_preflight_failure_is_one_failure_plus_skips_and_junit(slow_runs):
    if visible_gpu_count() >= 1:
        pytest.skip("this runner has a GPU: --ddp-expect-gpus 1 would pass")
    runs, paths = slow_runs
    path = paths["preflight_failure"]
    report = path / "runner.json"
    result = inner_result(runs, "preflight_failure")
    result.assert_outcomes(passed=1, failed=1, skipped=3)
    result.stdout.fnmatch_lines([
        "*ddp_doctor::preflight*",
        "runner preflight failed: DDP590 Fewer GPUs than the runner should have: 0 GPU(s) usable*",
        "*ddp-doctor runner preflight*",
        "verdict: FAIL - DDP590*",
        "GPUs: 0 visible, 1 expected",
        "SKIPPED [[]3[]] *runner preflight failed: DDP590*",
    ])
    assert str(report) in result.stdout.str()
    assert "--ddp-expect-gpus" in result.stdout.str()  # the option a pytest user set, by its own name
    assert report.exists()
    suite = ET.parse(path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("skipped"), suite.get("errors")) == ("1", "3", "0")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["ddp_doctor_status"] == "fail"
    assert props["ddp_doctor_expect_gpus"] == "1"
    assert props["ddp_doctor_root_cause"].startswith("DDP590")
    assert props["ddp_doctor_report"] == str(report)
    failed = [c for c in suite.findall("testcase") if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failed] == [("ddp_doctor", "preflight")]


@pytest.mark.slow
def test_preflight_failure_deselect_option(slow_runs):
    if visible_gpu_count() >= 1:
        pytest.skip("this runner has a GPU: --ddp-expect-gpus 1 would pass")
    runs, _ = slow_runs
    result = inner_result(runs, "deselect")
    result.assert_outcomes(passed=1, failed=1, deselected=3)


# ---------------------------------------------------------------- inert and settings
A_TEST = "def test_a():\n    pass\n"


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    """The inner runs of the settings tests (no ranks), started together; each in a directory of its
    own, as pytester would give it (the file named after its test)."""
    def at(name: str, files: dict[str, str], args: list[str], **kw) -> tuple[Launch, None]:
        return inner(tmp_path_factory.mktemp(name), files, ["-p", "no:cacheprovider", *args], **kw), None

    bad = {"test_bad_values_name_their_source": A_TEST}
    launches = {
        "inert": at("inert", {"test_plugin_is_inert_without_the_marker": A_TEST}, []),
        "bad_cli": at("bad_cli", bad, ["--ddp-expect-gpus", "many"]),
        "bad_env": at("bad_env", bad, [], env={"DDP_DOCTOR_TEST_TIMEOUT": "-3"}),
        "cli_wins": at("cli_wins", bad, ["--ddp-timeout", "5"], env={"DDP_DOCTOR_TEST_TIMEOUT": "-3"}),
        "bad_ini": at("bad_ini", bad, [], unset=("DDP_DOCTOR_TEST_TIMEOUT",), ini="[pytest]\nddp_doctor = maybe\n"),
        "marker": at("marker", {"test_marker_arguments_are_checked":
                                "import pytest\n\n@pytest.mark.distributed(world_size=0)\n"
                                "def test_a(rank):\n    pass\n"}, ["--no-ddp-doctor"]),
    }
    return run_inner(launches), {name: Path(launch.cwd) for name, (launch, _) in launches.items()}


@pytest.mark.slow
def test_plugin_is_inert_without_the_marker(quick_runs):
    runs, paths = quick_runs
    result = inner_result(runs, "inert")
    result.assert_outcomes(passed=1)
    assert "ddp-doctor runner preflight" not in result.stdout.str()
    assert not (paths["inert"] / "ddp-doctor-report.json").exists()


@pytest.mark.slow
def test_bad_values_name_their_source(quick_runs):
    runs, _ = quick_runs
    r = inner_result(runs, "bad_cli")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*ddp-doctor: command line --ddp-expect-gpus='many': is not a valid value*"])
    r = inner_result(runs, "bad_env")  # DDP_DOCTOR_TEST_TIMEOUT=-3
    r.stderr.fnmatch_lines(["*ddp-doctor: environment DDP_DOCTOR_TEST_TIMEOUT='-3': must be more than 0 seconds*"])
    # the command line wins over the environment
    r = inner_result(runs, "cli_wins")  # --ddp-timeout 5 and DDP_DOCTOR_TEST_TIMEOUT=-3
    r.assert_outcomes(passed=1)
    r = inner_result(runs, "bad_ini")  # no DDP_DOCTOR_TEST_TIMEOUT; tox.ini: ddp_doctor = maybe
    r.stderr.fnmatch_lines(["*ddp-doctor: ini ddp_doctor in *tox.ini='maybe': must be true, false or auto*"])


@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "0", "abc"])
def test_a_timeout_setting_is_a_bound_by_the_one_rule(value):
    """--ddp-timeout and --ddp-preflight-timeout take what --timeout takes (time_limit.usable_timeout):
    inf or 1e308 is no bound, whatever source gives it."""
    from types import SimpleNamespace

    from ddp_doctor.pytest_plugin.settings import SETTINGS, resolve
    config = SimpleNamespace(getoption=lambda dest, default=None: None, getini=lambda name: None, inipath=None)
    for setting in (s for s in SETTINGS if s.dest in ("ddp_timeout", "ddp_preflight_timeout")):
        with pytest.raises(pytest.UsageError, match=f"environment {setting.env}='{value}': (is|must) .*at most 86400"):
            resolve(config, setting, {setting.env: value})
        assert resolve(config, setting, {setting.env: "86400"}) == (86400.0, f"environment {setting.env}")


@pytest.mark.parametrize(("timeout", "ok"), [(float("inf"), False), (1e308, False), (0, False), (-1, False),
                                             (True, False), ("5", False), (5, True), (86400, True)])
def test_the_marker_timeout_is_a_bound_by_the_one_rule(timeout, ok):
    from types import SimpleNamespace

    from ddp_doctor.pytest_plugin.marker import mark_spec
    mark = SimpleNamespace(args=(), kwargs={"timeout": timeout})
    item = SimpleNamespace(get_closest_marker=lambda name: mark, nodeid="t.py::test_a")
    spec = mark_spec(item, SimpleNamespace(timeout=None))
    assert (spec.error is None) is ok, spec
    assert ok or "must be a number of seconds more than 0 and at most one day" in spec.error


@pytest.mark.slow
def test_marker_arguments_are_checked(quick_runs):
    runs, _ = quick_runs
    r = inner_result(runs, "marker")
    r.assert_outcomes(errors=1)
    r.stdout.fnmatch_lines(["*@pytest.mark.distributed(...) on test_marker_arguments_are_checked.py::test_a: "
                            "world_size=0 must be a whole number of at least 1*"])


# ---------------------------------------------------------------- GPU-only path
@pytest.mark.gpu
@pytest.mark.slow
def test_nccl_ranks_on_gpus(pytester: pytest.Pytester, tag: str):
    if visible_gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs for a 2-rank NCCL test; {visible_gpu_count()} visible")
    pytester.makepyfile(test_n=r'''
import pytest, torch, torch.distributed as dist

@pytest.mark.distributed(world_size=2, backend="auto")
def test_nccl(rank):
    assert dist.get_backend() == "nccl"
    t = torch.ones(1, device=f"cuda:{rank}")
    dist.all_reduce(t)
    assert t.item() == 2
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", CHEAP_PREFLIGHT)
    result.assert_outcomes(passed=1)  # the preflight is counted apart
    result.stdout.fnmatch_lines(["*nccl x * ranks: pass*"])
    assert_no_survivors(tag)


# ---------------------------------------------------------------- ddp_doctor.testing
def test_simulated_sagemaker_sets_and_restores(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SM_NUM_GPUS", "99")
    monkeypatch.delenv("SM_HOSTS", raising=False)
    with simulated_sagemaker(hosts=["algo-1", "algo-2"], current_host="algo-2", num_gpus=4,
                             distribution="torch_distributed", root=tmp_path) as sm:
        assert os.environ["SM_HOSTS"] == '["algo-1", "algo-2"]'
        assert os.environ["SM_CURRENT_HOST"] == "algo-2" and os.environ["SM_NUM_GPUS"] == "4"
        assert os.environ["DDP_DOCTOR_SM_ROOT"] == str(tmp_path) == sm.root
        from ddp_doctor.facts import sagemaker_env as sagemaker
        view = sagemaker.read(os.environ)
        assert view is not None and view.distribution == "torch_distributed"
        assert view.rc_current_host == "algo-2" and view.master_hostname == "algo-1"
        # the toolkit's output directory exists and a report goes there by default, as in a container
        from ddp_doctor.report.publish import Output
        assert Output().path() == str(tmp_path / "output" / "data" / "ddp-doctor-report.json")
        assert (tmp_path / "output" / "data").is_dir() and (tmp_path / "model").is_dir()
    assert os.environ["SM_NUM_GPUS"] == "99" and "SM_HOSTS" not in os.environ
    assert os.environ.get("SM_OUTPUT_DATA_DIR") != str(tmp_path / "output" / "data")
    assert "DDP_DOCTOR_SM_ROOT" not in os.environ


def test_ddp_doctor_fixture_runs_local_checks(ddp_doctor: LocalChecks, tmp_path):
    with simulated_sagemaker(hosts=["algo-1", "algo-2"], num_gpus=8, root=tmp_path):
        findings = ddp_doctor(select=["launcher_env", "sagemaker_env"])
    # a single process in a two-host SageMaker job, started by no launcher
    assert "DDP107" in findings.ids, [(f.id, f.message) for f in findings]
    assert all(f.category in ("launcher_env", "sagemaker_env") for f in findings)


def test_forkserver_module_imports_no_torch():
    code = ("import sys, ddp_doctor.pytest_plugin, ddp_doctor.pytest_plugin.rank_pool, "
            "ddp_doctor.pytest_plugin.rank_pool.forkserver, ddp_doctor.pytest_plugin.rank_pool.worker; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    assert wire.PRELOAD[0] == "torch"


def test_a_ranks_long_output_is_read_head_and_tail_only(tmp_path):
    from ddp_doctor.pytest_plugin.rank_pool.results import read_text
    path = tmp_path / "out.txt"
    path.write_bytes(b"first line\n" + b"x" * 5_000_000 + b"\nlast line\n")
    text = read_text(str(path), limit=1000)
    assert text.startswith("first line\n") and text.endswith("last line\n") and "[... cut ...]" in text
    assert len(text) < 1100
    path.write_text("short é\n")
    assert read_text(str(path), limit=1000) == "short é\n"
    assert read_text(str(tmp_path / "none.txt")) == ""
