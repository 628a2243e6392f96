"""analyze never passes what it could not read (DDP952), and never tracebacks on it: random bytes,
a 1 GiB sparse file, a pickle nested 1,000,000 lists deep, torchelastic error files cut mid-string
or holding other types than torch writes. A large file is read in bounded time and memory
(postmortem/large_text.py), whatever its lines look like.

The commands run in processes of their own under a bound (helpers.procs.run fails the test past
its timeout), so a read that would never end fails here rather than hangs.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, Result, clean_env, run

pytestmark = pytest.mark.slow  # each test runs the CLI in a process of its own

BOUND = 120.0


def analyze(tmp_path: Path, *paths: str) -> tuple[Result, dict]:
    res = run([*DDP, "analyze", *paths, "--json"], clean_env(), str(tmp_path), timeout=BOUND)
    assert "Traceback (most recent call last)" not in res.stderr, res.stderr  # the report may quote a rank's
    assert res.rc in (0, 3), res.output
    return res, json.loads(res.stdout)


def ids(rep: dict) -> set[str]:
    return {f["id"] for f in rep["findings"]}


def skipped(rep: dict) -> dict[str, str]:
    return {s["path"]: s["why"] for f in rep["findings"] if f["id"] == "DDP951" for s in f["evidence"]["skipped"]}


def deep_pickle(path: Path, depth: int) -> None:
    """A pickle of `depth` lists, each inside the one before: EMPTY_LIST `depth` times, then APPEND."""
    path.write_bytes(b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".")


@pytest.mark.parametrize("name", ["random.bin", "zeros.log", "deep.pkl"])
def test_nothing_readable_is_never_a_pass(tmp_path: Path, name: str) -> None:
    if name == "random.bin":
        (tmp_path / name).write_bytes(os.urandom(4 << 20))
    elif name == "zeros.log":
        (tmp_path / name).write_bytes(b"\0" * (64 << 10))
    else:
        deep_pickle(tmp_path / name, 1_000_000)
    _, rep = analyze(tmp_path, name)
    assert rep["status"] != "pass", rep["findings"]
    assert "DDP952" in ids(rep) and name in skipped(rep), rep["findings"]
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP952"]
    assert "nothing among the inputs" in f["message"]
    if name != "deep.pkl":
        assert "not a log" in skipped(rep)[name]


def _peak(tmp_path: Path, name: str) -> tuple[dict, int]:
    """analyze in a process of its own: (its report, the peak resident memory in KiB its reading of
    `name` added to that of an analyze of a small log first, which imports whatever analyze
    imports: what is measured is the reading, not the interpreter's modules)."""
    (tmp_path / "small.log").write_text("[rank0]: hello\n")
    code = ("import json, resource, sys\n"
            "from ddp_doctor.postmortem.analyze import analyze\n"
            "analyze([sys.argv[2]])\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "rep, _ = analyze([sys.argv[1]])\n"
            "kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base\n"
            "print(json.dumps({'rep': rep, 'kib': kib}))\n")
    res = run([sys.executable, "-c", code, name, "small.log"], clean_env(), str(tmp_path), timeout=BOUND)
    assert res.rc == 0, res.output
    out = json.loads(res.stdout)
    return out["rep"], out["kib"]


def test_a_sparse_gigabyte_is_not_a_log_and_is_not_a_pass(tmp_path: Path) -> None:
    with open(tmp_path / "sparse.log", "wb") as f:
        f.truncate(1 << 30)
    rep, kib = _peak(tmp_path, "sparse.log")
    assert rep["status"] != "pass" and "DDP952" in ids(rep), rep["findings"]
    assert "not a log" in skipped(rep)["sparse.log"]
    assert kib < 300 << 10, kib


@pytest.mark.parametrize("tail", ["sparse", "one line"])
def test_a_large_file_is_read_in_bounded_memory_whatever_its_lines(tmp_path: Path, tail: str) -> None:
    """A log's start, then a gigabyte of holes (a crashed node's file), or a line of 320 MiB: the
    large reader searches it a window at a time and reads no line past its bound."""
    path = tmp_path / "big.log"
    with open(path, "wb") as f:
        f.write("".join(f"[rank{i % 2}]: step {i}\n" for i in range(2000)).encode())
        f.write(b"[rank1]: Traceback (most recent call last):")
        if tail == "sparse":
            f.truncate(1 << 30)
        else:
            chunk = b"x" * (16 << 20)
            for _ in range(20):
                f.write(chunk)
    rep, kib = _peak(tmp_path, "big.log")
    assert rep["measurements"]["post_mortem"]["ranks"].keys() == {"0", "1"}, rep["measurements"]
    assert rep["status"] != "pass", rep["findings"]
    assert kib < 300 << 10, kib  # 1 GiB mapped, or one 320 MiB line: neither is held


# ------------------------------------------------------------------ torchelastic's error files

STACK = 'Traceback (most recent call last):\n  File "/job/train.py", line 7, in <module>\nRuntimeError: boom\n'
GOOD = {"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": STACK, "timestamp": "1764000000"}}}
BAD = {
    "cut mid-string": json.dumps(GOOD)[:70],
    "message a number": json.dumps({"message": {"message": 42, "extraInfo": {"timestamp": "1764000000"}}}),
    "extraInfo a list": json.dumps({"message": {"message": "RuntimeError: boom", "extraInfo": ["x"]}}),
    "timestamp abc": json.dumps({"message": {"message": "RuntimeError: boom",
                                             "extraInfo": {"py_callstack": STACK, "timestamp": "abc"}}}),
    "py_callstack a dict": json.dumps({"message": {"message": "RuntimeError: boom",
                                                   "extraInfo": {"py_callstack": {"a": 1}}}}),
}
WHY = {"cut mid-string": "not valid JSON", "message a number": "message.message is the number 42",
       "extraInfo a list": "message.extraInfo is a list", "timestamp abc": "timestamp is the text 'abc'",
       "py_callstack a dict": "py_callstack is an object"}


@pytest.mark.parametrize("case", sorted(BAD))
def test_an_error_file_that_cannot_be_read_is_named_and_the_rest_judged(tmp_path: Path, case: str) -> None:
    node = tmp_path / "logs" / "job_ab12" / "attempt_0"
    for local in (0, 1):
        (node / str(local)).mkdir(parents=True)
    (node / "0" / "error.json").write_text(BAD[case])
    (node / "0" / "stderr.log").write_text("[rank0]: step 1\n")
    (node / "1" / "stderr.log").write_text("".join(f"[rank1]: {ln}\n" for ln in STACK.splitlines()))
    _, rep = analyze(tmp_path, "logs")
    why = skipped(rep).get("logs/job_ab12/attempt_0/0/error.json")
    assert why is not None and "torchelastic error file that could not be read" in why and WHY[case] in why, \
        rep["findings"]
    assert rep["root_cause"] is not None and rep["root_cause"]["ranks"] == [1], rep["root_cause"]  # still judged


@pytest.mark.parametrize("case", sorted(BAD))
def test_an_error_file_alone_that_cannot_be_read_is_not_a_pass(tmp_path: Path, case: str) -> None:
    (tmp_path / "error.json").write_text(BAD[case])
    _, rep = analyze(tmp_path, "error.json")
    assert rep["status"] != "pass" and "DDP952" in ids(rep) and WHY[case] in skipped(rep)["error.json"], \
        rep["findings"]


def test_a_good_error_file_is_still_read(tmp_path: Path) -> None:
    (tmp_path / "error.json").write_text(json.dumps(GOOD))
    (tmp_path / "events.jsonl").write_text('{"message": {"step": 1}}\n{"message": {"step": 2}}\n')
    _, rep = analyze(tmp_path, "error.json", "events.jsonl")
    assert "error.json" not in skipped(rep) and "events.jsonl" not in skipped(rep), rep["findings"]
