"""A history file that is no history is said, never read as an empty one: a corrupted or truncated
SQLite file is an error naming the file and what to do (exit 1); rows that are not records as
written (figures that are not JSON, a NULL time, text for a world size) are skipped and counted,
in `history` and `history --json`, never a traceback; History.records (the DDP409 check's read)
skips them too and never raises."""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from helpers.procs import DDP, Result, assert_clean_output, clean_env, run

from ddp_doctor.history.database import History, HistoryUnreadable, RunRecord

pytestmark = pytest.mark.slow  # each test runs the CLI in a process of its own

BOUND = 60.0


def history(tmp_path: Path, *args: str) -> Result:
    res = run([*DDP, "history", "--history", "history.sqlite", *args], clean_env(), str(tmp_path), timeout=BOUND)
    assert_clean_output(res)
    return res


def _rec(t: float, busbw: float = 10.0) -> RunRecord:
    return RunRecord(time=t, kind="preflight", host="algo-1", world_size=2, nnodes=1, nproc_per_node=2,
                     backend="gloo", versions={"torch": "2.13.0"}, status="pass",
                     figures={"all_reduce.busbw_gbps@1048576": busbw, "stage_seconds.total": 3.0})


def written(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "history.sqlite"
    assert History(str(path)).add([_rec(1_700_000_000 + i) for i in range(n)]) is None
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the whole history in the one file
    return path


def test_a_file_of_random_bytes_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "history.sqlite").write_bytes(os.urandom(64 << 10))
    for args in ([], ["--json"]):
        res = history(tmp_path, *args)
        assert res.rc == 1 and res.stdout == "", res.output
        assert "history.sqlite" in res.stderr and "move it aside" in res.stderr, res.stderr
        assert "corrupted" in res.stderr, res.stderr


def test_a_truncated_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = written(tmp_path, 400)
    data = path.read_bytes()
    assert len(data) > 16384
    path.write_bytes(data[:8192])
    res = history(tmp_path)
    assert res.rc == 1 and "history.sqlite" in res.stderr and "move it aside" in res.stderr, res.output
    try:
        History(str(path)).read()
        raise AssertionError("a truncated history read as one")
    except HistoryUnreadable as e:
        assert e.path == str(path) and "corrupted" in e.why
    assert History(str(path)).records() == []  # the check's read: nothing to compare, never a raise


def _garble(path: Path) -> None:
    """Three rows that are not records as written: figures not JSON, a NULL time, a text world size
    (the table without its NOT NULL, as another writer or a repair tool may leave it)."""
    with sqlite3.connect(path) as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
        conn.executescript(f"""
            CREATE TABLE old AS SELECT * FROM runs; DROP TABLE runs;
            CREATE TABLE runs ({', '.join(c + (' INTEGER PRIMARY KEY AUTOINCREMENT' if c == 'id' else '')
                                          for c in cols)});
            INSERT INTO runs SELECT * FROM old; DROP TABLE old;
            UPDATE runs SET figures = 'not json{{' WHERE id = 40;
            UPDATE runs SET time = NULL WHERE id = 39;
            UPDATE runs SET world_size = 'four' WHERE id = 38;
        """)


def test_garbage_rows_are_skipped_and_counted(tmp_path: Path) -> None:
    path = written(tmp_path)
    _garble(path)
    res = history(tmp_path, "--last", "100")
    assert res.rc == 0, res.output
    assert "3 unreadable row(s) skipped" in res.stderr, res.stderr
    assert res.stdout.startswith("37 record(s) of history.sqlite"), res.stdout
    res = history(tmp_path, "--json", "--last", "100")
    assert res.rc == 0, res.output
    out = json.loads(res.stdout)
    assert out["skipped_rows"] == 3 and len(out["records"]) == 37, out
    assert "3 unreadable row(s) skipped" in res.stderr, res.stderr
    recs, skipped = History(str(path)).read(limit=100)
    assert skipped == 3 and len(recs) == 37
    assert len(History(str(path)).records(limit=100)) == 37


def test_a_good_history_says_nothing_more(tmp_path: Path) -> None:
    written(tmp_path)
    res = history(tmp_path, "--json")
    assert res.rc == 0 and res.stderr == "", res.output
    assert json.loads(res.stdout)["skipped_rows"] == 0
