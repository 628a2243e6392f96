"""The fleet's history in S3 (history/s3_bucket.py) against moto's server on loopback (boto3
unpatched): two hosts, ten runs each; a host's own series read back in order; a drop judged
against its own past only; 8 ranks of each of 2 jobs writing at once lose no record; the
`history` command and publish() with an s3:// history."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from typing import Iterator

import pytest

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from helpers.moto_endpoint import moto_endpoint  # noqa: E402

from ddp_doctor.checks.history_rules import history_findings  # noqa: E402
from ddp_doctor.history.database import RunRecord  # noqa: E402
from ddp_doctor.history.from_report import record  # noqa: E402
from ddp_doctor.history.s3_bucket import S3History  # noqa: E402

pytestmark = pytest.mark.slow  # against moto's server, and the CLI and concurrent writers in processes of their own

BUCKET = "fleet-history"
BIG = "all_reduce.busbw_gbps@268435456"
AWS = {"AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE1234", "AWS_SECRET_ACCESS_KEY": "fake/secret/for/moto/only",
       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_endpoint() as url:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=AWS["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=AWS["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket=BUCKET)
        yield url


@pytest.fixture
def aws(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    env = {**AWS, "AWS_ENDPOINT_URL": endpoint}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def _rec(host: str, t: float, busbw: float) -> RunRecord:
    return RunRecord(time=t, kind="preflight", host=host, world_size=16, nnodes=2, nproc_per_node=8, backend="nccl",
                     versions={"torch": "2.13.0", "nccl": "2.21.5"}, status="pass", figures={BIG: busbw})


def test_two_hosts_ten_runs_each_and_a_drop_against_its_own_past(aws):
    h = S3History(f"s3://{BUCKET}/runs-a")
    for t in range(10):
        assert h.add([_rec("algo-1", 1_700_000_000 + t * 86_400, 150 + t % 3),
                      _rec("algo-2", 1_700_000_000 + t * 86_400, 90 + t % 3)]) is None
    mine = h.records(host="algo-1")
    assert [r.time for r in mine] == [1_700_000_000 + t * 86_400 for t in range(10)]
    assert len(h.records()) == 20 and len(h.records(limit=5)) == 5
    now = [_rec("algo-1", 1_800_000_000, 90), _rec("algo-2", 1_800_000_000, 90)]
    (f,) = history_findings(now, h.records(host="algo-1") + h.records(host="algo-2"))
    assert f.evidence["host"] == "algo-1" and "40% below this host's median of 151" in f.message


def test_a_new_sagemaker_host_is_judged_against_its_instance_types_runs_in_the_fleet_history(aws):
    from ddp_doctor.checks.history_rules import against_history
    uri = f"s3://{BUCKET}/fleet-types"
    h = S3History(uri)
    for t in range(8):  # eight earlier jobs, each on two new ml.p4d hosts
        assert h.add([dataclasses.replace(_rec(f"job{t}-algo-{i}", 1_700_000_000 + t * 3600, 150 + t % 3),
                                          instance_type="ml.p4d.24xlarge") for i in (1, 2)]) is None
    rep = {"phase": "preflight", "status": "pass",
           "world": {"world_size": 16, "nnodes": 2, "nproc_per_node": 8, "backend": "nccl",
                     "instance_type": "ml.p4d.24xlarge"},
           "ranks": [{"rank": 0, "host": "algo-1", "versions": {"torch": "2.13.0", "nccl": "2.21.5"}},
                     {"rank": 8, "host": "algo-2", "versions": {"torch": "2.13.0", "nccl": "2.21.5"}}],
           "measurements": {"all_reduce": [{"bytes": 268435456, "busbw_gbps": 90.0, "correct": True}]}}
    found = against_history(rep, {"DDP_DOCTOR_HISTORY": uri})
    assert sorted(f.evidence["host"] for f in found) == ["algo-1", "algo-2"], found
    # the message says "quiet runs" now: the history compares a host with its quiet runs only (these
    # records, from before the load was kept, count as such)
    assert all("below ml.p4d.24xlarge's (this host has fewer than 5 quiet runs of its own) median of 151" in f.message
               and "over the last 16 comparable quiet runs" in f.message for f in found), [f.message for f in found]


WRITER = textwrap.dedent("""
    import sys
    from ddp_doctor.history.database import RunRecord
    from ddp_doctor.history.s3_bucket import S3History
    uri, job, rank, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    h = S3History(uri)
    for i in range(n):
        said = h.add([RunRecord(time=1_700_000_000 + i, kind="run", host=f"host-{rank % 2}", job=job,
                                figures={"rank": rank, "i": i})])
        if said:
            print(said)
            sys.exit(1)
""")


def test_concurrent_writers_of_two_jobs_lose_no_record(aws):
    uri = f"s3://{BUCKET}/runs-b"
    n = 5
    env = {**os.environ, **aws}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, uri, job, str(rank), str(n)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for job in ("job-a", "job-b") for rank in range(8)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    recs = S3History(uri).records(limit=1000)
    assert {(r.job, int(r.figures["rank"]), int(r.figures["i"])) for r in recs} == \
        {(job, rank, i) for job in ("job-a", "job-b") for rank in range(8) for i in range(n)}


def test_publish_and_the_history_command_with_an_s3_history(aws, capsys):
    from ddp_doctor.cli import main
    uri = f"s3://{BUCKET}/runs-c"
    rep = {"phase": "preflight", "status": "pass", "world": {"world_size": 2, "nnodes": 1, "nproc_per_node": 2,
                                                             "backend": "gloo"},
           "ranks": [{"rank": 0, "host": "box", "versions": {"torch": "2.13.0"}}],
           "measurements": {"all_reduce": [{"bytes": 268435456, "busbw_gbps": 1.5, "correct": True}]},
           "findings": []}
    assert record(rep, {"DDP_DOCTOR_HISTORY": uri}) is None
    assert main(["history", "--history", uri, "--json"]) == 0
    (got,) = json.loads(capsys.readouterr().out)["records"]
    assert got["host"] == "box" and got["figures"] == {BIG: 1.5}
    # a bucket that does not exist: one line, never an exception
    said = record(rep, {"DDP_DOCTOR_HISTORY": "s3://no-such-bucket-here/x"})
    assert said is not None and "could not be written" in said and "NoSuchBucket" in said
    assert dataclasses.asdict(_rec("a", 1, 2))["host"] == "a"


def test_the_history_command_says_when_an_s3_history_cannot_be_read(aws, capsys):
    from ddp_doctor.cli import main
    assert main(["history", "--history", "s3://no-such-bucket-here/x"]) == 1  # never "0 record(s)"
    err = capsys.readouterr().err
    assert "the history s3://no-such-bucket-here/x could not be read: " in err and "NoSuchBucket" in err, err
    assert main(["history", "--history", f"s3://{BUCKET}/nothing-yet", "--json"]) == 0  # empty, but read
    assert json.loads(capsys.readouterr().out)["records"] == []
