"""Checks of a planned SageMaker job against the AWS account (DDP907-DDP915, stage "job").

What is inside: the network (security group self-rules, subnets and security groups exist and
share a VPC, free IP addresses), the execution role (exists, trusts SageMaker), S3 (inputs have
objects, the output bucket exists) and the training instance quota. The job's own settings
(distribution, instance type and count, versions) are checked in ddp_doctor.checks.sagemaker_job,
which also declares DDP900 / DDP901 for the AWS calls these checks could not make.

Facts follow the SageMaker developer guide (train-vpc: self-referencing security groups, free IPs
per instance); see docs/facts.md, "Client side".
"""
from __future__ import annotations

import json
import urllib.parse
from typing import Any, Iterator

from ddp_doctor.checks.sagemaker_job import STAGE, TIMEOUT, local_mode
from ddp_doctor.facts.env_values import bounded_json
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check
from ddp_doctor.sagemaker.aws import JobContext, Reply

SAGEMAKER_PRINCIPAL = "sagemaker.amazonaws.com"
FREE_IPS_PER_INSTANCE, FREE_IPS_PER_EFA_INSTANCE = 2, 5


def _multi(ctx: JobContext) -> bool:
    """Does the job need traffic between instances (several, or an EFA type)?"""
    return (ctx.spec.instance_count or 0) > 1 or ctx.spec.efa


def _could_not(what: str, r: Reply) -> Problem:
    """A check that got an unexpected AWS answer says so, as a warning."""
    return Problem(f"could not check {what}: AWS answered {r.code}: {r.message}",
                   hint="Retry; if it persists, check the service's status in this region and the endpoint "
                        "boto3 uses (AWS_ENDPOINT_URL).", severity="warning",
                   evidence={"error_code": r.code})


# -- the network ------------------------------------------------------------------------------

def _has_self_rule(perms: list[dict[str, Any]] | None, gid: str) -> bool:
    return any(str(p.get("IpProtocol")) == "-1"
               and any(pair.get("GroupId") == gid for pair in p.get("UserIdGroupPairs") or [])
               for p in perms or [])


def _open_egress(perms: list[dict[str, Any]] | None) -> bool:
    return any(str(p.get("IpProtocol")) == "-1"
               and any(r.get("CidrIp") == "0.0.0.0/0" for r in p.get("IpRanges") or [])
               for p in perms or [])


def _describe_rules(perms: list[dict[str, Any]] | None) -> str:
    parts = []
    for p in perms or []:
        proto = "all" if str(p.get("IpProtocol")) == "-1" else str(p.get("IpProtocol"))
        ports = ""
        if proto != "all" and p.get("FromPort") is not None:
            ports = f" {p['FromPort']}" + (f"-{p['ToPort']}" if p.get("ToPort") != p.get("FromPort") else "")
        peers = [r.get("CidrIp") for r in p.get("IpRanges") or []]
        peers += [r.get("CidrIpv6") for r in p.get("Ipv6Ranges") or []]
        peers += [g.get("GroupId") for g in p.get("UserIdGroupPairs") or []]
        peers += [pl.get("PrefixListId") for pl in p.get("PrefixListIds") or []]
        parts.append(f"{proto}{ports} {'/'.join(str(x) for x in peers if x) or '(none)'}")
    return "; ".join(parts) or "none"


@check("DDP907", category="sagemaker_job", severity="error",
       title="Security group does not allow traffic within itself", stage=STAGE, timeout=TIMEOUT)
def security_group_self_rules(ctx: JobContext) -> Iterator[Problem]:
    """
    What: For a job with more than one instance or an EFA instance type, a security group of the
    job lacks the self-referencing all-traffic rules: inbound from the group itself (IpProtocol -1,
    source the group) and outbound to it (on EFA types an explicit self-referencing egress rule;
    elsewhere an all-traffic 0.0.0.0/0 egress also allows it).
    Why: The developer guide requires traffic between the containers of one job; without it the
    instances cannot reach the master (torchrun 7777, mpirun/ssh 22, SMDDP 7592) and the job
    stalls at initialisation until it times out, billing every instance meanwhile.
    Fix: Add the rules, e.g. `aws ec2 authorize-security-group-ingress --group-id sg-... --protocol -1
    --source-group sg-...` and `aws ec2 authorize-security-group-egress --group-id sg-...
    --ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{GroupId=sg-...}]'` (the message has the exact
    commands).
    """
    if not _multi(ctx) or not ctx.spec.security_group_ids:
        return
    groups = ctx.security_groups()
    if groups is None:
        return  # DDP900/DDP901 say why
    efa = ctx.spec.efa
    why = (f"{ctx.spec.instance_count} instances" if (ctx.spec.instance_count or 0) > 1 else "one instance")
    why += f" of EFA type {ctx.spec.instance_type}" if efa else f" of {ctx.spec.instance_type}"
    for gid in ctx.spec.security_group_ids:
        g = groups.get(gid)
        if g is None:
            continue  # DDP908
        inbound = _has_self_rule(g.get("IpPermissions"), gid)
        egress = g.get("IpPermissionsEgress")
        outbound = _has_self_rule(egress, gid) or (not efa and _open_egress(egress))
        if inbound and outbound:
            continue
        missing, fixes = [], []
        if not inbound:
            missing.append("inbound all traffic from itself")
            fixes.append(f"aws ec2 authorize-security-group-ingress --group-id {gid} --protocol -1 "
                         f"--source-group {gid}")
        if not outbound:
            missing.append("outbound all traffic to itself" + (" (EFA needs the explicit self-referencing "
                                                               "egress rule)" if efa and _open_egress(egress) else ""))
            fixes.append(f"aws ec2 authorize-security-group-egress --group-id {gid} "
                         f"--ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{{GroupId={gid}}}]'")
        yield Problem(
            f"security group {gid} ({g.get('GroupName', '?')}) lacks {' and '.join(missing)}, needed for "
            f"{why}; inbound rules: {_describe_rules(g.get('IpPermissions'))}; outbound rules: "
            f"{_describe_rules(egress)}",
            hint="Run: " + " && ".join(fixes),
            evidence={"group_id": gid, "inbound_self": inbound, "outbound_self": outbound, "efa": efa})


@check("DDP908", category="sagemaker_job", severity="error", title="Subnet or security group not found",
       stage=STAGE, timeout=TIMEOUT)
def vpc_resources_exist(ctx: JobContext) -> Iterator[Problem]:
    """
    What: A subnet or security group the job names does not exist in this account and region, or
    only one of subnets / security_group_ids is given.
    Why: SageMaker's VpcConfig needs both, and rejects IDs it cannot find when the job is created;
    an ID from another region or account is a common copy-paste mistake.
    Fix: Use IDs from `aws ec2 describe-subnets` and `aws ec2 describe-security-groups` in the job's
    region (--region), and give both subnets and security_group_ids, or neither.
    """
    spec = ctx.spec
    if bool(spec.subnets) != bool(spec.security_group_ids):
        given, missing = ("subnets", "security_group_ids") if spec.subnets else ("security_group_ids", "subnets")
        yield Problem(f"{given} given but no {missing}: SageMaker's VpcConfig needs both",
                      hint=f"Add {missing} (--{missing.replace('_', '-')}) or drop {given}.",
                      evidence={"subnets": list(spec.subnets), "security_group_ids": list(spec.security_group_ids)})
    region = ctx.region or "?"
    for kind, ids, found in (("subnet", spec.subnets, ctx.subnets()),
                             ("security group", spec.security_group_ids, ctx.security_groups())):
        if found is None or not ids:
            continue
        absent = [i for i in ids if i not in found]
        if absent:
            yield Problem(f"{kind}(s) {', '.join(absent)} not found in region {region}",
                          evidence={"kind": kind, "missing": absent, "region": region})


def _vpcs(ctx: JobContext) -> tuple[dict[str, str | None], dict[str, str | None]] | None:
    subnets, groups = ctx.subnets(), ctx.security_groups()
    if subnets is None or groups is None:
        return None
    return ({k: v.get("VpcId") for k, v in subnets.items()}, {k: v.get("VpcId") for k, v in groups.items()})


@check("DDP909", category="sagemaker_job", severity="error",
       title="Subnets and security groups are in different VPCs", stage=STAGE, timeout=TIMEOUT)
def same_vpc(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The job's subnets and security groups do not all belong to one VPC.
    Why: SageMaker places the instances' network interfaces in the subnets and attaches the
    security groups to them; both must be in the same VPC or the job is refused.
    Fix: Use security groups created in the subnets' VPC (`aws ec2 describe-security-groups --filters
    Name=vpc-id,Values=vpc-...`), or subnets of the groups' VPC.
    """
    vpcs = _vpcs(ctx)
    if vpcs is None:
        return
    subnet_vpcs, group_vpcs = vpcs
    all_vpcs = set(subnet_vpcs.values()) | set(group_vpcs.values())
    if len(all_vpcs) > 1:
        where = [f"{k} in {v}" for k, v in {**subnet_vpcs, **group_vpcs}.items()]
        yield Problem(f"the job's network spans {len(all_vpcs)} VPCs: {', '.join(where)}",
                      evidence={"subnets": subnet_vpcs, "security_groups": group_vpcs})


@check("DDP910", category="sagemaker_job", severity="error", title="Subnets have too few free IP addresses",
       stage=STAGE, timeout=TIMEOUT, severities=("warning",))
def free_ips(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The job's subnets have fewer free private IP addresses (AvailableIpAddressCount) than
    the job needs: 2 per instance, 5 per instance on EFA types.
    Why: Each instance takes addresses for its network interfaces (EFA types more); without them
    SageMaker cannot place the instances and the job fails or waits for capacity.
    Fix: Use a larger subnet or add subnets with free addresses (`aws ec2 describe-subnets
    --subnet-ids ... --query 'Subnets[].AvailableIpAddressCount'`), or free addresses in them.
    Severity: error when all subnets together have too few free addresses; a warning when only no
    single subnet has enough.
    """
    subnets = ctx.subnets()
    if not subnets or (ctx.spec.instance_count or 0) < 1:
        return
    per = FREE_IPS_PER_EFA_INSTANCE if ctx.spec.efa else FREE_IPS_PER_INSTANCE
    need = per * ctx.spec.instance_count
    free = {k: int(v.get("AvailableIpAddressCount") or 0) for k, v in subnets.items()}
    shown = ", ".join(f"{k}: {n}" for k, n in free.items())
    evidence = {"free": free, "needed": need, "per_instance": per}
    basis = f"{ctx.spec.instance_count} x {per} for {ctx.spec.instance_type}{' (EFA)' if ctx.spec.efa else ''}"
    if sum(free.values()) < need:
        yield Problem(f"the job needs {need} free IP addresses ({basis}); its subnets have {shown}",
                      evidence=evidence)
    elif max(free.values()) < need:
        yield Problem(f"no single subnet has the {need} free IP addresses the job needs ({basis}); "
                      f"together they do ({shown}), which works only if SageMaker spreads the instances",
                      severity="warning", evidence=evidence)


# -- IAM ----------------------------------------------------------------------------------------

def _role_name(role: str) -> str:
    return role.rsplit("/", 1)[-1] if role.startswith("arn:") else role


def _role(ctx: JobContext) -> Reply | None:
    role = ctx.spec.role
    if not role:
        return None
    return ctx.call("iam", "get_role", RoleName=_role_name(role))


def _other_account(ctx: JobContext) -> bool:
    """A role ARN in another account cannot be read with iam:GetRole from this one."""
    role = ctx.spec.role or ""
    if not role.startswith("arn:"):
        return False
    me = ctx.caller_arn()
    parts, mine = role.split(":"), (me or "").split(":")
    return len(parts) > 4 and len(mine) > 4 and bool(parts[4]) and parts[4] != mine[4]


@check("DDP911", category="sagemaker_job", severity="error", title="Execution role not found",
       stage=STAGE, timeout=TIMEOUT, severities=("warning",))
def role_exists(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The execution role (name or ARN) does not exist in the account.
    Why: SageMaker assumes this role to pull the image, read the data and write the output; a
    misspelt or deleted role fails CreateTrainingJob.
    Fix: Create the role (the console's SageMaker execution role, or `aws iam create-role`) or pass
    an existing one: `aws iam list-roles --query 'Roles[].Arn'`.
    Severity: error when the role does not exist; a warning when AWS gave an unexpected answer and
    the check could not be done.
    """
    r = _role(ctx)
    if r is None or r.ok or r.recorded or _other_account(ctx):
        return
    if r.not_found:
        yield Problem(f"role {ctx.spec.role!r} not found (iam:GetRole RoleName={_role_name(ctx.spec.role or '')}: "
                      f"{r.code})", evidence={"role": ctx.spec.role, "error_code": r.code})
    else:
        yield _could_not(f"role {ctx.spec.role!r}", r)


def _policy(doc: Any) -> dict[str, Any]:
    if isinstance(doc, str):
        try:
            doc = bounded_json(urllib.parse.unquote(doc))
        except ValueError:
            return {}
    return doc if isinstance(doc, dict) else {}


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v] if v is not None else []


def trusts_sagemaker(doc: Any) -> bool:
    """Does a trust policy let sagemaker.amazonaws.com call sts:AssumeRole?"""
    for st in _as_list(_policy(doc).get("Statement")):
        if not isinstance(st, dict) or st.get("Effect") != "Allow":
            continue
        actions = [str(a) for a in _as_list(st.get("Action"))]
        if not any(a in ("sts:AssumeRole", "sts:*", "*") for a in actions):
            continue
        principal = st.get("Principal")
        if principal == "*":
            return True
        if isinstance(principal, dict) and (SAGEMAKER_PRINCIPAL in _as_list(principal.get("Service"))
                                            or principal.get("AWS") == "*"):
            return True
    return False


@check("DDP912", category="sagemaker_job", severity="error", title="Execution role does not trust SageMaker",
       stage=STAGE, timeout=TIMEOUT)
def role_trusts_sagemaker(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The execution role's trust policy has no statement allowing the service principal
    sagemaker.amazonaws.com to call sts:AssumeRole.
    Why: SageMaker cannot assume the role, so CreateTrainingJob fails with "could not assume role".
    Fix: Add the trust: `aws iam update-assume-role-policy --role-name NAME --policy-document
    '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"sagemaker.amazonaws.com"},"Action":"sts:AssumeRole"}]}'`
    (this replaces the trust policy: merge in any statements it already has).
    """
    r = _role(ctx)
    if r is None or not r.ok:
        return
    role = r.data.get("Role") or {}
    doc = role.get("AssumeRolePolicyDocument")
    if trusts_sagemaker(doc):
        return
    principals = sorted({json.dumps(st.get("Principal"), sort_keys=True)
                         for st in _as_list(_policy(doc).get("Statement")) if isinstance(st, dict)})
    name = role.get("RoleName") or _role_name(ctx.spec.role or "")
    yield Problem(
        f"role {role.get('Arn') or ctx.spec.role} trusts {', '.join(principals) or 'no principal'}, "
        f"not {SAGEMAKER_PRINCIPAL} for sts:AssumeRole",
        hint=f"aws iam update-assume-role-policy --role-name {name} --policy-document "
             f"'{{\"Version\":\"2012-10-17\",\"Statement\":[{{\"Effect\":\"Allow\",\"Principal\":"
             f"{{\"Service\":\"{SAGEMAKER_PRINCIPAL}\"}},\"Action\":\"sts:AssumeRole\"}}]}}' "
             f"(this replaces the trust policy: merge in the statements it already has)",
        evidence={"role": role.get("Arn"), "trust_policy": _policy(doc)})


# -- S3 -----------------------------------------------------------------------------------------

def _split_s3(uri: str) -> tuple[str, str] | None:
    if not uri.startswith("s3://"):
        return None
    bucket, _, key = uri[5:].partition("/")
    return (bucket, key) if bucket else None


@check("DDP913", category="sagemaker_job", severity="error", title="Input S3 prefix missing or empty",
       stage=STAGE, timeout=TIMEOUT, severities=("warning",))
def inputs_have_objects(ctx: JobContext) -> Iterator[Problem]:
    """
    What: An input channel's S3 URI names a bucket that does not exist, or a prefix with no objects.
    Why: SageMaker fails the job when a channel has no data, after the instances start (File mode
    downloads first); a wrong prefix is easy to miss in a notebook.
    Fix: Upload the data (`aws s3 cp --recursive ./data s3://bucket/prefix/`) or correct the URI;
    `aws s3 ls s3://bucket/prefix/` shows what is there.
    Severity: error when the prefix is missing or empty; a warning when AWS gave an unexpected
    answer and the check could not be done.
    """
    for uri in ctx.spec.inputs:
        if uri.startswith("file://"):
            continue  # local mode
        loc = _split_s3(uri)
        if loc is None:
            yield Problem(f"input {uri!r} is not an S3 URI (s3://bucket/prefix)", evidence={"input": uri})
            continue
        bucket, prefix = loc
        r = ctx.call("s3", "list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1)
        if r.recorded:
            continue
        if not r.ok:
            if r.not_found:
                yield Problem(f"input {uri}: bucket {bucket} does not exist ({r.code})",
                              hint=f"Create it (`aws s3 mb s3://{bucket}`) and upload the data, or correct the URI.",
                              evidence={"input": uri, "error_code": r.code})
            else:
                yield _could_not(f"input {uri}", r)
            continue
        if not r.data.get("KeyCount") and not r.data.get("Contents"):
            yield Problem(f"input {uri}: no objects under prefix {prefix!r} in bucket {bucket}",
                          evidence={"input": uri})


@check("DDP914", category="sagemaker_job", severity="error", title="Output bucket does not exist",
       stage=STAGE, timeout=TIMEOUT, severities=("warning",))
def output_bucket(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The estimator's output_path names an S3 bucket that does not exist (or is not an S3 URI).
    Why: The job trains to the end and then fails to upload the model: the whole run is lost.
    Fix: Create the bucket in the job's region (`aws s3 mb s3://bucket --region REGION`) or point
    output_path at an existing one (the SDK's default is sagemaker-REGION-ACCOUNT).
    Severity: error when the bucket does not exist; a warning when AWS gave an unexpected answer and
    the check could not be done.
    """
    out = ctx.spec.output_path
    if not out or out.startswith("file://"):
        return
    loc = _split_s3(out)
    if loc is None:
        yield Problem(f"output_path {out!r} is not an S3 URI (s3://bucket/prefix)", evidence={"output_path": out})
        return
    r = ctx.call("s3", "head_bucket", Bucket=loc[0])
    if r.ok or r.recorded:
        return
    if r.not_found:
        yield Problem(f"output_path {out}: bucket {loc[0]} does not exist ({r.code})",
                      hint=f"aws s3 mb s3://{loc[0]}" + (f" --region {ctx.region}" if ctx.region else ""),
                      evidence={"output_path": out, "error_code": r.code})
    else:
        yield _could_not(f"output bucket {loc[0]}", r)


# -- quota --------------------------------------------------------------------------------------

def _find_quota(ctx: JobContext, method: str, name: str) -> tuple[dict[str, Any] | None, Reply | None]:
    """(the quota named `name`, None) or (None, the failed reply); (None, None) when absent."""
    token = None
    for _ in range(50):  # bounded paging (SageMaker has a few hundred quotas)
        kwargs: dict[str, Any] = {"ServiceCode": "sagemaker", "MaxResults": 100}
        if token:
            kwargs["NextToken"] = token
        r = ctx.call("service-quotas", method, **kwargs)
        if not r.ok:
            return None, r
        for q in r.data.get("Quotas") or []:
            if q.get("QuotaName") == name:
                return q, None
        token = r.data.get("NextToken")
        if not token:
            break
    return None, None


@check("DDP915", category="sagemaker_job", severity="error", title="Training instance quota below instance count",
       stage=STAGE, timeout=TIMEOUT, severities=("warning",))
def training_quota(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The account's Service Quotas value "<instance type> for training job usage" (service
    code sagemaker) is below instance_count. When the quota cannot be read, a warning says so.
    Why: SageMaker refuses the job with ResourceLimitExceeded; new accounts often have 0 for large
    GPU types, and the quota counts instances of all running jobs.
    Fix: Request an increase: `aws service-quotas request-service-quota-increase --service-code
    sagemaker --quota-code L-... --desired-value N` (the message has the code), or use fewer
    instances or another type.
    Severity: error when the quota is below the instance count; a warning when the quota could not
    be read or no quota exists for the type, so the count is unchecked.
    """
    itype, n = ctx.spec.instance_type, ctx.spec.instance_count or 0
    if not itype or local_mode(ctx) or n < 1 or not itype.startswith("ml."):
        return
    name = f"{itype} for training job usage"
    quota, failed = _find_quota(ctx, "list_service_quotas", name)
    if quota is None and failed is None:
        quota, failed = _find_quota(ctx, "list_aws_default_service_quotas", name)
    if failed is not None:
        if not failed.recorded:
            yield Problem(f"the quota {name!r} could not be read from the Service Quotas API "
                          f"({failed.code}: {failed.message[:200]}); instance_count={n} is unchecked",
                          hint=f"Check it in the Service Quotas console (Amazon SageMaker, {name!r}) or with "
                               f"`aws service-quotas list-service-quotas --service-code sagemaker`.",
                          severity="warning", evidence={"quota_name": name, "error_code": failed.code})
        return
    if quota is None:
        yield Problem(f"no quota named {name!r} in region {ctx.region or '?'}: the type may not be offered "
                      f"for training there; instance_count={n} is unchecked", severity="warning",
                      hint="Check the instance type's spelling and the region (--region).",
                      evidence={"quota_name": name})
        return
    value = quota.get("Value")
    if value is None:
        return
    try:
        limit = float(value)
    except (TypeError, ValueError):
        return
    if limit < n:
        code = quota.get("QuotaCode") or "L-..."
        yield Problem(f"quota {name!r} is {limit:g} in region {ctx.region or '?'}; the job asks for {n} instance(s)",
                      hint=f"aws service-quotas request-service-quota-increase --service-code sagemaker "
                           f"--quota-code {code} --desired-value {n}"
                           + (f" --region {ctx.region}" if ctx.region else "")
                           + " (the quota counts instances of all running training jobs)",
                      evidence={"quota_name": name, "quota_code": code, "value": limit, "instance_count": n})
