"""The local history (ddp_doctor/history/database.py): records in and out, series, the size cap,
another schema, and concurrent writers: 8 ranks of each of 2 jobs, real processes, one file."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from ddp_doctor.history import database as store
from ddp_doctor.history.database import History, RunRecord, default_path, iter_series, series_of


def _rec(host: str = "algo-1", t: float = 1.0, busbw: float = 10.0, torch: str = "2.13.0", **kw) -> RunRecord:
    return RunRecord(time=t, kind="preflight", host=host, job="j", instance_type="ml.p4d.24xlarge",
                     gpus=["GPU-1"], world_size=16, nnodes=2, nproc_per_node=8, backend="nccl",
                     versions={"torch": torch, "nccl": "2.21.5", "cuda": "12.4"}, status="pass",
                     figures={"all_reduce.busbw_gbps@268435456": busbw}, **kw)


def test_records_go_in_and_come_out_by_host_and_type(tmp_path):
    h = History(str(tmp_path / "h" / "history.sqlite"))
    assert h.records() == [] and h.count() == 0  # no file yet: nothing, no error
    assert h.add([_rec("algo-1", 1), _rec("algo-2", 2), _rec("algo-1", 3, busbw=7.5)]) is None
    assert h.count() == 3 and h.schema_version() == store.SCHEMA_VERSION
    mine = h.records(host="algo-1")
    assert [r.time for r in mine] == [1, 3] and mine[-1].figures == {"all_reduce.busbw_gbps@268435456": 7.5}
    assert mine[0] == _rec("algo-1", 1)
    assert len(h.records(instance_type="ml.p4d.24xlarge")) == 3
    assert oct(os.stat(h.path).st_mode & 0o777) == "0o600"


def test_a_series_is_only_what_is_comparable():
    recs = [_rec(t=1, busbw=10), _rec(t=2, busbw=11, torch="2.14.0"), _rec(t=3, busbw=12)]
    assert list(iter_series(recs, recs[0], "all_reduce.busbw_gbps@268435456")) == [(1, 10.0), (3, 12.0)]
    assert series_of(recs[0]) != series_of(recs[1])


def test_a_read_of_one_series_skips_the_hosts_other_jobs_before_its_limit(tmp_path):
    # DDP409 reads the newest records of the run's own series: a host's newer runs of other jobs
    # (another world size, another torch) must not push its comparable past out of the read
    h = History(str(tmp_path / "history.sqlite"))
    mine = [_rec(t=t) for t in (1, 2, 3)]
    others = [replace(_rec(t=10 + t), world_size=8) for t in range(5)] + [_rec(t=20, torch="2.14.0")]
    assert h.add(mine + others) is None
    assert [r.time for r in h.records(host="algo-1", limit=3, like=mine[0])] == [1, 2, 3]
    assert [r.time for r in h.records(host="algo-1", limit=2, like=mine[0])] == [2, 3]
    assert [r.time for r in h.records(limit=9, like=others[0])] == [10, 11, 12, 13, 14]
    assert len(h.records(host="algo-1", limit=3)) == 3  # without `like`: the newest of any series


def test_the_file_keeps_the_newest_records_up_to_its_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "MAX_RUNS", 5)
    h = History(str(tmp_path / "history.sqlite"))
    for t in range(8):
        assert h.add([_rec(t=t)]) is None
    assert [r.time for r in h.records()] == [3, 4, 5, 6, 7]


def test_a_newer_schema_is_left_alone_and_an_unwritable_path_is_a_line_not_an_error(tmp_path):
    path = tmp_path / "history.sqlite"
    h = History(str(path))
    assert h.add([_rec()]) is None
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    said = h.add([_rec(t=2)])
    assert said is not None and "newer ddp-doctor (schema 99)" in said and h.count() == 1
    (tmp_path / "file").write_text("")
    said = History(str(tmp_path / "file" / "history.sqlite")).add([_rec()])
    assert said is not None and "could not be written" in said


def test_where_it_lives(tmp_path):
    assert default_path({"HOME": "/home/u"}) == "/home/u/.cache/ddp-doctor/history.sqlite"
    assert default_path({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}) == "/c/ddp-doctor/history.sqlite"
    assert default_path({"DDP_DOCTOR_HISTORY": "s3://b/p"}) == "s3://b/p"
    assert default_path({"DDP_DOCTOR_HISTORY": "off"}) is None


WRITER = textwrap.dedent("""
    import sys
    from ddp_doctor.history.database import History, RunRecord
    path, job, rank, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    h = History(path)
    for i in range(n):
        said = h.add([RunRecord(time=i, kind="run", host=f"host-{rank % 2}", job=job,
                                figures={"rank": rank, "i": i})])
        if said:
            print(said)
            sys.exit(1)
""")


@pytest.mark.slow
def test_concurrent_writers_of_two_jobs_lose_no_record(tmp_path):
    path = str(tmp_path / "history.sqlite")
    n = 25
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, job, str(rank), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for job in ("job-a", "job-b") for rank in range(8)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    recs = History(path).records(limit=10_000)
    assert len(recs) == 2 * 8 * n
    assert {(r.job, int(r.figures["rank"]), int(r.figures["i"])) for r in recs} == \
        {(job, rank, i) for job in ("job-a", "job-b") for rank in range(8) for i in range(n)}


OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, kind TEXT NOT NULL, job TEXT,
    host TEXT NOT NULL, instance_type TEXT, gpus TEXT NOT NULL, world_size INTEGER, nnodes INTEGER,
    nproc_per_node INTEGER, backend TEXT, versions TEXT NOT NULL, status TEXT, figures TEXT NOT NULL);
INSERT INTO runs (time, kind, job, host, gpus, world_size, nnodes, nproc_per_node, backend, versions, figures)
VALUES (1.0, 'preflight', 'j', 'algo-1', '[]', 16, 2, 8, 'nccl', '{}', '{"all_reduce.busbw_gbps@268435456": 150.0}'),
       (2.0, 'preflight', 'bench', 'algo-1', '[]', 1, 1, 1, 'nccl', '{}',
        '{"all_reduce.busbw_gbps@268435456": 1173.0, "all_reduce.busbw_gbps@1048576": -1.0}');
"""


def test_a_file_from_before_the_script_column_is_read_and_gains_it_on_its_next_write(tmp_path):
    path = tmp_path / "history.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
    h = History(str(path))
    old, bench = h.records()
    assert old.script is None and old.figures == {"all_reduce.busbw_gbps@268435456": 150.0}
    assert bench.figures == {}  # a 1-rank world's "busbw" and a negative one, kept by an older version: left out
    assert h.add([_rec(t=3.0, script="train.py")]) is None
    assert [r.script for r in h.records()] == [None, None, "train.py"] and h.count() == 3
    # the same from an S3 object's JSON
    d = {**_rec(t=4.0, script="x.py").to_dict(), "world_size": 1}
    d["figures"] = {"all_reduce.busbw_gbps@268435456": 1173.0, "stage_seconds.total": float("nan")}
    got = store.record_from_dict(d)
    assert got is not None and got.figures == {} and got.script == "x.py"
