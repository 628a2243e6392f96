"""`ddp-doctor sagemaker-check` and report upload, against moto in server mode on loopback.

One moto server (a real HTTP endpoint on 127.0.0.1) serves the whole module; boto3 is pointed at
it the usual way (AWS_ENDPOINT_URL and fake credentials in the environment) and is not patched.
Where moto does not implement an API (Service Quotas for SageMaker) or a failure must be staged
(a flaky S3), a small loopback HTTP server speaks the AWS wire protocol instead.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any, Iterator

import pytest

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from helpers.aws_stub import Stub  # noqa: E402
from helpers.moto_endpoint import moto_endpoint  # noqa: E402
from helpers.procs import free_port  # noqa: E402

from ddp_doctor import check_runner, registry  # noqa: E402
from ddp_doctor import checks as catalogue  # noqa: E402
from ddp_doctor.checks import sagemaker_account as acct  # noqa: E402
from ddp_doctor.checks import sagemaker_job as jc  # noqa: E402
from ddp_doctor.report.s3 import report_location, upload_report  # noqa: E402
from ddp_doctor.sagemaker import check_job  # noqa: E402
from ddp_doctor.sagemaker.aws import JobContext  # noqa: E402
from ddp_doctor.sagemaker.spec import JobSpec, SpecError  # noqa: E402

REGION = "us-east-1"
ACCOUNT = "123456789012"
# Planted: neither may ever appear in output, reports or uploads.
SECRET = "PLANTEDsecretKEYvalue0123456789abcdefGHIJ"
TOKEN = "PLANTEDsessionTOKENvalue0123456789"
NO_FILE = "/nonexistent/ddp-doctor-tests/aws-config"  # keeps the user's ~/.aws out of the tests


# ---------------------------------------------------------------- servers and environment

@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_endpoint() as url:
        yield url


def aws_env(endpoint: str, **extra: str) -> dict[str, str]:
    """This environment pointed at `endpoint` with fake credentials, nothing else of AWS's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "DDP_DOCTOR_", "SM_", "SAGEMAKER_"))}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="AKIAFAKEFAKEFAKE1234", AWS_SECRET_ACCESS_KEY=SECRET,
               AWS_SESSION_TOKEN=TOKEN, AWS_DEFAULT_REGION=REGION, AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=NO_FILE, AWS_SHARED_CREDENTIALS_FILE=NO_FILE)
    env.update(extra)
    return env


@pytest.fixture
def env(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    e = aws_env(endpoint)
    for k in list(os.environ):
        if k.startswith(("AWS_", "DDP_DOCTOR_", "SAGEMAKER_")):
            monkeypatch.delenv(k)
    for k, v in e.items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    return e


def client(endpoint: str, service: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="AKIAFAKEFAKEFAKE1234", aws_secret_access_key=SECRET)


TRUST = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
EC2_TRUST = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


@pytest.fixture(scope="module")
def aws(endpoint: str) -> dict[str, str]:
    """The account: a good network, role and data, and a bad example of each."""
    ec2, iam, s3 = client(endpoint, "ec2"), client(endpoint, "iam"), client(endpoint, "s3")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    other_vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    small = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.2.0/28")["Subnet"]["SubnetId"]  # 11 free
    sg = ec2.create_security_group(GroupName="ddp-ok", Description="self", VpcId=vpc)["GroupId"]
    self_rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}]
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=self_rule)
    ec2.authorize_security_group_egress(GroupId=sg, IpPermissions=self_rule)
    sg_open = ec2.create_security_group(GroupName="ddp-noself", Description="no self", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=sg_open, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "10.0.0.0/16"}]}])
    sg_in_only = ec2.create_security_group(GroupName="ddp-inonly", Description="in only", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=sg_in_only, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg_in_only}]}])
    sg_other = ec2.create_security_group(GroupName="ddp-other", Description="other vpc", VpcId=other_vpc)["GroupId"]
    other_rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg_other}]}]
    ec2.authorize_security_group_ingress(GroupId=sg_other, IpPermissions=other_rule)
    ec2.authorize_security_group_egress(GroupId=sg_other, IpPermissions=other_rule)
    iam.create_role(RoleName="sm-ok", AssumeRolePolicyDocument=json.dumps(TRUST))
    iam.create_role(RoleName="sm-notrust", AssumeRolePolicyDocument=json.dumps(EC2_TRUST))
    s3.create_bucket(Bucket="ddp-data")
    s3.put_object(Bucket="ddp-data", Key="train/part-0", Body=b"x")
    s3.create_bucket(Bucket="ddp-out")
    s3.create_bucket(Bucket="ddp-reports")
    return {"vpc": vpc, "subnet": subnet, "small_subnet": small, "sg": sg, "sg_open": sg_open,
            "sg_in_only": sg_in_only, "sg_other": sg_other}


def good_spec(aws: dict[str, str], **over: Any) -> dict[str, Any]:
    spec = {"instance_type": "ml.p4d.24xlarge", "instance_count": 2,
            "distribution": {"torch_distributed": {"enabled": True}}, "framework_version": "2.3.0",
            "py_version": "py311", "entry_point": "train.py", "role": f"arn:aws:iam::{ACCOUNT}:role/sm-ok",
            "subnets": [aws["subnet"]], "security_group_ids": [aws["sg"]],
            "inputs": ["s3://ddp-data/train/"], "output_path": "s3://ddp-out/jobs/", "region": REGION}
    spec.update(over)
    return spec


def ids(rep: dict[str, Any], severity: str | None = None) -> list[str]:
    return sorted(f["id"] for f in rep["findings"] if severity is None or f["severity"] == severity)


def finding(rep: dict[str, Any], cid: str) -> dict[str, Any]:
    found = [f for f in rep["findings"] if f["id"] == cid]
    assert found, (cid, rep["findings"])
    return found[0]


# ---------------------------------------------------------------- loopback stub for what moto lacks

def quota_stub(value: float) -> Stub:
    def respond(h: Any, body: bytes) -> tuple[int, dict[str, str], bytes]:
        target = h.headers.get("X-Amz-Target", "")
        quotas = [{"ServiceCode": "sagemaker", "QuotaName": "ml.p4d.24xlarge for training job usage",
                   "QuotaCode": "L-P4DTRAIN", "Value": value}]
        if target.endswith(("ListServiceQuotas", "ListAWSDefaultServiceQuotas")):
            return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps({"Quotas": quotas}).encode()
        return 400, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(
            {"__type": "IllegalArgumentException", "message": target}).encode()
    return Stub(respond)


# ---------------------------------------------------------------- the whole job

@pytest.mark.slow
def test_good_setup_passes(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, per_device_batch_size=32))
    assert ids(rep, "error") == [], rep["findings"]
    # moto has no SageMaker quotas: the quota check says it could not read them, as a warning
    assert ids(rep, "warning") == ["DDP915"]
    assert "could not be read" in finding(rep, "DDP915")["message"]
    assert rep["status"] == "warn"
    w = rep["world"]
    assert (w["instance_type"], w["nnodes"], w["nproc_per_node"], w["world_size"]) == ("ml.p4d.24xlarge", 2, 8, 16)
    assert (w["launcher"], w["distribution"], w["region"]) == ("torchrun", "torch_distributed", REGION)
    assert "512" in finding(rep, "DDP916")["message"]  # 32 per device x 16


@pytest.mark.slow
def test_job_stage_runs_through_the_runner(env: dict[str, str], aws: dict[str, str]) -> None:
    assert "job" in registry.STAGES
    ctx = JobContext(JobSpec.from_dict(good_spec(aws, instance_count=0)))
    found = check_runner.run_stage("job", (ctx,), rank=None, select=["DDP903"])
    assert [f.id for f in found] == ["DDP903"] and "instance_count is 0" in found[0].message
    assert all(c.stage == "job" and c.category == "sagemaker_job"
               for c in catalogue.load_catalogue().values() if c.id.startswith("DDP9") and c.func)


# ---------------------------------------------------------------- network

@pytest.mark.slow
def test_security_group_without_self_rule(env: dict[str, str], aws: dict[str, str]) -> None:
    sg = aws["sg_open"]
    rep = check_job(good_spec(aws, security_group_ids=[sg]))
    f = finding(rep, "DDP907")
    assert f["severity"] == "error" and sg in f["message"] and "inbound all traffic from itself" in f["message"]
    assert "tcp 22 10.0.0.0/16" in f["message"]  # the rules it has
    assert f"aws ec2 authorize-security-group-ingress --group-id {sg} --protocol -1 --source-group {sg}" in f["hint"]
    assert ids(rep, "error") == ["DDP907"]


@pytest.mark.slow
def test_efa_needs_the_explicit_egress_rule(env: dict[str, str], aws: dict[str, str]) -> None:
    sg = aws["sg_in_only"]  # inbound self rule, default 0.0.0.0/0 egress
    assert "DDP907" not in ids(check_job(good_spec(aws, instance_type="ml.g5.12xlarge", security_group_ids=[sg])))
    f = finding(check_job(good_spec(aws, security_group_ids=[sg])), "DDP907")  # p4d: EFA
    assert "outbound all traffic to itself" in f["message"] and "EFA" in f["message"]
    assert f"authorize-security-group-egress --group-id {sg}" in f["hint"]


@pytest.mark.slow
def test_single_instance_needs_no_self_rule(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, instance_type="ml.g5.12xlarge", instance_count=1,
                              security_group_ids=[aws["sg_open"]]))
    assert "DDP907" not in ids(rep)


@pytest.mark.slow
def test_missing_subnet_and_group(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, subnets=[aws["subnet"], "subnet-0123456789abcdef0"],
                              security_group_ids=[aws["sg"], "sg-0123456789abcdef0"]))
    messages = [f["message"] for f in rep["findings"] if f["id"] == "DDP908"]
    assert any("subnet-0123456789abcdef0 not found" in m for m in messages)
    assert any("sg-0123456789abcdef0 not found" in m for m in messages)
    half = check_job(good_spec(aws, security_group_ids=[]))
    assert "needs both" in finding(half, "DDP908")["message"]


@pytest.mark.slow
def test_subnets_and_groups_in_different_vpcs(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, security_group_ids=[aws["sg_other"]]))
    f = finding(rep, "DDP909")
    assert aws["vpc"] in f["message"] and aws["sg_other"] in f["message"]
    assert "DDP909" not in ids(check_job(good_spec(aws)))


@pytest.mark.slow
def test_too_few_free_ips(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, instance_count=3, subnets=[aws["small_subnet"]]))  # EFA: 3 x 5 > 11
    f = finding(rep, "DDP910")
    assert "needs 15 free IP addresses" in f["message"] and ": 11" in f["message"]
    assert "DDP910" not in ids(check_job(good_spec(aws, instance_type="ml.g5.12xlarge", instance_count=3,
                                                   subnets=[aws["small_subnet"]])))  # 3 x 2 <= 11


# ---------------------------------------------------------------- IAM and S3

@pytest.mark.slow
def test_role_without_trust(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, role="sm-notrust"))
    f = finding(rep, "DDP912")
    assert "ec2.amazonaws.com" in f["message"] and "sagemaker.amazonaws.com" in f["message"]
    assert "aws iam update-assume-role-policy --role-name sm-notrust" in f["hint"]
    assert ids(rep, "error") == ["DDP912"]


@pytest.mark.slow
def test_missing_role(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, role=f"arn:aws:iam::{ACCOUNT}:role/service-role/nope"))
    assert "'arn:aws:iam::123456789012:role/service-role/nope' not found" in finding(rep, "DDP911")["message"]
    assert "DDP912" not in ids(rep)


def test_trust_policy_shapes() -> None:
    assert acct.trusts_sagemaker(TRUST)
    assert acct.trusts_sagemaker("%7B%22Statement%22%3A%5B%7B%22Effect%22%3A%22Allow%22%2C%22Principal%22%3A"
                                 "%7B%22Service%22%3A%5B%22sagemaker.amazonaws.com%22%5D%7D%2C%22Action%22%3A"
                                 "%5B%22sts%3AAssumeRole%22%5D%7D%5D%7D")
    assert not acct.trusts_sagemaker(EC2_TRUST)
    assert not acct.trusts_sagemaker({"Statement": [{**TRUST["Statement"][0], "Effect": "Deny"}]})


@pytest.mark.slow
def test_empty_input_prefix_and_missing_buckets(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, inputs=["s3://ddp-data/validation/", "s3://ddp-no-such-bucket/x"],
                              output_path="s3://ddp-no-such-output/out"))
    messages = [f["message"] for f in rep["findings"] if f["id"] == "DDP913"]
    assert any("no objects under prefix 'validation/'" in m for m in messages)
    assert any("bucket ddp-no-such-bucket does not exist" in m for m in messages)
    assert "bucket ddp-no-such-output does not exist" in finding(rep, "DDP914")["message"]
    assert not {"DDP913", "DDP914"} & set(ids(check_job(good_spec(aws, inputs={"train": "s3://ddp-data/train"}))))


# ---------------------------------------------------------------- the job's own settings

@pytest.mark.slow
@pytest.mark.parametrize("itype,dist,severity,words", [
    ("ml.m5.xlarge", {"torch_distributed": {"enabled": True}}, "error", "needs a GPU"),
    ("ml.g5.48xlarge", {"smdistributed": {"dataparallel": {"enabled": True}}}, "error", "SMDDP supports"),
    ("ml.p5.48xlarge", {"pytorchddp": {"enabled": True}}, "error", "refuses SMDDP's mpirun launch on p5"),
    ("ml.p3.16xlarge", {"smdistributed": {"dataparallel": {"enabled": True}}}, "warning", "older smdistributed"),
    ("p4d.24xlarge", {"torch_distributed": {"enabled": True}}, "error", "not a SageMaker instance type"),
])
def test_unsupported_instance_type(env: dict[str, str], aws: dict[str, str], itype: str, dist: dict[str, Any],
                                   severity: str, words: str) -> None:
    rep = check_job(good_spec(aws, instance_type=itype, distribution=dist, framework_version="2.2.0"),
                    select=["DDP904"])
    f = finding(rep, "DDP904")
    assert f["severity"] == severity and words in f["message"] and itype in f["message"]


@pytest.mark.parametrize("itype,dist", [
    ("ml.p4d.24xlarge", {"smdistributed": {"dataparallel": {"enabled": True}}}),
    ("ml.trn1.32xlarge", {"torch_distributed": {"enabled": True}}),
    ("ml.c5.xlarge", {"mpi": {"enabled": True, "processes_per_host": 4}}),
])
def test_suitable_instance_types(itype: str, dist: dict[str, Any]) -> None:
    ctx = JobContext(JobSpec(instance_type=itype, distribution=dist))
    assert list(jc.instance_type_suits(ctx)) == []


@pytest.mark.parametrize("dist,words", [
    ({"torch_distributed": {"enable": True}}, 'no "enabled"'),
    ({"torch_distributed": {"enabled": "false"}}, "not true/false"),
    ({"torchdistributed": {"enabled": True}}, "unknown key(s) torchdistributed"),
    ({"torch_distributed": {"enabled": True}, "mpi": {"enabled": True}}, "exactly one"),
    ({"mpi": {"enabled": True, "process_per_host": 8}}, "unknown key(s) process_per_host"),
    ({"mpi": {"enabled": True, "processes_per_host": 0}}, "processes_per_host is 0"),
    ({"smdistributed": {"dataparalel": {"enabled": True}}}, "no \"dataparallel\""),
    (["torch_distributed"], "not a dict"),
])
def test_malformed_distribution(dist: Any, words: str) -> None:
    problems = list(jc.distribution_malformed(JobContext(JobSpec(instance_type="ml.p4d.24xlarge", distribution=dist))))
    assert any(words in p.message for p in problems), [p.message for p in problems]


@pytest.mark.parametrize("dist", [None, {}, {"torch_distributed": {"enabled": True}},
                                  {"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-v"}}},
                                  {"pytorchddp": {"enabled": True}},
                                  {"mpi": {"enabled": True, "processes_per_host": 8}}])
def test_well_formed_distribution(dist: Any) -> None:
    assert jc.distribution_problems(dist) == []


@pytest.mark.slow
def test_malformed_distribution_end_to_end(env: dict[str, str], aws: dict[str, str]) -> None:
    rep = check_job(good_spec(aws, distribution={"torch_distributed": {"enabled": True}, "foo": {}}))
    assert "unknown key(s) foo" in finding(rep, "DDP902")["message"] and rep["status"] == "fail"


@pytest.mark.slow
def test_instance_count(env: dict[str, str]) -> None:
    assert [p.message for p in jc.instance_count(JobContext(JobSpec(instance_count=0)))] == [
        "instance_count is 0; SageMaker needs at least 1"]
    (p,) = jc.instance_count(JobContext(JobSpec(instance_type="ml.p4d.24xlarge", instance_count=2)))
    assert p.severity == "warning" and "each of the 2 instances" in p.message
    pytorchddp = JobSpec(instance_count=2, distribution={"pytorchddp": {"enabled": True}})
    assert list(jc.instance_count(JobContext(pytorchddp))) == []


def test_entry_point_must_be_py() -> None:
    dist = {"torch_distributed": {"enabled": True}}
    (p,) = jc.entry_point_py(JobContext(JobSpec(entry_point="run.sh", distribution=dist)))
    assert "run.sh" in p.message
    assert list(jc.entry_point_py(JobContext(JobSpec(entry_point="train.py", distribution=dist)))) == []
    mpi = JobSpec(entry_point="run.sh", distribution={"mpi": {"enabled": True}})
    assert list(jc.entry_point_py(JobContext(mpi))) == []


def test_framework_versions() -> None:
    def probs(**kw: Any) -> list[Any]:
        spec = {"instance_type": "ml.p4d.24xlarge", "distribution": {"torch_distributed": {"enabled": True}}, **kw}
        return list(jc.framework_version(JobContext(JobSpec.from_dict(spec))))
    assert probs(framework_version="2.3.0", py_version="py311") == []
    (old,) = probs(framework_version="1.12.1")
    assert old.severity is None and "not supported by torch_distributed" in old.message and "1.13.1" in old.message
    (new,) = probs(framework_version="2.9.0")
    assert new.severity == "warning" and "may be newer" in new.message
    (py,) = probs(framework_version="2.3.0", py_version="3.11")
    assert "py3N" in py.message


def test_batch_size_note() -> None:
    (p,) = jc.batch_size_note(JobContext(JobSpec(instance_type="ml.g5.12xlarge", instance_count=2,
                                                 distribution={"torch_distributed": {"enabled": True}},
                                                 per_device_batch_size=16, learning_rate=0.001)))
    assert "world size 8 = 2 instance(s) x 4" in p.message and "16 per device x 8 = 128" in p.message
    assert p.evidence["learning_rate_linear"] == pytest.approx(0.008)


# ---------------------------------------------------------------- quota

@pytest.mark.slow
def test_quota_below_instance_count(env: dict[str, str], aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    stub = quota_stub(1.0)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", stub.url)
        rep = check_job(good_spec(aws), select=["DDP915"])
        f = finding(rep, "DDP915")
        assert f["severity"] == "error" and "is 1 in region us-east-1; the job asks for 2" in f["message"]
        assert "--quota-code L-P4DTRAIN --desired-value 2" in f["hint"]
        assert ids(check_job(good_spec(aws, instance_count=1), select=["DDP915"])) == []
    finally:
        stub.close()
    assert stub.requests and all(r[0] == "POST" for r in stub.requests)


# ---------------------------------------------------------------- AWS errors become findings

@pytest.mark.slow
def test_access_denied_names_the_permission(env: dict[str, str], aws: dict[str, str], endpoint: str) -> None:
    """moto's IAM enforcement (POST /moto-api/reset-auth): an identity allowed S3 and STS only."""
    import urllib.request
    iam = client(endpoint, "iam")
    name = f"limited-{uuid.uuid4().hex[:6]}"
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="s3-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:GetCallerIdentity"],
                                                "Resource": "*"}]}))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    session = boto3.Session(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"],
                            region_name=REGION)

    def auth(count: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(),
                                                      headers={"Content-Type": "text/plain"}, method="POST"),
                               timeout=10).read()
    auth("0")
    try:
        # moto's S3 rejects newer botocore signatures while IAM auth is on: the job has no S3 settings
        rep = check_job(good_spec(aws, inputs=[], output_path=None), session=session)
    finally:
        auth("inf")
    denied = {f["evidence"]["permission"]: f for f in rep["findings"] if f["id"] == "DDP900"}
    assert {"ec2:DescribeSecurityGroups", "ec2:DescribeSubnets", "iam:GetRole"} <= set(denied), rep["findings"]
    f = denied["ec2:DescribeSecurityGroups"]
    assert f["severity"] == "warning" and "DescribeSecurityGroups was denied" in f["message"]
    assert f"user/{name}" in f["message"] and "DDP907" in f["message"]
    assert '"Action": "ec2:DescribeSecurityGroups"' in f["hint"]
    assert not {"DDP907", "DDP908", "DDP911", "DDP912"} & set(ids(rep))  # not reported as broken settings
    assert ids(rep, "error") == [], [f["message"] for f in rep["findings"]]


@pytest.mark.slow
def test_no_credentials_is_a_finding(monkeypatch: pytest.MonkeyPatch, aws: dict[str, str], env: dict[str, str]) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k)
    rep = check_job(good_spec(aws))
    f = finding(rep, "DDP901")
    assert f["severity"] == "error" and "NoCredentialsError" in f["message"] and rep["status"] == "fail"
    assert ids(rep, "error") == ["DDP901"] * len(ids(rep, "error"))
    # offline on purpose: --skip DDP901 checks the settings alone, as --skip does for any check
    offline = check_job(good_spec(aws), skip=["DDP901"])
    assert "DDP901" not in ids(offline) and offline["status"] in ("pass", "warn"), offline["findings"]


@pytest.mark.slow
def test_unreachable_endpoint_is_a_finding(monkeypatch: pytest.MonkeyPatch, aws: dict[str, str],
                                           env: dict[str, str]) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    rep = check_job(good_spec(aws, instance_count=1))
    assert "EndpointConnectionError" in finding(rep, "DDP901")["message"]


def test_spec_errors() -> None:
    with pytest.raises(SpecError, match="unknown job setting"):
        JobSpec.from_dict({"instance_typ": "ml.p4d.24xlarge"})
    with pytest.raises(SpecError, match="whole number"):
        JobSpec.from_dict({"instance_count": "two"})
    assert JobSpec.from_dict({"subnets": "subnet-a, subnet-b"}).subnets == ("subnet-a", "subnet-b")


# ---------------------------------------------------------------- report upload

def test_report_location() -> None:
    assert report_location("s3://b/p/") == ("b", "p/ddp-doctor-report.json")
    assert report_location("s3://b") == ("b", "ddp-doctor-report.json")
    assert report_location("s3://b/p/x.json", suffix=".rank2") == ("b", "p/x.rank2.json")
    assert report_location("s3://b/out/", {"SAGEMAKER_JOB_NAME": "job-1"}) == ("b", "out/job-1/ddp-doctor-report.json")
    assert report_location("s3://b/out", {"SM_TRAINING_ENV": '{"job_name": "j2"}'}) == \
        ("b", "out/j2/ddp-doctor-report.json")


@pytest.mark.slow
def test_upload_retries_then_succeeds(env: dict[str, str]) -> None:
    def respond(h: Any, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if h.command == "PUT" and sum(1 for r in stub.requests if r[0] == "PUT") <= 2:
            return 500, {"Content-Type": "application/xml"}, (
                b"<Error><Code>InternalError</Code><Message>try again</Message></Error>")
        return 200, {"ETag": '"abc"'}, b""
    stub = Stub(respond)
    try:
        sleeps: list[float] = []
        session = boto3.Session(region_name=REGION)
        s3 = session.client("s3", endpoint_url=stub.url, config=__import__("botocore.config").config.Config(
            retries={"total_max_attempts": 1}))
        err = upload_report({"status": "pass", "env": {"AWS_SECRET_ACCESS_KEY": SECRET}}, "s3://bkt/r/",
                            client=s3, sleep=sleeps.append)
        assert err is None and sleeps == [0.5, 1.0]
        assert [r[1].split("?")[0] for r in stub.requests] == ["/bkt/r/ddp-doctor-report.json"] * 3
    finally:
        stub.close()


@pytest.mark.slow
def test_upload_gives_up_after_bounded_tries(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub(lambda h, b: (503, {"Content-Type": "application/xml"},
                              b"<Error><Code>SlowDown</Code><Message>later</Message></Error>"))
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", stub.url)  # boto3's own per-service endpoint setting
        err = upload_report({"status": "pass"}, "s3://bkt/r/", session=boto3.Session(region_name=REGION),
                            tries=3, sleep=lambda s: None)
        assert err is not None and "after 3 tries" in err and "SlowDown" in err
        assert len(stub.requests) == 3  # bounded: our three tries, no hidden boto3 retries
    finally:
        stub.close()


# ---------------------------------------------------------------- the command line, end to end

def ddp_doctor(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_doctor", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def cli_args(aws: dict[str, str], **over: str) -> list[str]:
    flags = {"--instance-type": "ml.p4d.24xlarge", "--instance-count": "2",
             "--distribution": '{"torch_distributed": {"enabled": true}}', "--framework-version": "2.3.0",
             "--entry-point": "train.py", "--role": "sm-ok", "--subnets": aws["subnet"],
             "--security-group-ids": aws["sg"], "--input": "s3://ddp-data/train/", "--output-path": "s3://ddp-out/x/"}
    flags.update(over)
    return [x for k, v in flags.items() for x in (k, v)]


def assert_no_secret(*texts: str) -> None:
    for t in texts:
        assert SECRET not in t and TOKEN not in t


@pytest.mark.slow
def test_cli_good_job(endpoint: str, aws: dict[str, str], tmp_path: Any) -> None:
    report = tmp_path / "r.json"
    p = ddp_doctor("sagemaker-check", *cli_args(aws), "--report", str(report), env=aws_env(endpoint))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "WARN" in p.stdout and "DDP915" in p.stdout and "Traceback" not in p.stderr
    data = json.loads(report.read_text())
    assert data["schema"] == "ddp-doctor.report" and data["world"]["world_size"] == 16
    assert_no_secret(p.stdout, p.stderr, report.read_text())


@pytest.mark.slow
def test_cli_bad_job_json(endpoint: str, aws: dict[str, str]) -> None:
    args = cli_args(aws, **{"--security-group-ids": aws["sg_open"], "--role": "sm-notrust"})
    p = ddp_doctor("sagemaker-check", *args, "--json", env=aws_env(endpoint))
    assert p.returncode == 3, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    assert {"DDP907", "DDP912"} <= set(ids(rep, "error")) and rep["root_cause"]["id"] in ("DDP907", "DDP912")
    assert_no_secret(p.stdout, p.stderr)


@pytest.mark.slow
def test_cli_config_file_and_flags(endpoint: str, aws: dict[str, str], tmp_path: Any) -> None:
    cfg = tmp_path / "job.yaml"
    pytest.importorskip("yaml")
    cfg.write_text("instance_type: ml.p4d.24xlarge\ninstance_count: 2\ndistribution:\n  torch_distributed:\n"
                   f"    enabled: true\nrole: sm-ok\nsubnets: [{aws['subnet']}]\nsecurity_group_ids: [{aws['sg']}]\n"
                   "inputs:\n  train: s3://ddp-data/train/\n")
    p = ddp_doctor("sagemaker-check", "--config", str(cfg), "--instance-type", "ml.m5.xlarge", "--json",
                   env=aws_env(endpoint))
    assert p.returncode == 3 and "DDP904" in ids(json.loads(p.stdout), "error")  # the flag won


@pytest.mark.slow
def test_cli_usage_errors(endpoint: str, aws: dict[str, str], tmp_path: Any) -> None:
    e = aws_env(endpoint)
    p = ddp_doctor("sagemaker-check", "--distribution", "{not json", env=e)
    assert p.returncode == 2 and "distribution is not valid JSON" in p.stderr and "Traceback" not in p.stderr
    bad = tmp_path / "job.json"
    bad.write_text('{"instance_typ": "ml.p4d.24xlarge"}')
    p = ddp_doctor("sagemaker-check", "--config", str(bad), env=e)
    assert p.returncode == 2 and "unknown job setting(s): instance_typ" in p.stderr


@pytest.mark.slow
def test_cli_without_boto3(endpoint: str) -> None:
    code = ("import sys; sys.modules['boto3'] = None; from ddp_doctor.cli import main; "
            "sys.exit(main(['sagemaker-check', '--instance-type', 'ml.p4d.24xlarge']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=aws_env(endpoint))
    assert p.returncode == 1 and 'pip install "ddp-doctor[aws]"' in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_importing_does_not_import_boto3(endpoint: str) -> None:
    code = ("import sys, ddp_doctor, ddp_doctor.cli, ddp_doctor.sagemaker, ddp_doctor.cli.sagemaker_check; "
            "from ddp_doctor import checks; checks.load_catalogue(); ddp_doctor.cli.build_parser(); "
            "assert 'boto3' not in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=aws_env(endpoint))
    assert p.returncode == 0, p.stderr


@pytest.mark.slow
def test_cli_uploads_report(endpoint: str, aws: dict[str, str]) -> None:
    p = ddp_doctor("sagemaker-check", *cli_args(aws), "--report-s3-uri", "s3://ddp-reports/checks/",
                   env=aws_env(endpoint))
    assert p.returncode == 0, p.stderr
    body = client(endpoint, "s3").get_object(Bucket="ddp-reports", Key="checks/ddp-doctor-report.json")["Body"].read()
    assert json.loads(body)["world"]["world_size"] == 16
    assert_no_secret(body.decode())


@pytest.mark.slow
def test_cli_upload_to_missing_bucket_is_a_warning(endpoint: str, aws: dict[str, str]) -> None:
    p = ddp_doctor("sagemaker-check", *cli_args(aws), "--report-s3-uri", "s3://ddp-missing-reports/x/",
                   env=aws_env(endpoint))
    assert p.returncode == 0  # unchanged by the failed upload
    assert ("ddp-doctor: warning: could not upload the report to "
            "s3://ddp-missing-reports/x/ddp-doctor-report.json") in p.stderr
    assert "NoSuchBucket" in p.stderr and "Traceback" not in p.stderr
    assert_no_secret(p.stdout, p.stderr)


@pytest.mark.slow
def test_preflight_uploads_merged_report(endpoint: str) -> None:
    """The parent of a self-launched preflight uploads the merged report (DDP_DOCTOR_REPORT_S3_URI,
    with the SageMaker job name in the key)."""
    e = aws_env(endpoint, DDP_DOCTOR_REPORT_S3_URI="s3://ddp-reports/pf/", SAGEMAKER_JOB_NAME="job-7")
    p = ddp_doctor("preflight", "--nproc-per-node", "1", "--timeout", "30", "--report", os.devnull, env=e)
    assert p.returncode in (0, 3), p.stdout + p.stderr
    body = client(endpoint, "s3").get_object(Bucket="ddp-reports", Key="pf/job-7/ddp-doctor-report.json")["Body"].read()
    assert json.loads(body)["world"]["world_size"] == 1
    assert_no_secret(p.stdout, p.stderr, body.decode())
