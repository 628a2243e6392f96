"""analyze of inputs no real job leaves: bounded memory and time, a report that validates."""
from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys

import pytest

from ddp_doctor.report.schema import validate_report
from ddp_doctor.training.run.nccl_dumps import load_why

LIMIT = 1536 * 1024 * 1024  # 1.5 GiB of address space: analyze imports no torch


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _analyze(tmp_path, *paths) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    env = {**os.environ, "DDP_DOCTOR_HISTORY": "off"}
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "analyze", *map(str, paths), "--report", str(report)],
                       env=env, preexec_fn=_limited, capture_output=True, text=True, timeout=180)
    assert p.returncode in (0, 3), p.stdout + p.stderr
    rep = json.loads(report.read_text())
    assert validate_report(rep) == []
    return p.returncode, rep


TB = b'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nRuntimeError: boom\n'


@pytest.mark.slow
def test_one_gib_line_then_a_traceback(tmp_path):
    big = tmp_path / "console.log"
    with open(big, "wb") as f:
        chunk = b"x" * (64 << 20)
        for _ in range(16):
            f.write(chunk)
        f.write(b"\n" + TB)
    code, rep = _analyze(tmp_path, big)
    assert code == 3 and rep["root_cause"]["id"] == "DDP800"


SUMMARY = """train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-24_21:20:12
  host      : algo-1
  rank      : -5 (local_rank: 3)
  exitcode  : 1 (pid: 562)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_21:20:12
  host      : algo-1
  rank      : 1 (local_rank: 2147483648)
  exitcode  : {big} (pid: 561)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


@pytest.mark.slow
def test_torchrun_summary_with_absurd_fields(tmp_path):
    lines = "".join(f"[default0]:{line}\n" for line in TB.decode().splitlines())
    (tmp_path / "console.log").write_text(lines + SUMMARY.format(big=10**30))
    code, rep = _analyze(tmp_path, tmp_path)
    assert code == 3
    ranks = rep["measurements"]["post_mortem"]["ranks"]
    assert set(ranks) <= {"0", "1"}  # no rank -5, nothing per local rank 2**31
    assert all(v.get("exit_status") in (None, 0, 1) for v in ranks.values())  # 10**30 is not believed


@pytest.mark.slow
def test_files_named_for_rank_9999999(tmp_path):
    (tmp_path / "rank9999999.log").write_bytes(TB)
    tree = tmp_path / "run_x" / "attempt_0" / "9999999"
    tree.mkdir(parents=True)
    (tree / "stderr.log").write_bytes(TB)
    (tmp_path / "rank1000000.log").write_bytes(TB)  # within the bound: ranks below it counted, not listed
    code, rep = _analyze(tmp_path, tmp_path)
    assert code == 3 and rep["root_cause"]["id"] == "DDP800"
    assert len(rep["measurements"]["post_mortem"]["ranks"]) < 10
    assert any("not believed" in str(u.get("why")) for u in rep["measurements"]["post_mortem"]["unplaced"])


def _billion_laughs(levels: int = 40) -> bytes:
    """A list of 4 ints, then `levels` lists each of 4 memo references to the one before: 4**40 items."""
    b = bytearray(b"\x80\x02(K\x01K\x01K\x01K\x01lq\x00")
    for i in range(1, levels + 1):
        b += b"(" + (b"h" + bytes([i - 1])) * 4 + b"lq" + bytes([i])
    return bytes(b) + b"."


@pytest.mark.slow
def test_billion_laughs_dump_is_refused_unexpanded(tmp_path):
    dump = tmp_path / "nccl_trace_rank_0"
    dump.write_bytes(_billion_laughs())
    data, why = load_why(str(dump))
    assert data is None and "expands to more than" in why
    code, rep = _analyze(tmp_path, dump)
    assert any("expands to more than" in json.dumps(f["evidence"]) for f in rep["findings"] if f["id"] == "DDP951")


def test_dup_laughs_refused(tmp_path):
    dump = tmp_path / "nccl_trace_rank_1"
    dump.write_bytes(b"\x80\x02]" + b"2a" * 80 + b".")  # DUP, APPEND: each doubles what it stands for
    data, why = load_why(str(dump))
    assert data is None and "expands to more than" in why


class _Run:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
def test_dump_that_would_run_a_command_does_not(tmp_path):
    marker = tmp_path / "ran"
    dump = tmp_path / "nccl_trace_rank_0"
    dump.write_bytes(pickle.dumps({"entries": [_Run(str(marker))]}))
    data, why = load_why(str(dump))
    assert data is None and "refused" in why
    _analyze(tmp_path, dump)
    assert not marker.exists()


def test_plain_dump_still_read(tmp_path):
    dump = tmp_path / "nccl_trace_rank_0"
    entries = [{"record_id": i, "collective_seq_id": i, "process_group": ("0", "default"),
                "frames": [{"name": "f", "filename": "a.py", "line": 3}] * 5} for i in range(50)]
    dump.write_bytes(pickle.dumps({"version": "2.4", "entries": entries}))
    data, why = load_why(str(dump))
    assert why is None and len(data["entries"]) == 50
