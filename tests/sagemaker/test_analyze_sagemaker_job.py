"""`ddp-doctor analyze --sagemaker-job`, against moto in server mode on loopback (boto3 unpatched,
pointed at it by AWS_ENDPOINT_URL and fake credentials), as tests/sagemaker/test_sagemaker_job.py.

moto's training jobs are always "Completed" with no FailureReason; the failure is staged on moto's
in-process backend (the server runs in this process), the one thing its API cannot do. Where a
failure must come from CloudWatch Logs itself (denied, throttled), a loopback stub speaks its wire
protocol instead of moto.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from helpers.aws_stub import Stub  # noqa: E402
from helpers.moto_endpoint import moto_endpoint  # noqa: E402
from moto.sagemaker.models import sagemaker_backends  # noqa: E402

from ddp_doctor.cli import main  # noqa: E402
from ddp_doctor.report.schema import validate_report  # noqa: E402
from ddp_doctor.sagemaker.job_logs import LOG_GROUP, JobLogsError, fetch_job_logs  # noqa: E402

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
SECRET = "PLANTEDsecretKEYvalue0123456789abcdefGHIJ"  # must never appear in any output
NO_FILE = "/nonexistent/ddp-doctor-tests/aws-config"
EPOCH = 1700000000
NOW_MS = int(time.time() * 1000) - 3_600_000  # an hour ago: CloudWatch takes events up to 14 days old

FAILURE_REASON = ('AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "ValueError: bad shard at '
                  'step 1: expected 512 rows, got 0"\nCommand "mpirun --host algo-1:1,algo-2:1 -np 2 '
                  '/opt/conda/bin/python3.10 -m mpi4py train.py", exit code: 1')
TOOLKIT = "2024-06-01 12:00:{:02d},101 sagemaker-training-toolkit {}"


def tagged(rank: int, host: str, stream: str, lines: list[str]) -> list[str]:
    return [f"[1,mpirank:{rank},{host}]<{stream}>:{line}" for line in lines]


# A real 2-node job under SageMaker's MPI launch: rank 1 (algo-2) raises in the user's script;
# rank 0 (algo-1) then loses its gloo peer in the backward pass's all-reduce. algo-1 also holds the
# toolkit's and mpirun's own lines (mpirun runs there).
ALGO_2 = [
    *tagged(1, "algo-2", "stdout", ["Running on algo-2, rank 1 of 2", "epoch 0 step 0 loss 2.3026"]),
    *tagged(1, "algo-2", "stderr", [
        "Traceback (most recent call last):",
        '  File "/opt/ml/code/train.py", line 61, in <module>',
        "    main()",
        '  File "/opt/ml/code/train.py", line 54, in main',
        "    batch = next_batch(loader, step)",
        '  File "/opt/ml/code/train.py", line 31, in next_batch',
        '    raise ValueError(f"bad shard at step {step}: expected 512 rows, got 0")',
        "ValueError: bad shard at step 1: expected 512 rows, got 0"]),
]
ALGO_1 = [
    TOOLKIT.format(1, "INFO     Invoking user script"),
    "mpirun --host algo-1:1,algo-2:1 -np 2 --allow-run-as-root --tag-output -x NCCL_DEBUG=INFO "
    "/opt/conda/bin/python3.10 -m mpi4py train.py",
    *tagged(0, "algo-1", "stdout", ["Running on algo-1, rank 0 of 2", "epoch 0 step 0 loss 2.3026"]),
    *tagged(0, "algo-1", "stderr", [
        "Traceback (most recent call last):",
        '  File "/opt/ml/code/train.py", line 61, in <module>',
        "    main()",
        '  File "/opt/ml/code/train.py", line 57, in main',
        "    loss.backward()",
        '  File "/opt/conda/lib/python3.10/site-packages/torch/_tensor.py", line 522, in backward',
        "    torch.autograd.backward(",
        '  File "/opt/conda/lib/python3.10/site-packages/torch/autograd/__init__.py", line 266, in backward',
        "    Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[10.0.143.86]:36137"]),
    "--------------------------------------------------------------------------",
    "Primary job  terminated normally, but 1 process returned",
    "a non-zero exit code. Per user-direction, the job has been aborted.",
    "--------------------------------------------------------------------------",
    TOOLKIT.format(9, "ERROR    Reporting training FAILURE"),
]


# ---------------------------------------------------------------- the server, the account, the jobs

@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_endpoint() as url:
        yield url


@pytest.fixture
def env(endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """boto3 pointed at moto with fake credentials, nothing of the user's AWS; tempfile's
    directory private to the test (returned), so what the command leaves there can be seen."""
    for k in list(os.environ):
        if k.startswith(("AWS_", "DDP_DOCTOR_", "SAGEMAKER_")):
            monkeypatch.delenv(k)
    for k, v in dict(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="AKIAFAKEFAKEFAKE1234",
                     AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION=REGION, AWS_EC2_METADATA_DISABLED="true",
                     AWS_CONFIG_FILE=NO_FILE, AWS_SHARED_CREDENTIALS_FILE=NO_FILE).items():
        monkeypatch.setenv(k, v)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def client(endpoint: str, service: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="AKIAFAKEFAKEFAKE1234", aws_secret_access_key=SECRET)


@pytest.fixture(scope="module")
def make_job(endpoint: str) -> Callable[..., None]:
    """make_job(name, {stream suffix: [message or (timestamp ms, message)]}, failed=True)."""
    sm, logs = client(endpoint, "sagemaker"), client(endpoint, "logs")
    logs.create_log_group(logGroupName=LOG_GROUP)

    def make(name: str, streams: dict[str, list[Any]], failed: bool = True, count: int = 2,
             instance_type: str = "ml.g5.12xlarge") -> None:
        sm.create_training_job(
            TrainingJobName=name, RoleArn=f"arn:aws:iam::{ACCOUNT}:role/sm",
            AlgorithmSpecification={"TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:"
                                                     "2.3.0-gpu-py311", "TrainingInputMode": "File"},
            OutputDataConfig={"S3OutputPath": "s3://ddp-out/jobs/"},
            ResourceConfig={"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": 50},
            StoppingCondition={"MaxRuntimeInSeconds": 3600})
        if failed:  # what moto's API cannot do: end the job as SageMaker ends a failed one
            job = sagemaker_backends[ACCOUNT][REGION].training_jobs[name]
            job.training_job_status = job.secondary_status = "Failed"
            job.failure_reason = FAILURE_REASON
        for suffix, messages in streams.items():
            stream = f"{name}/{suffix}"
            logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            events = [{"timestamp": m[0], "message": m[1]} if isinstance(m, tuple) else
                      {"timestamp": NOW_MS + i, "message": m} for i, m in enumerate(messages)]
            for i in range(0, len(events), 5000):  # put_log_events takes at most 10,000 events, 1 MB
                logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=events[i:i + 5000])
    return make


@pytest.fixture(scope="module")
def failed_job(make_job: Callable[..., None]) -> str:
    make_job("ddp-failed-1", {f"algo-1-{EPOCH}": ALGO_1, f"algo-2-{EPOCH}": ALGO_2})
    return "ddp-failed-1"


def analyze(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["analyze", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and SECRET not in out + err, err
    return code, out, err


@pytest.fixture(scope="module")
def session(endpoint: str) -> Any:
    """One session for the tests that call fetch_job_logs: it loads each service's model once."""
    return boto3.Session(region_name=REGION, aws_access_key_id="AKIAFAKEFAKEFAKE1234", aws_secret_access_key=SECRET)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """The directory a test has fetch_job_logs write into."""
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------- the verdict

def test_the_job_is_judged_from_its_hosts_streams(env: Path, failed_job: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    code, out, err = analyze("--sagemaker-job", failed_job, "--report", str(report), capsys=capsys)
    sys.__stdout__.write("\n" + err + out)  # as printed (shown with pytest -s)
    assert code == 3, out + err
    rep = json.loads(report.read_text())
    assert validate_report(rep) == []
    cause = rep["root_cause"]
    assert (cause["id"], cause["ranks"], cause["caused_by"]) == ("DDP800", [1], None), rep["findings"]
    assert "ValueError: bad shard at step 1" in cause["message"]
    (rank0,) = [f for f in rep["findings"] if f["ranks"] == [0]]
    assert rank0["caused_by"] is not None and "Connection closed by peer" in rank0["message"], rank0
    w = rep["world"]
    assert (w["platform"], w["instance_type"], w["instance_count"], w["region"]) == \
        ("sagemaker", "ml.g5.12xlarge", 2, REGION)
    assert w["hosts"] == ["algo-1", "algo-2"] and w["world_size"] == 2
    sm = rep["measurements"]["post_mortem"]["sagemaker"]
    assert (sm["job"], sm["status"], sm["failure_reason"]) == (failed_job, "Failed", FAILURE_REASON)
    assert sm["streams"] == [
        {"name": f"{failed_job}/algo-1-{EPOCH}", "host": "algo-1", "events": len(ALGO_1),
         "bytes": sum(len(m) + 1 for m in ALGO_1), "truncated": False},
        {"name": f"{failed_job}/algo-2-{EPOCH}", "host": "algo-2", "events": len(ALGO_2),
         "bytes": sum(len(m) + 1 for m in ALGO_2), "truncated": False}]
    # stderr: one line naming the job, how it ended and what was read
    (line,) = err.splitlines()
    assert f"SageMaker job {failed_job} in {REGION} (Failed: AlgorithmError" in line and "read 2 stream(s)" in line
    assert "Root cause: DDP800" in out and "rank 1 raised ValueError" in out
    assert list(env.iterdir()) == []  # the temporary directory is gone
    assert "ddp-doctor-sagemaker-" not in report.read_text()  # no removed file is named


# NCCL's INFO lines when its OFI plugin failed and it fell back to TCP sockets (the shapes of
# https://github.com/aws/deep-learning-containers/issues/2675), as each host printed them
SOCKETS = ["{h}:123:890 [0] ofi_init:1355 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
           "{h}:123:890 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.{n}<0>",
           "{h}:123:890 [0] NCCL INFO Using network Socket"]


def _on_sockets(rank: int, host: str) -> list[str]:
    return tagged(rank, host, "stdout", [ln.format(h=host, n=rank + 1) for ln in SOCKETS])


@pytest.mark.slow
def test_nccl_on_sockets_is_judged_against_the_jobs_instance_type(env: Path, make_job: Callable[..., None],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The instance type is the job's description's: on ml.p4d.24xlarge (EFA) NCCL's sockets are
    DDP335, on ml.g5.12xlarge (no EFA) they are the only network there is."""
    for name, itype in (("ddp-efa-sockets", "ml.p4d.24xlarge"), ("ddp-g5-sockets", "ml.g5.12xlarge")):
        make_job(name, {f"algo-1-{EPOCH}": [*_on_sockets(0, "algo-1"), *ALGO_1],
                        f"algo-2-{EPOCH}": [*_on_sockets(1, "algo-2"), *ALGO_2]}, instance_type=itype)
    code, out, _ = analyze("--sagemaker-job", "ddp-efa-sockets", "--json", capsys=capsys)
    rep = json.loads(out)
    (sockets,) = [f for f in rep["findings"] if f["id"] == "DDP335"]
    assert "ml.p4d.24xlarge (from the SageMaker job's description)" in sockets["message"], sockets
    assert "Using network Socket" in sockets["message"] and "aws-ofi-nccl initialization failed" in sockets["message"]
    assert rep["root_cause"]["id"] == "DDP800", rep["root_cause"]  # the job's own failure stays the cause
    assert rep["world"]["nccl_network"] == "Socket" and rep["world"]["instance_type"] == "ml.p4d.24xlarge"
    code, out, _ = analyze("--sagemaker-job", "ddp-g5-sockets", "--json", capsys=capsys)
    assert not [f for f in json.loads(out)["findings"] if f["id"] == "DDP335"]
    # the command line's instance type overrides the description's
    code, out, _ = analyze("--sagemaker-job", "ddp-g5-sockets", "--instance-type", "p5.48xlarge", "--json",
                           capsys=capsys)
    (sockets,) = [f for f in json.loads(out)["findings"] if f["id"] == "DDP335"]
    assert "p5.48xlarge (from --instance-type)" in sockets["message"], sockets


def test_paths_add_to_the_job_and_json_keeps_stdout_the_report(env: Path, failed_job: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    extra = tmp_path / "notes.txt"
    extra.write_text("nothing of a rank here\n")
    code, out, err = analyze(str(extra), "--sagemaker-job", failed_job, "--json", capsys=capsys)
    rep = json.loads(out)
    assert code == 3 and rep["root_cause"]["ranks"] == [1]
    assert rep["measurements"]["post_mortem"]["inputs_read"] == 3


def test_the_report_names_streams_not_the_removed_files(env: Path, make_job: Callable[..., None],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A stream the post-mortem cannot read (a NUL byte: binary) is named as the stream it is."""
    make_job("ddp-binary", {f"algo-1-{EPOCH}": ["step 1\x00\x01"]})
    code, out, _ = analyze("--sagemaker-job", "ddp-binary", "--json", capsys=capsys)
    (unread,) = [f for f in json.loads(out)["findings"] if f["id"] == "DDP951"]
    assert f"cloudwatch:{LOG_GROUP}/ddp-binary/algo-1-{EPOCH}: binary" in unread["message"], unread
    assert "ddp-doctor-sagemaker-" not in out and list(env.iterdir()) == []


# ---------------------------------------------------------------- reading, bounded

def test_a_long_stream_is_read_page_by_page(env: Path, make_job: Callable[..., None], session: Any,
                                            out: Path) -> None:
    """More events than one get_log_events page holds: read page by page until the token repeats."""
    msgs = [f"[1,mpirank:0,algo-1]<stdout>:step {i} loss 0.1" for i in range(1200)]
    make_job("ddp-long", {f"algo-1-{EPOCH}": msgs}, failed=False, count=1)
    calls: list[str] = []
    session.events.register("before-call.cloudwatch-logs.GetLogEvents", lambda **kw: calls.append("get"))
    try:
        logs = fetch_job_logs("ddp-long", str(out), session=session, page_events=500)
    finally:
        session.events.unregister("before-call.cloudwatch-logs.GetLogEvents")
    (s,) = logs.streams
    assert (s.events, s.truncated, logs.status, logs.failure_reason) == (1200, False, "Completed", None)
    assert lines_of(out / "algo-1.log") == msgs
    assert len(calls) == 4  # 500 + 500 + 200, then the page whose token repeats


def test_a_byte_bound_keeps_the_beginning_and_the_end(env: Path, make_job: Callable[..., None], session: Any,
                                                      out: Path) -> None:
    """A stream over its bound keeps its first lines and its last (the traceback), says it was
    cut, and stays within the bound; the end is read backwards page by page."""
    body = [f"[1,mpirank:1,algo-2]<stdout>:step {i} loss 0.1" for i in range(2000)]
    make_job("ddp-cut", {f"algo-2-{EPOCH}": body + ALGO_2[2:]})
    logs = fetch_job_logs("ddp-cut", str(out), session=session, stream_bytes=8000, page_events=50)
    (s,) = logs.streams
    got = lines_of(out / "algo-2.log")
    assert s.truncated and "byte bound (8000 bytes)" in (s.why or "") and "middle was not read" in (s.why or "")
    assert s.bytes <= 8000 and s.events == len(got) and got[0] == body[0]
    assert got[-len(ALGO_2[2:]):] == ALGO_2[2:]  # the whole traceback
    steps = [int(ln.split()[1]) for ln in got if " loss " in ln]
    assert steps == sorted(set(steps)) and len(steps) < len(body)  # in order, none twice, some left out
    summary = logs.summary()["streams"][0]
    assert summary["truncated"] is True and "middle" in summary["why"]


def test_a_stream_just_over_its_beginning_share_is_read_whole(env: Path, make_job: Callable[..., None],
                                                              session: Any, out: Path) -> None:
    """Read from both ends, the two reads meet: every event once, even where many events share a
    millisecond at the seam."""
    msgs = [(NOW_MS + i // 40, f"[1,mpirank:0,algo-1]<stdout>:event {i}") for i in range(240)]
    make_job("ddp-seam", {f"algo-1-{EPOCH}": msgs})
    size = sum(len(m) + 1 for _, m in msgs)
    logs = fetch_job_logs("ddp-seam", str(out), session=session, stream_bytes=size + 100, page_events=40)
    (s,) = logs.streams
    assert not s.truncated and s.why is None and s.events == 240
    assert lines_of(out / "algo-1.log") == [m for _, m in msgs]


def test_the_total_bound_is_shared_by_the_hosts_and_a_restart_reads_the_newest(
        env: Path, make_job: Callable[..., None], session: Any, out: Path) -> None:
    host = {k: [f"[1,mpirank:{k},algo-{k + 1}]<stdout>:step {i} loss 0.1" for i in range(300)] for k in range(2)}
    make_job("ddp-shared", {f"algo-1-{EPOCH - 600}": ["the first attempt"], f"algo-1-{EPOCH}": host[0],
                            f"algo-2-{EPOCH}": host[1]})
    logs = fetch_job_logs("ddp-shared", str(out), session=session, total_bytes=6000)
    old, first, second = logs.streams
    assert old.name.endswith(f"algo-1-{EPOCH - 600}") and old.events == 0 and "earlier stream" in (old.why or "")
    assert first.truncated and second.truncated and first.bytes + second.bytes <= 6000
    assert sorted(p.name for p in out.iterdir()) == ["algo-1.log", "algo-2.log"]
    assert lines_of(out / "algo-1.log")[-1] == host[0][-1]


# ---------------------------------------------------------------- what ends it, in one line

def test_a_job_that_does_not_exist_is_a_usage_error(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = analyze("--sagemaker-job", "no-such-job", capsys=capsys)
    assert (code, out, err) == (2, "", "ddp-doctor analyze: error: no SageMaker training job 'no-such-job' in "
                                       f"{REGION}\n")
    code, _, err = analyze("--sagemaker-job", "bad/name", capsys=capsys)
    assert code == 2 and "is not a SageMaker training job name" in err and len(err.splitlines()) == 1
    code, _, err = analyze(capsys=capsys)
    assert code == 2 and "--sagemaker-job NAME" in err


def test_no_region_says_how_to_give_one(env: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    code, _, err = analyze("--sagemaker-job", "ddp-failed-1", capsys=capsys)
    assert (code, err) == (2, "ddp-doctor analyze: error: no AWS region: pass --region, or set AWS_DEFAULT_REGION "
                              "or a profile's region\n")
    code, _, err = analyze("--sagemaker-job", "no-such-job", "--region", "eu-west-1", capsys=capsys)
    assert code == 2 and "'no-such-job' in eu-west-1" in err


def test_a_job_without_streams_is_not_a_pass(env: Path, make_job: Callable[..., None],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    make_job("ddp-nostreams", {})
    code, out, err = analyze("--sagemaker-job", "ddp-nostreams", capsys=capsys)
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert "(Failed: AlgorithmError: ExecuteUserScriptError: ExitCode 1" in err and "nothing to analyze" in err


def test_no_credentials(env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, _, err = analyze("--sagemaker-job", "ddp-failed-1", capsys=capsys)
    assert (code, err) == (1, "ddp-doctor analyze: error: no AWS credentials found (environment, profile, SSO or "
                              "instance role)\n")


def test_without_boto3(env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    code, _, err = analyze("--sagemaker-job", "ddp-failed-1", capsys=capsys)
    assert code == 1 and 'needs boto3: pip install "ddp-doctor[aws]"' in err and len(err.splitlines()) == 1


def logs_error(code: str, message: str) -> Stub:
    """CloudWatch Logs on loopback answering every request with one AWS error (JSON 1.1)."""
    body = json.dumps({"__type": code, "message": message}).encode()
    return Stub(lambda handler, _: (400, {"Content-Type": "application/x-amz-json-1.1"}, body))


def targets(stub: Stub) -> list[str]:
    """The API calls the stub was asked (X-Amz-Target), in order."""
    return [headers.get("X-Amz-Target", "") for _, _, headers in stub.requests]


@pytest.mark.slow
def test_access_denied_names_the_permission(env: Path, failed_job: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    stub = logs_error("AccessDeniedException", f"User: arn:aws:iam::{ACCOUNT}:user/ci is not authorized to perform: "
                                               "logs:DescribeLogStreams")
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", stub.url)  # boto3's per-service endpoint
        code, out, err = analyze("--sagemaker-job", failed_job, capsys=capsys)
    finally:
        stub.close()
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err
    assert "DescribeLogStreams was denied (AccessDeniedException): the identity needs logs:DescribeLogStreams" in err
    assert targets(stub) == ["Logs_20140328.DescribeLogStreams"]  # a denial is not retried
    assert list(env.iterdir()) == []


@pytest.mark.slow
def test_throttling_past_the_retries(env: Path, failed_job: str, monkeypatch: pytest.MonkeyPatch,
                                     out: Path) -> None:
    stub = logs_error("ThrottlingException", "Rate exceeded")
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", stub.url)
        with pytest.raises(JobLogsError, match=r"^DescribeLogStreams was throttled \(ThrottlingException\) "
                                               r"2 time\(s\) in a row; try again later$") as e:
            fetch_job_logs(failed_job, str(out), attempts=2)  # 2: one retry's backoff, under a second
    finally:
        stub.close()
    assert not e.value.usage and len(targets(stub)) == 2
