"""Never a "pass" for a stopped run, never a lost report, every network wait bounded, on real
processes (each bounded by a subprocess timeout; every wait is for a state, never a sleep):

- a SIGTERM while the report's S3 upload trickles: the report is "interrupted", exit 143;
- an S3 endpoint that answers a byte every 4 s: the upload's deadline ends it, the command exits
  with its own status and warns; `run` whose rank 1 failed keeps its exit status 1;
- a SIGTERM as soon as the parent command runs its first instruction: an "interrupted" report;
- a DDP_DOCTOR_CHECK_MODULES module that calls sys.exit() at import: a DDP001 finding, a report;
- RANK=-1 LOCAL_RANK=x: the launcher checks name both, and the report keeps its schema.

Every report these tests see is validated against the report's schema. The launches no test
signals (the two a trickling endpoint holds for the upload's whole deadline, report/s3.py's
DEADLINE_S, 30 s, which no option sets, shortened to 8 s there; the two short ones) are started
together by one module fixture, a few at a time, and each test reads its own launch's result."""
from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.procs import (
    DDP,
    NO_SWEEP,
    Launch,
    clean_env,
    ddp_with_bounds,
    finish,
    kill_tree,
    load_json,
    result_of,
    run_all,
    start,
    wait_for,
)

from ddp_doctor.report.schema import validate_report

pytestmark = pytest.mark.slow


class TrickleS3:
    """A loopback "S3" that reads a request and answers it one byte every 4 s (never whole, in
    the time a test takes): botocore's read timeout never fires. `received` is set on the first
    request; close() ends every answer."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.closed = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.5)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nETag: \"0\"\r\n\r\n"
        with conn:
            conn.settimeout(1.0)
            try:
                conn.recv(65536)  # the headers (and the body, or 100-continue's wait)
            except OSError:
                pass
            self.received.set()
            for byte in answer:
                if self.closed.wait(4.0):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.sock.getsockname()[1]}",
                "AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE1234", "AWS_SECRET_ACCESS_KEY": "fake-secret-for-tests",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


@pytest.fixture
def trickle():
    pytest.importorskip("boto3")
    s3 = TrickleS3()
    yield s3
    s3.close()


def valid_report(path: Path) -> dict[str, Any]:
    assert path.exists(), f"no report at {path}"
    rep = load_json(str(path))
    assert validate_report(rep) == [], validate_report(rep)
    return rep


# the subject of these launches is the report's upload, a plugin or the environment: NO_SWEEP
def _preflight(tmp: Path, *more: str, ddp: tuple[str, ...] = tuple(DDP)) -> list[str]:
    return [*ddp, "preflight", "--nproc-per-node", "1", "--timeout", "30", "--report", str(tmp / "r.json"), *more]


# the upload's whole deadline (30 s) as the commands held by the trickling endpoint have it: its
# end is what is tested, two bytes into the answer
SHORT_UPLOAD = tuple(ddp_with_bounds("ddp_doctor.report.s3", DEADLINE_S=8.0))


def test_sigterm_during_the_upload_makes_the_report_interrupted(tmp_path, trickle):
    proc = start(_preflight(tmp_path, "--report-s3-uri", "s3://reports/p/"), clean_env(**trickle.env()), str(tmp_path))
    try:
        wait_for(lambda: trickle.received.is_set() or proc.poll() is not None, 150, "the report's upload to start")
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGTERM)
    except BaseException:
        kill_tree(proc.pid)
        raise
    res = finish(proc, 60)
    assert res.rc == 143, res.stderr
    rep = valid_report(tmp_path / "r.json")
    assert rep["status"] == "interrupted", rep["status"]
    assert rep["interrupted"]["signal"] == "SIGTERM"
    assert "upload was cut short" in res.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(name -> the launch's result or exception, name -> its directory): the launches no test
    signals, started together; the two uploads share one trickling endpoint."""
    import importlib.util
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("trickle_preflight", "trickle_run", "plugin", "rank")}
    script = dirs["trickle_run"] / "fails_on_rank_1.py"
    script.write_text("import os, sys\nif os.environ.get('RANK') == '1':\n    sys.exit(1)\n")
    plugins = dirs["plugin"] / "plugins"
    plugins.mkdir()
    (plugins / "exits_at_import.py").write_text("import sys\nsys.exit(9)\n")
    s3 = TrickleS3() if importlib.util.find_spec("boto3") is not None else None
    jobs: dict[str, Launch] = {}
    if s3 is not None:  # the two held by the endpoint first
        jobs["trickle_run"] = Launch([*SHORT_UPLOAD, "run", "--nproc-per-node", "2", "--timeout", "30", *NO_SWEEP,
                                      "--report",
                                      str(dirs["trickle_run"] / "r.json"), str(script)],
                                     clean_env(**s3.env(), DDP_DOCTOR_REPORT_S3_URI="s3://reports/run/"),
                                     str(dirs["trickle_run"]), timeout=240)
        jobs["trickle_preflight"] = Launch(_preflight(dirs["trickle_preflight"], "--report-s3-uri", "s3://reports/p/",
                                                      *NO_SWEEP, ddp=SHORT_UPLOAD),
                                           clean_env(**s3.env()), str(dirs["trickle_preflight"]), timeout=150)
    jobs["plugin"] = Launch(_preflight(dirs["plugin"], *NO_SWEEP),
                            clean_env(PYTHONPATH=str(plugins), DDP_DOCTOR_CHECK_MODULES="exits_at_import"),
                            str(dirs["plugin"]), timeout=150)
    jobs["rank"] = Launch([*DDP, "preflight", "--timeout", "5", "--report", str(dirs["rank"] / "r.json")],
                          clean_env(RANK="-1", WORLD_SIZE="2", LOCAL_RANK="x"), str(dirs["rank"]), timeout=150)
    try:
        done = run_all(jobs, at_once=3)
    finally:
        if s3 is not None:
            s3.close()
    return done, dirs


def test_a_trickling_endpoint_never_holds_the_preflight(runs):
    pytest.importorskip("boto3")
    done, dirs = runs
    res = result_of(done, "trickle_preflight")
    assert res.rc == 0, res.stderr
    assert "could not upload the report" in res.stderr and "no answer within" in res.stderr
    assert valid_report(dirs["trickle_preflight"] / "r.json")["status"] in ("pass", "warn")


def test_a_failed_rank_keeps_its_exit_status_with_a_trickling_endpoint(runs):
    pytest.importorskip("boto3")
    done, dirs = runs
    res = result_of(done, "trickle_run")
    assert res.rc == 1, res.stderr[-3000:]
    assert "could not upload the report" in res.stderr
    assert valid_report(dirs["trickle_run"] / "r.json")["status"] == "fail"


def _sigterm_blocked_or_caught(pid: int) -> bool:
    """Whether the process holds SIGTERM (blocked or caught): its first instruction has run."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    bit = 1 << (signal.SIGTERM - 1)
    return any(int(fields.get(k, "0").strip() or "0", 16) & bit for k in ("SigBlk", "SigCgt"))


@pytest.mark.parametrize("command", ["preflight", "run"])
def test_a_stop_as_the_command_starts_still_writes_an_interrupted_report(tmp_path, command):
    # One launch each: the stop signals are held from the command's first instruction and only ever
    # taken from the pending set (sigtimedwait), so a SIGTERM sent once they are held waits for the
    # catcher wherever the start-up is; launching it again would land it in the same state.
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    cmd = ([*DDP, "preflight", "--nproc-per-node", "2", "--report", str(tmp_path / "r.json")] if command == "preflight"
           else [*DDP, "run", "--nproc-per-node", "2", "--report", str(tmp_path / "r.json"), str(script)])
    proc = start(cmd, clean_env(), str(tmp_path))
    try:
        wait_for(lambda: _sigterm_blocked_or_caught(proc.pid) or proc.poll() is not None, 60,
                 "the command's first instruction")
        os.kill(proc.pid, signal.SIGTERM)
    except BaseException:
        kill_tree(proc.pid)
        raise
    res = finish(proc, 120)
    assert res.rc == 143, (res.rc, res.stderr[-3000:])
    assert "trained" not in res.stdout
    assert valid_report(tmp_path / "r.json")["status"] == "interrupted"


def test_a_plugin_that_exits_at_import_is_a_finding(runs):
    done, dirs = runs
    res = result_of(done, "plugin")
    assert res.rc == 3, res.stderr
    rep = valid_report(dirs["plugin"] / "r.json")
    broken = [f for f in rep["findings"] if f["id"] == "DDP001" and "exits_at_import" in f["message"]]
    assert broken and "SystemExit" in broken[0]["message"], rep["findings"]


def test_a_negative_rank_is_named_and_the_report_keeps_its_schema(runs):
    done, dirs = runs
    res = result_of(done, "rank")  # RANK=-1 WORLD_SIZE=2 LOCAL_RANK=x
    assert res.rc == 3, res.stderr
    rep = valid_report(dirs["rank"] / "r.json")
    messages = " ".join(f["message"] for f in rep["findings"] if f["category"] == "launcher_env")
    assert "RANK=-1" in messages and "LOCAL_RANK='x'" in messages
    for extra in dirs["rank"].glob("r.json.rank*.json"):
        valid_report(extra)
