"""`analyze --sagemaker-job`'s whole-fetch deadline (sagemaker/job_logs.py DEADLINE_S) against a
loopback SageMaker and CloudWatch Logs (JSON 1.1, unchanged boto3) where chosen calls answer a
byte a second, which botocore's read timeout never catches: run out before any event was read,
the fetch is one error line; run out while the streams are read, what was read is judged and the
report says what was not, never a "pass". Every wait is bounded by a thread join."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3")

from helpers.trickle_endpoint import Answer, TrickleEndpoint, in_thread  # noqa: E402

from ddp_doctor.cli import main  # noqa: E402
from ddp_doctor.report.schema import validate_report  # noqa: E402
from ddp_doctor.sagemaker import job_logs  # noqa: E402
from ddp_doctor.sagemaker.job_logs import JobLogsError, fetch_job_logs  # noqa: E402

pytestmark = pytest.mark.slow  # each test waits out real deadlines of seconds

JOB = "ddp-slow-logs"
EPOCH = 1700000000
BOUND = 60.0  # far past the deadlines set here, far short of a trickled answer's minutes
HOSTS = ("algo-1", "algo-2", "algo-3")
ALGO_1 = [f"[1,mpirank:0,algo-1]<stdout>:epoch 0 step {i} loss 2.30" for i in range(5)]


def aws(slow: set[str]) -> TrickleEndpoint:
    """The job (Failed, 3 hosts, a stream each); `slow`: the targets (X-Amz-Target's operation, or
    GetLogEvents:HOST for one host's stream) answered a byte a second."""

    def respond(method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        op = headers.get("X-Amz-Target", "").rsplit(".", 1)[-1]
        req = json.loads(body or b"{}")
        if op == "DescribeTrainingJob":
            out = {"TrainingJobName": JOB, "TrainingJobStatus": "Failed", "SecondaryStatus": "Failed",
                   "FailureReason": "AlgorithmError: ExitCode 1",
                   "ResourceConfig": {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 3, "VolumeSizeInGB": 50}}
        elif op == "DescribeLogStreams":
            out = {"logStreams": [{"logStreamName": f"{JOB}/{h}-{EPOCH}"} for h in HOSTS]}
        elif op == "GetLogEvents":
            host = req["logStreamName"].split("/", 1)[1].rsplit("-", 1)[0]
            op = f"GetLogEvents:{host}" if f"GetLogEvents:{host}" in slow else op
            msgs = ALGO_1 if host == "algo-1" and not req.get("nextToken") else []
            out = {"events": [{"timestamp": EPOCH * 1000 + i, "message": m} for i, m in enumerate(msgs)],
                   "nextForwardToken": "f/end", "nextBackwardToken": "b/end"}
        else:
            return 400, {"Content-Type": "application/x-amz-json-1.1"}, b'{"__type": "UnknownOperation"}', False
        return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(out).encode(), op in slow

    return TrickleEndpoint(respond)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Nothing of the user's AWS; tempfile's directory private to the test (returned)."""
    for k in list(os.environ):
        if k.startswith(("AWS_", "DDP_DOCTOR_", "SAGEMAKER_")):
            monkeypatch.delenv(k)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


@pytest.mark.parametrize("slow, said", [
    ({"DescribeTrainingJob"}, "ran out during DescribeTrainingJob: AWS or the network answered too slowly; "
                              "no stream was read"),
    ({"DescribeLogStreams"}, "ran out during DescribeLogStreams: AWS or the network answered too slowly; "
                             "no stream was read"),
    ({"GetLogEvents:algo-1"}, "ran out during GetLogEvents: AWS or the network answered too slowly; "
                              "no event was read"),
], ids=["describe", "listing", "first-stream"])
def test_run_out_before_any_event_is_one_error_line(env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    slow: set[str], said: str) -> None:
    monkeypatch.setattr(job_logs, "DEADLINE_S", 5.0)  # room for the calls before the slow one on a busy host
    endpoint = aws(slow)
    try:
        for k, v in endpoint.env().items():
            monkeypatch.setenv(k, v)
        t, got = in_thread(lambda: fetch_job_logs(JOB, str(tmp_path)))
        t.join(BOUND)
        assert not t.is_alive(), "the fetch outlived its deadline"
    finally:
        endpoint.close()
    assert isinstance(got.get("error"), JobLogsError), got
    assert str(got["error"]) == f"the fetch's whole deadline (5 s) {said}" and not got["error"].usage


def test_run_out_while_the_streams_are_read_keeps_what_was_read(env: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """algo-1's stream is read, algo-2's trickles past the deadline, algo-3's is not reached: the
    report judges algo-1's lines, says what ran out, and is not a pass; stderr says it too."""
    monkeypatch.setattr(job_logs, "DEADLINE_S", 8.0)  # room for algo-1's calls on a busy host
    endpoint = aws({"GetLogEvents:algo-2"})
    try:
        for k, v in endpoint.env().items():
            monkeypatch.setenv(k, v)
        t, got = in_thread(lambda: main(["analyze", "--sagemaker-job", JOB, "--json"]))
        t.join(BOUND)
        assert not t.is_alive(), "analyze outlived the fetch's deadline"
    finally:
        endpoint.close()
    out, err = capsys.readouterr()
    assert "error" not in got and "Traceback" not in err, (got, err)
    rep = json.loads(out)
    assert validate_report(rep) == [] and rep["status"] != "pass" and got["value"] == 0, rep["findings"]
    sm = rep["measurements"]["post_mortem"]["sagemaker"]
    ran_out = "the fetch's whole deadline (8 s) ran out during GetLogEvents"
    assert sm["cut_short"] == f"{ran_out}: 1 stream(s) not read", sm
    first, second, third = sm["streams"]
    assert (first["events"], first["truncated"], "why" in first) == (len(ALGO_1), False, False), first
    assert (second["events"], second["truncated"], second["why"]) == (0, True, f"{ran_out}: the rest was not read")
    assert (third["events"], third["truncated"], third["why"]) == (0, False, f"not read: {ran_out}")
    (line,) = err.splitlines()
    assert f"read 2 stream(s), {len(ALGO_1)} event(s)" in line and line.endswith(f"; {sm['cut_short']}"), line
    assert list(env.iterdir()) == []  # the temporary directory is gone
