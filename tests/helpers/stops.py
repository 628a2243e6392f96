"""What the stop tests wait on: a signal still pending at a process (blocked, not yet taken), a
process's children, heartbeats, and an S3 endpoint that holds the report's upload until the test
lets it go, so that a signal can be sent while the report is being written, never at a guessed time.
"""
from __future__ import annotations

import glob
import http.server
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil


def pending(pid: int, signo: int) -> bool:
    """Whether `signo` waits at process `pid` (sent, blocked there, not yet taken)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(("ShdPnd:", "SigPnd:")) and (int(line.split()[1], 16) >> (signo - 1)) & 1:
                    return True
    except OSError:
        pass
    return False


def start(cmd: Sequence[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen[str]:
    """procs.start, with SIGINT's default action restored in the child: a shell that starts the
    test run in the background leaves SIGINT ignored, and the child would inherit that."""
    return subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def heartbeats(run_parent: Path, pattern: str = "*") -> dict[int, dict[str, Any]]:
    """rank -> its last heartbeat, in the run directories `run_parent/pattern`."""
    out = {}
    for p in glob.glob(str(run_parent / pattern / "hb-*.json")):
        try:
            hb = json.loads(Path(p).read_text())
            out[int(hb["rank"])] = hb
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def training(run_parent: Path, ranks: int, script: str) -> dict[int, dict[str, Any]] | None:
    """The heartbeats once `ranks` ranks were each seen inside `script`, training; None before."""
    hbs = heartbeats(run_parent)
    inside = {r: hb for r, hb in hbs.items() if hb.get("phase") == "training" and script in (hb.get("where") or "")}
    return inside if len(inside) == ranks else None


def child_running(pid: int, words: str) -> psutil.Process | None:
    """The descendant of `pid` whose command line contains `words`."""
    try:
        for p in psutil.Process(pid).children(recursive=True):
            if words in " ".join(p.cmdline()):
                return p
    except psutil.Error:
        pass
    return None


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class HeldUpload:
    """A loopback S3 endpoint (boto3 unchanged: AWS_ENDPOINT_URL) that takes the report's PUT and
    answers it only once the test calls release(): until then the process that uploads is inside
    publishing its report. `received` is set when the PUT's body has arrived."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.go = threading.Event()
        self.body = b""
        held = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # answers boto3's Expect: 100-continue

            def do_PUT(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                held.body = self.rfile.read(n) if n else b""
                held.received.set()
                held.go.wait(60)  # bounded: a test that never releases still ends
                self.send_response(200)
                self.send_header("ETag", '"0"')
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self, uri: str) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.server.server_address[1]}",
                "AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE1234", "AWS_SECRET_ACCESS_KEY": "fake-secret-for-tests",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                "DDP_DOCTOR_REPORT_S3_URI": uri}

    def release(self) -> None:
        self.go.set()

    def close(self) -> None:
        self.go.set()
        self.server.shutdown()
        self.server.server_close()


def group_gone(pids: Sequence[int]) -> bool:
    return not any(alive(p) for p in pids)


def kill_all(pids: Sequence[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
