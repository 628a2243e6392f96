"""A stop signal (SIGTERM, SIGINT, SIGHUP) to `ddp-doctor analyze`, on real processes: it ends the
analysis at once wherever it waits (a read of stdin that never ends, an AWS call that never
answers), exits 128 + the signal as the default action would, and --report PATH then holds a whole
report that says "interrupted" (DDP955: the signal, its sender, what the analysis was doing), never
a partial file, a verdict from part of the artifacts, or a report left from an earlier analysis.
A stop sent as the command starts is held from its first instruction and reported the same way.

Every wait is for a state (the process blocked in its read of stdin, the endpoint holding its
request, the stop signals held), bounded; every process started is ended in `finally`."""
from __future__ import annotations

import http.server
import json
import os
import platform
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from helpers.procs import DDP, clean_env, kill_tree, wait_for

from ddp_doctor.report.schema import validate_report

pytestmark = pytest.mark.slow

READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(platform.machine())
START_BOUND = 90.0  # the command's imports on a loaded 2-core runner; a bound, no verdict
END_BOUND = 60.0
OLD_REPORT = {"status": "pass", "note": "left by an earlier analysis"}
LINES = b"[rank0]: step 1 loss 2.30\n[rank1]: step 1 loss 2.31\n"


def _syscall(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/syscall", encoding="ascii") as f:
            return f.read().split()
    except OSError:
        return []


def blocked_reading_stdin(pid: int) -> bool:
    """Whether the process's main thread is blocked in read(0, ...): analyze waits for stdin."""
    fields = _syscall(pid)
    return len(fields) > 1 and fields[0] == str(READ_SYSCALL) and int(fields[1], 16) == 0


def holds_stop_signals(pid: int) -> bool:
    """Whether SIGTERM is blocked or caught in the process: its first instruction (cli) has run."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    bit = 1 << (signal.SIGTERM - 1)
    return any(int(fields.get(k, "0").strip() or "0", 16) & bit for k in ("SigBlk", "SigCgt"))


@pytest.fixture
def stdin_fifo(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(read end, write end) of a FIFO the test keeps open without ending it: a reader of the read
    end waits for more for ever. The write end is opened first (O_RDWR never waits for a peer)."""
    path = tmp_path / "stdin.fifo"
    os.mkfifo(path)
    writer = os.open(path, os.O_RDWR)
    reader = os.open(path, os.O_RDONLY)
    try:
        yield reader, writer
    finally:
        for fd in (reader, writer):
            try:
                os.close(fd)
            except OSError:
                pass


def _start(cmd: list[str], stdin: int, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    # SIGINT's default action restored in the child: a shell that starts the tests in the
    # background leaves SIGINT ignored, and the child would inherit that
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(cwd), env=env or clean_env(), start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _end(proc: subprocess.Popen[str]) -> None:
    """Kill it if it still runs (never a pid once reaped: it may be another process's by now)."""
    if proc.poll() is None:
        kill_tree(proc.pid)
        proc.wait(30)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=END_BOUND)
    except subprocess.TimeoutExpired:
        _end(proc)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"analyze outlived its stop by {END_BOUND:g} s; stderr:\n{err[-3000:]}") from None
    return proc.returncode, out, err


def _interrupted(path: Path, signo: int, stage: str | tuple[str, ...]) -> dict[str, Any]:
    """The report at `path`: whole, valid, "interrupted" by `signo` from this test, DDP955 alone."""
    rep = json.loads(path.read_text())
    assert validate_report(rep) == [], validate_report(rep)
    assert rep["status"] == "interrupted", rep
    assert rep["interrupted"]["signo"] == signo and rep["interrupted"]["sender_pid"] == os.getpid(), rep
    assert [f["id"] for f in rep["findings"]] == ["DDP955"], rep["findings"]
    stopped = rep["findings"][0]
    assert stopped["severity"] == "warning" and rep["root_cause"] is None, stopped
    assert stopped["evidence"]["stage"] in ((stage,) if isinstance(stage, str) else stage), stopped
    assert signal.Signals(signo).name in stopped["message"] and "no verdict" in stopped["message"], stopped
    assert rep["measurements"]["post_mortem"]["finished"] is False, rep["measurements"]
    return rep


@pytest.mark.skipif(READ_SYSCALL is None, reason="the read syscall's number is known for x86_64 and aarch64")
@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_while_analyze_waits_on_stdin_ends_it_with_an_interrupted_report(tmp_path, stdin_fifo, signo):
    reader, writer = stdin_fifo
    report = tmp_path / "report.json"
    report.write_text(json.dumps(OLD_REPORT))  # an earlier analysis's: it must not stand for this one
    os.write(writer, LINES)  # read, then analyze waits for more: the FIFO never ends
    proc = _start([*DDP, "analyze", "-", "--report", str(report), "--json"], reader, tmp_path)
    try:
        wait_for(lambda: blocked_reading_stdin(proc.pid) or proc.poll() is not None, START_BOUND,
                 lambda: f"analyze to block reading stdin; /proc/{proc.pid}/syscall: {_syscall(proc.pid)}")
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signo)
        rc, out, err = _finish(proc)
    finally:
        _end(proc)
    assert rc == 128 + signo, (rc, err[-3000:])
    assert "Traceback" not in err, err
    rep = _interrupted(report, signo, "reading <stdin>")
    assert json.loads(out)["status"] == "interrupted"  # --json: the same report, whole, on stdout
    assert rep["interrupted"]["sender"], rep["interrupted"]


@pytest.mark.skipif(READ_SYSCALL is None, reason="the read syscall's number is known for x86_64 and aarch64")
def test_a_stop_sent_as_analyze_starts_is_held_and_reported(tmp_path, stdin_fifo):
    """Sent once the first instruction has run (the stop signals held), long before the analysis
    starts: no default action kills it on the way, the report says "interrupted"."""
    reader, _writer = stdin_fifo
    report = tmp_path / "report.json"
    proc = _start([*DDP, "analyze", "-", "--report", str(report)], reader, tmp_path)
    try:
        wait_for(lambda: holds_stop_signals(proc.pid) or proc.poll() is not None, START_BOUND,
                 "the command's first instruction (the stop signals held)")
        os.kill(proc.pid, signal.SIGTERM)
        rc, out, err = _finish(proc)
    finally:
        _end(proc)
    assert rc == 143, (rc, err[-3000:])
    # taken when the analysis begins, or (a slow start) at its first wait: both say so
    rep = _interrupted(report, signal.SIGTERM, ("starting, before it read any input", "reading <stdin>"))
    assert rep["measurements"]["post_mortem"]["inputs_read"] == 0
    assert "INTERRUPTED" in out and "DDP955" in out, out


class HeldAWS:
    """A loopback SageMaker endpoint (unchanged boto3, AWS_ENDPOINT_URL) that takes the request and
    answers it only when the test is done: the analysis waits in its AWS call meanwhile.
    `received` is set when the request has arrived."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.done = threading.Event()
        held = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                held.received.set()
                held.done.wait(120)  # bounded: a test that never lets go still ends
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self, tmp: Path) -> dict[str, str]:
        return clean_env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{self.server.server_address[1]}",
                         AWS_ACCESS_KEY_ID="AKIAFAKEFAKEFAKE1234", AWS_SECRET_ACCESS_KEY="fake-secret-for-tests",
                         AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
                         AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, TMPDIR=str(tmp))

    def close(self) -> None:
        self.done.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_stop_while_analyze_waits_on_aws_ends_it_and_removes_its_temporary_directory(tmp_path):
    pytest.importorskip("boto3")
    temp = tmp_path / "tmp"
    temp.mkdir()
    report = tmp_path / "report.json"
    aws = HeldAWS()
    proc = _start([*DDP, "analyze", "--sagemaker-job", "ddp-held-job", "--report", str(report)], subprocess.DEVNULL,
                  tmp_path, aws.env(temp))
    try:
        wait_for(lambda: aws.received.is_set() or proc.poll() is not None, START_BOUND,
                 "analyze to ask SageMaker for the job")
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGTERM)
        rc, out, err = _finish(proc)
    finally:
        _end(proc)
        aws.close()
    assert rc == 143, (rc, err[-3000:])
    rep = _interrupted(report, signal.SIGTERM, "fetching SageMaker job ddp-held-job's description and logs from AWS")
    assert rep["world"]["platform"] == "sagemaker"
    assert list(temp.iterdir()) == []  # the private directory for the job's streams is gone


def test_analyze_in_process_gives_the_caller_its_signal_mask_back(tmp_path):
    """`main(["analyze", ...])` called in a process that is not its own (a test, a notebook) holds
    the stop signals while it runs, then unblocks them: else the caller, and every process it
    started afterwards, could no longer be stopped."""
    from ddp_doctor.cli import main
    log = tmp_path / "rank0.log"
    log.write_bytes(LINES)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    assert main(["analyze", str(log), "--report", str(tmp_path / "r.json")]) in (0, 3)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, ()) == before
    assert json.loads((tmp_path / "r.json").read_text())["status"] != "interrupted"


def test_the_reports_of_a_stopped_analysis_follow_the_schema():
    """DDP955 as the stop that ended the analysis (no verdict), and as one that came after it (the
    verdict kept whole, info), and during the upload (status "interrupted", the verdict kept)."""
    import argparse

    from ddp_doctor.cli import analyze as cmd
    from ddp_doctor.postmortem.artifacts import Artifacts
    from ddp_doctor.processes.stop_signals import Interrupt, SignalCatcher
    stop = SignalCatcher()
    stop.caught = Interrupt(signal.SIGHUP, 4321, "bash")
    art = Artifacts(read=["a.log"], stage="reading b.log")
    args = argparse.Namespace(instance_type="p4d.24xlarge", sagemaker_job=None)
    rep, pm = cmd._interrupted(args, art, stop)
    assert pm is None and validate_report(rep) == [] and rep["status"] == "interrupted"
    assert "while reading b.log, 1 input(s) read" in rep["findings"][0]["message"], rep["findings"]
    assert rep["world"]["instance_type"] == "p4d.24xlarge"
    verdict = {"schema": rep["schema"], "schema_version": 1, "tool_version": rep["tool_version"], "status": "fail",
               "phase": "training", "world": {"source": "post-mortem"}, "ranks": [],
               "findings": [{**rep["findings"][0], "id": "DDP952", "category": "post_mortem",
                             "title": "No failure found in the artifacts"}],
               "measurements": {}, "root_cause": None}
    late = SignalCatcher()
    late.later = [Interrupt(signal.SIGTERM, None, None)]
    kept = cmd._late_stops(verdict, late)
    assert validate_report(kept) == [] and kept["status"] == "warn", kept
    assert [(f["id"], f["severity"]) for f in kept["findings"]] == [("DDP952", "warning"), ("DDP955", "info")]
    during = cmd._stopped_during_upload(verdict, Interrupt(signal.SIGINT))
    assert validate_report(during) == [] and during["status"] == "interrupted" and len(during["findings"]) == 2
