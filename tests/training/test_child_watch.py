"""Ending what a rank's script left (training/run/child_watch.py) on real child processes, and the
findings made of it (checks/leftover_rules.py, DDP816-DDP818) in the job's verdict."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from ddp_doctor.checks.job import JobEvidence, job_findings
from ddp_doctor.checks.leftover_rules import COMMAND_CHARS, leftover_findings, rank_leftover_findings
from ddp_doctor.report.publish import Output, publish
from ddp_doctor.report.redact import redact_obj
from ddp_doctor.training.job_report import job_report
from ddp_doctor.training.run import child_watch as leftovers
from ddp_doctor.training.run.ledger import process_gone

# says "ready" once its SIGTERM handling is in place; STUBBORN ignores SIGTERM
POLITE = "import time; print('ready', flush=True); time.sleep(60)"
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(60)")


@pytest.fixture
def children():
    """Start children that wait to be ended; kill what a failing test leaves."""
    started: list[subprocess.Popen] = []

    def start(code: str, env: dict[str, str], args: tuple[str, ...] = ("--password", "hunter2")) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_what_the_script_left_is_described_then_ended_by_sigterm_or_after_the_grace_by_sigkill(children):
    env = dict(os.environ)
    before = children(POLITE, env)  # started before the script: not the script's
    watch = leftovers.watch_children(environ=env)
    assert env[leftovers.facts.MARK_ENV] == watch.mark
    polite, stubborn = children(POLITE, env), children(STUBBORN, env)
    record = watch.end(grace=0.5)
    procs = {p["pid"]: p for p in record["processes"]}
    assert set(procs) == {polite.pid, stubborn.pid} and "error" not in record
    assert procs[polite.pid]["ended"] == "SIGTERM" and procs[stubborn.pid]["ended"] == "SIGKILL"
    assert procs[polite.pid]["found_by"] == "child" and procs[polite.pid]["ppid"] == os.getpid()
    assert "hunter2" not in procs[polite.pid]["cmdline"] and "time.sleep(60)" in procs[polite.pid]["cmdline"]
    assert polite.wait(10) == -15 and stubborn.wait(10) == -9
    assert before.poll() is None


# each child's secret on its command line, and how its redacted form closes its description
SECRET_ARGS = {("--password=hunter2-pw",): "--password=***)", ("--token", "hunter2-tok"): "--token ***)",
               ("--secret=hunter2-sec",): "--secret=***)"}


def test_leftovers_with_secrets_on_their_command_lines_are_named_redacted_in_the_report_and_on_stderr(
        children, tmp_path):
    """Real children, the job's report as it is written and shown: each leftover named by pid with
    its command line, the value masked and the text around it kept; the secret nowhere."""
    env = dict(os.environ)
    watch = leftovers.watch_children(environ=env)
    procs = {children(POLITE, env, args).pid: shown for args, shown in SECRET_ARGS.items()}
    record = watch.end(grace=0.5)
    assert {p["pid"] for p in record["processes"]} == set(procs), record
    rep, code = job_report(JobEvidence(ranks=[0, 1], outcomes={
        0: {"exit_code": 0, "exception": None, "time": 1.0},
        1: {"exit_code": 0, "exception": None, "time": 1.0, "leftovers": record}}), world={"launcher": "test"})
    stream = io.StringIO()
    publish(rep, Output(report_path=str(tmp_path / "r.json"), stderr=True), stream=stream)
    text, said = (tmp_path / "r.json").read_text(), stream.getvalue()
    assert code == 0 and "hunter2" not in text and "hunter2" not in said, said
    (found,) = [f for f in json.loads(text)["findings"] if f["id"] == "DDP816"]
    for message in (found["message"], said):
        for pid, shown in procs.items():
            at = message.index(f"pid {pid} (")
            named = message[at:message.index("ended by", at)]  # ", started at ..." where the probes saw the start
            assert f"{shown}, its child" in named and named.endswith(": "), named
    assert sorted(p["cmdline"].split(" time.sleep(60) ")[1] for p in found["evidence"]["processes"]) == \
        ["--password=***", "--secret=***", "--token ***"], found["evidence"]


def test_a_command_line_cut_for_the_message_keeps_its_mask_whole():
    """A long command line is cut for the message, never inside a masked value: the report's own
    redaction of the message then leaves the description as it is."""
    head = ("python " + "x" * COMMAND_CHARS)[:COMMAND_CHARS - 2 - len(" --token ")] + " --token "
    assert len(head) == COMMAND_CHARS - 2  # the cut (COMMAND_CHARS - 1 characters) falls inside "***"
    proc = {**PROC, "cmdline": head + "*** --port 8000", "ports": []}
    (ended,) = rank_leftover_findings(1, {"processes": [proc], "grace": 2.0})
    assert "--token ***…), reparented away" in ended.message, ended.message
    assert redact_obj(ended.to_dict())["message"] == ended.message


def test_a_script_that_left_nothing_has_no_record_and_a_failed_search_is_recorded_not_raised(children, monkeypatch):
    env = dict(os.environ)
    watch = leftovers.watch_children(environ=env)
    done = subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)  # started and waited for
    assert done.returncode == 0
    assert watch.end() is None

    def broken(mark=None):
        raise PermissionError("/proc is not readable")
    monkeypatch.setattr(leftovers.facts, "process_table", broken)
    assert leftovers.watch_children(environ={}).end() == {
        "processes": [], "grace": leftovers.GRACE, "error": "PermissionError: /proc is not readable"}


PROC = {"pid": 4704, "ppid": 1, "sid": 4704, "cmdline": "python -m http.server 8000", "ports": ["0.0.0.0:8000"],
        "found_by": "environment mark", "ended": "SIGKILL"}


def test_findings_quote_each_process_and_say_how_it_ended_or_why_not():
    (ended,) = rank_leftover_findings(1, {"processes": [PROC], "grace": 2.0})
    assert (ended.id, ended.severity, ended.ranks, ended.category) == ("DDP816", "warning", [1], "teardown")
    assert ended.message == (
        "rank 1's script left 1 process running after it ended; ddp-doctor ended it: pid 4704 (python -m "
        "http.server 8000) listening on 0.0.0.0:8000, reparented away from it (a daemon), found by ddp-doctor's "
        "mark in its environment, in a session of its own: ended by SIGKILL (2 s after SIGTERM)")
    assert "terminate()" in ended.hint and ended.evidence["processes"] == [PROC]
    stuck = {**PROC, "pid": 4705, "ended": "still running", "ports": []}
    found = rank_leftover_findings(0, {"processes": [PROC, stuck], "grace": 2.0, "error": "OSError: x"},
                                   started_by="test")
    assert [f.id for f in found] == ["DDP816", "DDP817", "DDP818"]
    assert found[1].message.startswith("rank 0's test left 1 process that ddp-doctor could not end: pid 4705 (")
    assert "still running after SIGKILL" in found[1].message and "kill -9 4705" in found[1].hint
    assert found[2].severity == "info" and "OSError: x" in found[2].message


@pytest.mark.parametrize("record", [None, "text", [], {"processes": "x"}, {"processes": [1, None]},
                                    {"processes": [{}], "grace": "soon"}])
def test_a_malformed_record_gives_no_finding_or_a_plain_one_never_an_error(record):
    for f in rank_leftover_findings(0, record):
        assert f.id == "DDP816" and "pid None" in f.message
    assert leftover_findings({0: {"leftovers": record}, 1: "not a dict"}) is not None


def test_the_jobs_verdict_and_exit_code_stay_its_own_with_leftovers():
    left = {"processes": [PROC], "grace": 2.0}
    ok = JobEvidence(ranks=[0, 1], outcomes={0: {"exit_code": 0, "exception": None, "time": 1.0},
                                             1: {"exit_code": 0, "exception": None, "time": 1.0, "leftovers": left}})
    findings, code = job_findings(ok)
    assert code == 0 and [f.id for f in findings] == ["DDP816"]
    rep, _ = job_report(ok, world={"launcher": "test"})
    assert rep["status"] == "warn" and rep["root_cause"] is None
    failed = JobEvidence(ranks=[0, 1], outcomes={
        0: {"exit_code": 0, "exception": None, "time": 2.0},
        1: {"exit_code": 1, "exception": {"type": "ValueError", "message": "bad batch", "traceback": "",
                                          "time": 1.0}, "time": 1.0, "leftovers": left}})
    rep, code = job_report(failed, world={"launcher": "test"})
    assert code == 1 and rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP800"
    assert "DDP816" in {f["id"] for f in rep["findings"]}


def test_a_process_that_is_gone_is_not_signalled():
    assert leftovers._send(2 ** 22 + 12345, 0.0, 15) is None and process_gone(2 ** 22 + 12345)
