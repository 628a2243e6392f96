"""What keeps a rank alive after its script ended (DDP806): the pure rule over the "held_by" record
(checks/teardown.py exit_holders, rank_endings.py) and the rank's own reading of what it holds
(training/probes/exit_holders.py), with a failing and a passing case each."""
from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading

from ddp_doctor.checks.leftover_rules import rank_leftover_findings
from ddp_doctor.checks.rank_endings import training_findings
from ddp_doctor.checks.teardown import exit_holders
from ddp_doctor.training.probes import exit_holders as probe

UPLOADER = {"name": "metrics-uploader", "ident": 1, "where": "/usr/lib/python3.11/threading.py:327 in wait",
            "called": "/usr/lib/python3.11/queue.py:171 in get", "user_where": "/job/train.py:9 in worker",
            "started_at": "/job/train.py:14"}
CHILD = {"pid": 4242, "cmdline": "python serve.py --password=***", "started_at": "/job/train.py:20"}


def outcome(**extra) -> dict:
    return {"exit_code": 0, "exception": None, "time": 100.0, **extra}


def test_a_non_daemon_thread_and_a_child_are_named_with_where_they_block_and_started():
    said = exit_holders({"threads": [UPLOADER], "children": [CHILD]})
    assert said == ("thread 'metrics-uploader' (not a daemon) blocked at /usr/lib/python3.11/threading.py:327 in "
                    "wait (in /usr/lib/python3.11/queue.py:171 in get), from /job/train.py:9 in worker, started "
                    "at /job/train.py:14; child process pid 4242 "
                    "(python serve.py --password=***), started at /job/train.py:20")


def test_nothing_held_or_no_record_is_not_the_scripts():
    assert exit_holders({"threads": [], "children": []}) is None
    assert exit_holders(None) is None and exit_holders("garbage") is None


def test_a_rank_held_by_its_scripts_thread_is_an_error_and_keeps_the_scripts_status():
    outcomes = {0: outcome(held_by={"threads": [UPLOADER], "children": []}), 1: outcome()}
    findings, code = training_findings(outcomes, {0: -signal.SIGKILL, 1: 0}, [0, 1])
    (f,) = findings
    assert (f.id, f.severity, f.ranks, code) == ("DDP806", "error", [0], 0)
    assert "metrics-uploader" in f.message and "started at /job/train.py:14" in f.message
    assert f.evidence["held_by"]["threads"][0]["name"] == "metrics-uploader"


def test_a_rank_stuck_in_teardown_holding_nothing_stays_a_warning():
    outcomes = {0: outcome(held_by={"threads": [], "children": []}), 1: outcome()}
    findings, code = training_findings(outcomes, {0: -signal.SIGKILL, 1: 0}, [0, 1])
    (f,) = findings
    assert (f.id, f.severity, code) == ("DDP806", "warning", 0) and "kept it alive" not in f.message


def test_a_leftover_child_is_a_warning_naming_the_line_that_started_it():
    record = {"processes": [{**CHILD, "ppid": 1, "sid": 1, "ports": [], "found_by": "child", "ended": "SIGTERM"}],
              "grace": 2.0}
    (job,) = rank_leftover_findings(1, record)
    (test,) = rank_leftover_findings(1, record, started_by="test")
    assert (job.id, job.severity, test.severity) == ("DDP816", "warning", "warning")
    assert "started at /job/train.py:20" in job.message and "hunter2" not in job.message


def test_the_rank_reads_its_non_daemon_thread_and_child_with_their_start_lines():
    probe.install()
    q: queue.Queue = queue.Queue()

    def worker():
        q.get()  # blocks here until the test puts its sentinel

    t = threading.Thread(target=worker, name="metrics-uploader")
    d = threading.Thread(target=q.get, name="daemon-helper", daemon=True)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "--password=hunter2"],
                             stdin=subprocess.PIPE)
    t.start()
    d.start()
    try:
        held = probe.holding()
        (thread,) = [h for h in held["threads"] if h["name"] == "metrics-uploader"]
        assert "daemon-helper" not in {h["name"] for h in held["threads"]}
        assert thread["started_at"].startswith(__file__) and "threading.py" in thread["where"]
        assert "queue.py" in thread["called"] and thread["user_where"].endswith("in worker")
        (kid,) = [c for c in held["children"] if c["pid"] == child.pid]
        assert kid["started_at"].startswith(__file__) and "hunter2" not in kid["cmdline"]
    finally:
        q.put(None)
        q.put(None)
        child.communicate(timeout=60)
        t.join(timeout=60)
        d.join(timeout=60)
    held = probe.holding()  # joined and waited: nothing of this test holds the process
    assert "metrics-uploader" not in {h["name"] for h in held["threads"]}
    assert child.pid not in {c["pid"] for c in held["children"]}
