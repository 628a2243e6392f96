"""Every path a command reads is a regular file unless the command reads a stream: a FIFO, a
directory or a device named as a file is a usage error (exit 2) naming the path and what it is; a
FIFO, device or socket found while analyze walks a directory is skipped and said so, never opened.
One test (facts/env_values.not_regular, open_regular) serves every command.

Each command runs in a process of its own under a bound (helpers.procs.run kills it and fails
the test past its timeout): a read that waits for a FIFO's writer fails here, it does not hang.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest
from helpers.procs import DDP, Result, assert_clean_output, clean_env, free_port, run

from ddp_doctor.facts.env_values import NotRegularFile, not_regular, open_regular, read_text_file

BOUND = 60.0  # seconds: a command that waits on a FIFO is killed and fails the test


def ddp(args: list[str], cwd: Path, **env: str) -> Result:
    return run([*DDP, *args], clean_env(**env), str(cwd), timeout=BOUND)


def usage_error(res: Result, *needles: str) -> str:
    assert res.rc == 2, res.output
    assert_clean_output(res)
    lines = [line for line in res.stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def bounded(fn, *args, seconds: float = 10.0):
    """fn(*args) in a thread joined with a bound: a call that blocks fails the test instead."""
    out: dict = {}

    def call() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test, which raises it
            out["error"] = e
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__}{args} still blocked after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def report(tmp_path: Path) -> Path:
    """A real ddp-doctor report: analyze's of a one-line log."""
    (tmp_path / "one.log").write_text("step 1\n")
    res = ddp(["analyze", "one.log", "--report", "report.json"], tmp_path)
    assert res.rc == 0 and (tmp_path / "report.json").is_file(), res.output
    return tmp_path / "report.json"


# ------------------------------------------------------------------ the one test

def test_what_a_path_is_comes_from_stat_alone(tmp_path: Path, fifo: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert not_regular(str(tmp_path / "file")) is None
    assert bounded(not_regular, str(fifo)) == "a FIFO"  # never opened: no writer needed
    assert not_regular(str(tmp_path)) == "a directory"
    assert not_regular("/dev/null") == "a character device"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        assert not_regular(str(tmp_path / "sock")) == "a socket"
    with pytest.raises(FileNotFoundError):
        not_regular(str(tmp_path / "none"))


def test_open_regular_never_waits_for_a_fifo(tmp_path: Path, fifo: Path) -> None:
    with pytest.raises(NotRegularFile, match="a FIFO, not a regular file"):
        bounded(open_regular, str(fifo))
    with pytest.raises(ValueError, match="a character device, not a regular file"):
        bounded(read_text_file, "/dev/zero")  # a device: its read would never end
    (tmp_path / "f.txt").write_text("text")
    with open_regular(str(tmp_path / "f.txt")) as f:
        assert f.read() == b"text"


# ------------------------------------------------------------------ analyze

@pytest.mark.slow
def test_analyze_skips_a_fifo_in_a_directory_and_says_so(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").write_text("[rank0]: step 1\n[rank1]: step 1\n")
    os.mkfifo(logs / "stuck.log")
    res = ddp(["analyze", "logs", "--json"], tmp_path)
    assert res.rc == 0, res.output
    assert_clean_output(res)
    rep = json.loads(res.stdout)
    (unread,) = [f for f in rep["findings"] if f["id"] == "DDP951"]
    why = "a FIFO, not a regular file: not opened"
    assert unread["evidence"]["skipped"] == [{"path": "logs/stuck.log", "why": why}]
    assert any(f["id"] == "DDP952" for f in rep["findings"])  # the log that was read is still judged


@pytest.mark.slow
@pytest.mark.parametrize("given,kind", [("pipe", "a FIFO"), ("/dev/zero", "a character device"),
                                        ("/dev/urandom", "a character device")])
def test_analyze_of_a_fifo_or_a_device_is_a_usage_error(tmp_path: Path, fifo: Path, given: str, kind: str) -> None:
    usage_error(ddp(["analyze", given], tmp_path), f"{given} is {kind}, not a regular file or a directory")


# ------------------------------------------------------------------ diff

@pytest.mark.slow
@pytest.mark.parametrize("given,kind", [("pipe", "a FIFO"), (".", "a directory"), ("/dev/zero", "a character device")])
def test_diff_of_something_else_than_a_file_is_a_usage_error(tmp_path: Path, fifo: Path, given: str,
                                                              kind: str) -> None:
    good = report(tmp_path)
    usage_error(ddp(["diff", given, str(good)], tmp_path), f"cannot read {given}: it is {kind}, not a regular file")
    usage_error(ddp(["diff", str(good), given], tmp_path), f"cannot read {given}: it is {kind}, not a regular file")


# ------------------------------------------------------------------ sagemaker-check --config

@pytest.mark.slow
@pytest.mark.parametrize("given,kind", [("pipe", "a FIFO"), (".", "a directory"), ("/dev/zero", "a character device")])
def test_sagemaker_check_config_that_is_no_file_is_a_usage_error(tmp_path: Path, fifo: Path, given: str,
                                                                 kind: str) -> None:
    pytest.importorskip("boto3")
    offline = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_MAX_ATTEMPTS": "1"}
    usage_error(ddp(["sagemaker-check", "--config", given], tmp_path, **offline),
                f"--config {given}", f"{kind}, not a regular file")


# ------------------------------------------------------------------ history --history

@pytest.mark.slow
@pytest.mark.parametrize("given,kind", [("pipe", "a FIFO"), (".", "a directory"), ("/dev/zero", "a character device")])
def test_history_that_is_no_file_is_a_usage_error(tmp_path: Path, fifo: Path, given: str, kind: str) -> None:
    usage_error(ddp(["history", "--history", given], tmp_path), f"{given} is {kind}, not a regular file")
