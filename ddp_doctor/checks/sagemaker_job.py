"""Client-side checks of a planned SageMaker training job (DDP900-DDP999, stage "job").

Each check takes a :class:`ddp_doctor.sagemaker.job.JobContext` (the spec plus lazily created
boto3 clients) and yields problems, like every other check. AWS calls go through
``ctx.call``, which caches answers and records calls that were denied or could not be made:
those become DDP900 / DDP901 (declared here), so a check that could not ask AWS says nothing.

Facts follow the SageMaker developer guide (train-vpc: self-referencing security groups, free IPs
per instance) and the SageMaker Python SDK (distribution shapes, SMDDP instance list, framework
versions); see DOMAIN.md section 1, "Client side".
"""
from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any, Iterator, Mapping

from ddp_doctor.checks.sagemaker_env import SMDDP_INSTANCES, SMDDP_OLDER_INSTANCES
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check, declare
from ddp_doctor.sagemaker.job import (
    DISTRIBUTION_EXTRAS,
    KNOWN_DISTRIBUTIONS,
    JobContext,
    Reply,
    is_gpu_type,
    is_trn_type,
    processes_per_instance,
)

STAGE = "job"
TIMEOUT = 60.0  # boto3 calls are bounded by connect/read timeouts and two attempts each

PERMISSION_MISSING = declare(
    "DDP900", category="sagemaker_job", severity="warning", title="AWS permission missing: a job check was not done",
    doc="""
    What: An AWS call a job check needs was denied (AccessDenied, UnauthorizedOperation); the
    message names the IAM action (e.g. ec2:DescribeSecurityGroups), the call and the checks that
    were skipped.
    Why: ddp-doctor checks with your credentials, which may lack read access that the job's own
    role does not need; the setting it would have checked may still be wrong.
    Fix: Grant the named read-only action to the identity you run ddp-doctor as (or use a profile
    that has it: --profile), or verify the skipped settings by hand.
    """)

AWS_UNREACHABLE = declare(
    "DDP901", category="sagemaker_job", severity="error", title="AWS could not be asked: job checks not done",
    doc="""
    What: No credentials were found, they were rejected, no region is set, or the endpoint did not
    answer, so the job's AWS settings could not be checked at all.
    Why: Without an answer from AWS, ddp-doctor cannot tell whether the role, network and data of the
    job exist; a pass would be meaningless.
    Fix: Configure credentials the way boto3 finds them (`aws configure`, AWS_PROFILE, environment
    variables or an instance role), set a region (--region or AWS_DEFAULT_REGION), and check
    AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_<SERVICE> if you use a custom endpoint.
    """)

# Framework versions each distribution supports: a snapshot of the SageMaker Python SDK's lists
# (src/sagemaker/fw_utils.py: SM_DATAPARALLEL_SUPPORTED_FRAMEWORK_VERSIONS["pytorch"],
# PYTORCHDDP_SUPPORTED_FRAMEWORK_VERSIONS, TORCH_DISTRIBUTED_GPU_SUPPORTED_FRAMEWORK_VERSIONS and
# the Trainium list), SDK v2.2xx. A version in none of them is newer or unknown: a warning only.
SUPPORTED_VERSIONS: dict[str, tuple[str, ...]] = {
    "smdistributed": ("1.6", "1.6.0", "1.7", "1.7.1", "1.8", "1.8.0", "1.8.1", "1.9", "1.9.0", "1.9.1",
                      "1.10", "1.10.0", "1.10.2", "1.11", "1.11.0", "1.12", "1.12.0", "1.12.1", "1.13.1",
                      "2.0.0", "2.0.1", "2.1.0", "2.1.2", "2.2.0", "2.3.0", "2.3.1", "2.4.1"),
    "pytorchddp": ("1.10", "1.10.0", "1.10.2", "1.11", "1.11.0", "1.12", "1.12.0", "1.12.1", "1.13.1",
                   "2.0.0", "2.0.1", "2.1.0", "2.2.0"),
    "torch_distributed": ("1.13.1", "2.0.0", "2.0.1", "2.1.0", "2.1.2", "2.2.0", "2.3.0", "2.3.1", "2.4.1"),
    "torch_distributed_trn": ("1.11.0", "1.12.0", "1.12.1", "1.13.1", "2.0.0"),
}
ALL_KNOWN_VERSIONS = frozenset(v for vs in SUPPORTED_VERSIONS.values() for v in vs)

# The shapes the SDK reads: distribution -> allowed keys of its dict.
ALLOWED_KEYS: dict[str, tuple[str, ...]] = {
    "torch_distributed": ("enabled",),
    "pytorchddp": ("enabled", "custom_mpi_options"),
    "mpi": ("enabled", "processes_per_host", "custom_mpi_options"),
    "smdistributed": ("dataparallel", "modelparallel"),
    "smdistributed.dataparallel": ("enabled", "custom_mpi_options"),
}
# Distributions the SDK knows that are not PyTorch DDP: not checked further.
OTHER_SDK_DISTRIBUTIONS = ("pytorchxla", "parameter_server", "multi_worker_mirrored_strategy")
SHAPES = ('{"torch_distributed": {"enabled": true}}, {"smdistributed": {"dataparallel": {"enabled": true}}}, '
          '{"pytorchddp": {"enabled": true}} or {"mpi": {"enabled": true, "processes_per_host": 8}}')
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


def _local_mode(ctx: JobContext) -> bool:
    return (ctx.spec.instance_type or "") in ("local", "local_gpu")


# -- the job's own settings ---------------------------------------------------------------------

def _enabled_problem(where: str, value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return f"{where} is {value!r}, not a dict like {{\"enabled\": true}}"
    if "enabled" not in value:
        return f"{where} has no \"enabled\": the SDK treats it as disabled, so nothing is launched for it"
    if not isinstance(value["enabled"], bool):
        return (f"{where}.enabled is {value['enabled']!r} ({type(value['enabled']).__name__}), not true/false: "
                f"the SDK tests it for truth, so the string \"false\" enables it")
    return None


def _unknown_keys(where: str, value: Mapping[str, Any], allowed: tuple[str, ...]) -> str | None:
    extra = sorted(str(k) for k in value if k not in allowed)
    if extra:
        return f"{where} has unknown key(s) {', '.join(extra)} (known: {', '.join(allowed)}); the SDK ignores them"
    return None


def distribution_problems(dist: Any) -> list[str]:
    """What is wrong with an estimator distribution dict (empty list: well formed)."""
    if dist is None or dist == {}:
        return []
    if not isinstance(dist, Mapping):
        return [f"distribution is {dist!r} ({type(dist).__name__}), not a dict"]
    out: list[str] = []
    unknown = sorted(str(k) for k in dist if k not in KNOWN_DISTRIBUTIONS + DISTRIBUTION_EXTRAS
                     + OTHER_SDK_DISTRIBUTIONS)
    if unknown:
        out.append(f"distribution has unknown key(s) {', '.join(unknown)}; known: "
                   f"{', '.join(KNOWN_DISTRIBUTIONS)}")
    enabled = []
    for name in KNOWN_DISTRIBUTIONS:
        if name not in dist:
            continue
        value = dist[name]
        if name == "smdistributed":
            if not isinstance(value, Mapping):
                out.append(f"distribution.smdistributed is {value!r}, not a dict like "
                           f"{{\"dataparallel\": {{\"enabled\": true}}}}")
                continue
            msg = _unknown_keys("distribution.smdistributed", value, ALLOWED_KEYS["smdistributed"])
            if msg:
                out.append(msg)
            if "dataparallel" not in value:
                if "modelparallel" in value:
                    out.append("distribution.smdistributed has modelparallel only: model parallelism, "
                               "not data parallel (ddp-doctor checks data-parallel jobs)")
                else:
                    out.append("distribution.smdistributed has no \"dataparallel\" entry")
                continue
            dp = value["dataparallel"]
            msg = _enabled_problem("distribution.smdistributed.dataparallel", dp)
            if msg:
                out.append(msg)
                continue
            msg = _unknown_keys("distribution.smdistributed.dataparallel", dp, ALLOWED_KEYS["smdistributed.dataparallel"])
            if msg:
                out.append(msg)
            mp = value.get("modelparallel")
            if dp["enabled"] and isinstance(mp, Mapping) and mp.get("enabled") is True:
                out.append("distribution.smdistributed enables both dataparallel and modelparallel; "
                           "the SDK accepts one strategy at a time")
            if dp["enabled"]:
                enabled.append(name)
            continue
        msg = _enabled_problem(f"distribution.{name}", value)
        if msg:
            out.append(msg)
            continue
        msg = _unknown_keys(f"distribution.{name}", value, ALLOWED_KEYS[name])
        if msg:
            out.append(msg)
        if name == "mpi" and "processes_per_host" in value:
            ppn = value["processes_per_host"]
            if isinstance(ppn, bool) or not isinstance(ppn, int) or ppn < 1:
                out.append(f"distribution.mpi.processes_per_host is {ppn!r}, not a whole number >= 1")
        if value["enabled"]:
            enabled.append(name)
    if len(enabled) > 1:
        out.append(f"distribution enables {', '.join(enabled)}: exactly one may be enabled")
    return out


@check("DDP902", category="sagemaker_job", severity="error", title="Distribution dict malformed",
       stage=STAGE, timeout=TIMEOUT)
def distribution_malformed(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The estimator's `distribution` is not one of the shapes the SageMaker SDK reads:
    exactly one of {"smdistributed": {"dataparallel": {"enabled": True}}}, {"pytorchddp":
    {"enabled": True}}, {"torch_distributed": {"enabled": True}}, {"mpi": {"enabled": True,
    "processes_per_host": N}}; unknown keys, a missing or non-boolean "enabled", two enabled at once.
    Why: The SDK silently ignores keys it does not know and treats a missing "enabled" as off, so a
    typo launches a single `python train.py` per instance instead of a distributed job.
    Fix: Write the distribution in one of the shapes above, e.g.
    distribution={"torch_distributed": {"enabled": True}}.
    """
    dist = ctx.spec.distribution
    for msg in distribution_problems(dist):
        yield Problem(f"{msg} (distribution={json.dumps(dist, default=str)})",
                      hint=f"Use exactly one of {SHAPES}.", evidence={"distribution": dist})
    if isinstance(dist, Mapping):
        for other in OTHER_SDK_DISTRIBUTIONS:
            if other in dist:
                yield Problem(f"distribution {other} is not PyTorch DDP; ddp-doctor does not check it",
                              severity="info", evidence={"distribution": dist})


@check("DDP903", category="sagemaker_job", severity="error", title="Instance count does not suit the job",
       stage=STAGE, timeout=TIMEOUT)
def instance_count(ctx: JobContext) -> Iterator[Problem]:
    """
    What: instance_count is below 1, or more than 1 instance is asked for with no distribution.
    Why: SageMaker rejects a count below 1; with several instances and no distribution every
    instance runs its own `python train.py`, so the instances train separately (and write over
    each other's model) instead of as one data-parallel job.
    Fix: Set instance_count to 1 or more; for several instances set a distribution, e.g.
    distribution={"torch_distributed": {"enabled": True}}.
    """
    n = ctx.spec.instance_count
    if n is None or n < 1:
        yield Problem(f"instance_count is {n!r}; SageMaker needs at least 1", evidence={"instance_count": n})
        return
    if n > 1 and ctx.spec.distribution_name == "none":
        yield Problem(f"instance_count={n} with no distribution enabled: each of the {n} instances runs "
                      f"`python {ctx.spec.entry_point or 'train.py'}` on its own", severity="warning",
                      evidence={"instance_count": n, "distribution": ctx.spec.distribution})


@check("DDP904", category="sagemaker_job", severity="error", title="Instance type does not suit the distribution",
       stage=STAGE, timeout=TIMEOUT)
def instance_type_suits(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The instance type is missing or malformed, or cannot run the distribution asked for:
    torch_distributed needs a GPU (ml.p*, ml.g*) or Trainium (ml.trn*) type; smdistributed
    dataparallel (and pytorchddp, which SDK v2.221.1+ rewrites to it) runs on ml.p4d.24xlarge and
    ml.p4de.24xlarge (ml.p3.16xlarge and ml.p3dn.24xlarge only with older library versions), and
    its mpirun launch is refused on p5.
    Why: The SDK or the training container rejects the combination, or the job starts on hardware
    the library does not support, after the instances are already paid for.
    Fix: Pick an instance type the distribution supports (e.g. ml.p4d.24xlarge for smdistributed),
    or change the distribution: on ml.p5 use {"torch_distributed": {"enabled": True}}.
    """
    spec = ctx.spec
    itype = spec.instance_type
    name = spec.distribution_name
    if not itype:
        yield Problem("no instance type given", hint="Pass --instance-type, e.g. ml.p4d.24xlarge.")
        return
    if _local_mode(ctx):
        return
    if not re.fullmatch(r"ml\.[a-z0-9-]+\.[a-z0-9-]+", itype):
        yield Problem(f"instance_type={itype!r} is not a SageMaker instance type (ml.<family>.<size>, "
                      f"e.g. ml.p4d.24xlarge)", evidence={"instance_type": itype})
        return
    if name == "torch_distributed" and not (is_gpu_type(itype) or is_trn_type(itype)):
        yield Problem(f"distribution torch_distributed on {itype}: it needs a GPU (ml.p*, ml.g*) or "
                      f"Trainium (ml.trn*) instance", evidence={"instance_type": itype, "distribution": name})
    elif name in ("smdistributed", "pytorchddp"):
        label = ("smdistributed dataparallel" if name == "smdistributed"
                 else "pytorchddp (rewritten to smdistributed dataparallel by SDK v2.221.1+)")
        if itype.startswith("ml.p5"):
            yield Problem(f"{label} on {itype}: the SDK refuses SMDDP's mpirun launch on p5 instances",
                          hint='Use distribution={"torch_distributed": {"enabled": True}} on p5 '
                               '(NCCL, or the smddp backend inside the script where your SMDDP version '
                               'supports p5), or choose ml.p4d.24xlarge / ml.p4de.24xlarge.',
                          evidence={"instance_type": itype, "distribution": name})
        elif itype in SMDDP_OLDER_INSTANCES:
            yield Problem(f"{label} on {itype}: supported only by older smdistributed versions "
                          f"(current: {', '.join(SMDDP_INSTANCES)})", severity="warning",
                          evidence={"instance_type": itype, "distribution": name})
        elif itype not in SMDDP_INSTANCES:
            yield Problem(f"{label} on {itype}: SMDDP supports {', '.join(SMDDP_INSTANCES)} "
                          f"(older versions also {', '.join(SMDDP_OLDER_INSTANCES)})",
                          evidence={"instance_type": itype, "distribution": name})


@check("DDP905", category="sagemaker_job", severity="error", title="Entry point is not a Python script",
       stage=STAGE, timeout=TIMEOUT)
def entry_point_py(ctx: JobContext) -> Iterator[Problem]:
    """
    What: With torch_distributed, the entry point does not end in `.py`.
    Why: The toolkit launches torch_distributed jobs as `torchrun ... <entry_point>`, which runs a
    Python file; the SDK refuses other entry points (shell scripts work only with other launchers).
    Fix: Point entry_point at the Python training script (e.g. train.py) and move shell set-up into
    it or into requirements.txt.
    """
    ep = ctx.spec.entry_point
    if ctx.spec.distribution_name == "torch_distributed" and ep and not ep.endswith(".py"):
        yield Problem(f"entry_point={ep!r} with torch_distributed: torchrun needs a .py script",
                      evidence={"entry_point": ep})


def _version_family(ctx: JobContext) -> str | None:
    name = ctx.spec.distribution_name
    if name == "torch_distributed" and is_trn_type(ctx.spec.instance_type or ""):
        return "torch_distributed_trn"
    return name if name in SUPPORTED_VERSIONS else None


@check("DDP906", category="sagemaker_job", severity="error", title="Framework version not supported by the distribution",
       stage=STAGE, timeout=TIMEOUT)
def framework_version(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The PyTorch framework_version is one the SageMaker SDK lists, but not for this
    distribution (e.g. torch_distributed before 1.13.1), or py_version is not of the form py3N.
    A version in none of the SDK's lists (newer or unknown) is a warning.
    Why: The SDK refuses the combination when the estimator is built, or no container image exists
    for it; a newer version may be fine but has not been checked against this table (a snapshot of
    the SDK's fw_utils.py lists).
    Fix: Choose a framework_version the distribution supports (the message lists them), or a
    distribution that supports your version; upgrade ddp-doctor for newer tables.
    """
    spec = ctx.spec
    if spec.py_version and not re.fullmatch(r"py3\d*", spec.py_version):
        yield Problem(f"py_version={spec.py_version!r} is not of the form py3N (e.g. py311)",
                      evidence={"py_version": spec.py_version})
    version = spec.framework_version
    family = _version_family(ctx)
    if not version or family is None:
        return
    supported = SUPPORTED_VERSIONS[family]
    label = "torch_distributed on Trainium" if family == "torch_distributed_trn" else family
    evidence = {"framework_version": version, "distribution": spec.distribution_name, "supported": list(supported)}
    if version in supported:
        return
    if version in ALL_KNOWN_VERSIONS or _older_than(version, supported):
        yield Problem(f"framework_version={version} is not supported by {label}; supported: "
                      f"{', '.join(supported)}", evidence=evidence)
    else:
        yield Problem(f"framework_version={version} is not in ddp-doctor's table for {label} (newest known: "
                      f"{supported[-1]}); it may be newer than the table", severity="warning",
                      hint=f"Check the SageMaker SDK's supported versions for {label}, or use one of "
                           f"{', '.join(supported[-3:])}.", evidence=evidence)


def _vtuple(v: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in v.split("."))
    except ValueError:
        return None


def _older_than(version: str, supported: tuple[str, ...]) -> bool:
    v = _vtuple(version)
    known = [t for t in (_vtuple(s) for s in supported) if t]
    return bool(v and known and v < min(known))


# -- the network ------------------------------------------------------------------------------

def _has_self_rule(perms: list[dict[str, Any]], gid: str) -> bool:
    return any(str(p.get("IpProtocol")) == "-1"
               and any(pair.get("GroupId") == gid for pair in p.get("UserIdGroupPairs") or [])
               for p in perms or [])


def _open_egress(perms: list[dict[str, Any]]) -> bool:
    return any(str(p.get("IpProtocol")) == "-1"
               and any(r.get("CidrIp") == "0.0.0.0/0" for r in p.get("IpRanges") or [])
               for p in perms or [])


def _describe_rules(perms: list[dict[str, Any]]) -> str:
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
            fixes.append(f"aws ec2 authorize-security-group-ingress --group-id {gid} --protocol -1 --source-group {gid}")
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


def _vpcs(ctx: JobContext) -> tuple[dict[str, str], dict[str, str]] | None:
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
       stage=STAGE, timeout=TIMEOUT)
def free_ips(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The job's subnets have fewer free private IP addresses (AvailableIpAddressCount) than
    the job needs: 2 per instance, 5 per instance on EFA types.
    Why: Each instance takes addresses for its network interfaces (EFA types more); without them
    SageMaker cannot place the instances and the job fails or waits for capacity.
    Fix: Use a larger subnet or add subnets with free addresses (`aws ec2 describe-subnets
    --subnet-ids ... --query 'Subnets[].AvailableIpAddressCount'`), or free addresses in them.
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
       stage=STAGE, timeout=TIMEOUT)
def role_exists(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The execution role (name or ARN) does not exist in the account.
    Why: SageMaker assumes this role to pull the image, read the data and write the output; a
    misspelt or deleted role fails CreateTrainingJob.
    Fix: Create the role (the console's SageMaker execution role, or `aws iam create-role`) or pass
    an existing one: `aws iam list-roles --query 'Roles[].Arn'`.
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
            doc = json.loads(urllib.parse.unquote(doc))
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
       stage=STAGE, timeout=TIMEOUT)
def inputs_have_objects(ctx: JobContext) -> Iterator[Problem]:
    """
    What: An input channel's S3 URI names a bucket that does not exist, or a prefix with no objects.
    Why: SageMaker fails the job when a channel has no data, after the instances start (File mode
    downloads first); a wrong prefix is easy to miss in a notebook.
    Fix: Upload the data (`aws s3 cp --recursive ./data s3://bucket/prefix/`) or correct the URI;
    `aws s3 ls s3://bucket/prefix/` shows what is there.
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
       stage=STAGE, timeout=TIMEOUT)
def output_bucket(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The estimator's output_path names an S3 bucket that does not exist (or is not an S3 URI).
    Why: The job trains to the end and then fails to upload the model: the whole run is lost.
    Fix: Create the bucket in the job's region (`aws s3 mb s3://bucket --region REGION`) or point
    output_path at an existing one (the SDK's default is sagemaker-REGION-ACCOUNT).
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
       stage=STAGE, timeout=TIMEOUT)
def training_quota(ctx: JobContext) -> Iterator[Problem]:
    """
    What: The account's Service Quotas value "<instance type> for training job usage" (service
    code sagemaker) is below instance_count. When the quota cannot be read, a warning says so.
    Why: SageMaker refuses the job with ResourceLimitExceeded; new accounts often have 0 for large
    GPU types, and the quota counts instances of all running jobs.
    Fix: Request an increase: `aws service-quotas request-service-quota-increase --service-code
    sagemaker --quota-code L-... --desired-value N` (the message has the code), or use fewer
    instances or another type.
    """
    itype, n = ctx.spec.instance_type, ctx.spec.instance_count or 0
    if not itype or _local_mode(ctx) or n < 1 or not itype.startswith("ml."):
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


# -- the note -----------------------------------------------------------------------------------

@check("DDP916", category="sagemaker_job", severity="info", title="Effective batch size and learning rate",
       stage=STAGE, timeout=TIMEOUT)
def batch_size_note(ctx: JobContext) -> Iterator[Problem]:
    """
    What: A note on the planned world size (instances x processes per instance) and what it does to
    the effective batch size and the learning rate.
    Why: With DDP every rank takes its own batch, so the optimizer sees per-device batch x world
    size samples per step; a learning rate tuned on one GPU is then usually too small (linear
    scaling rule: lr x world size, with warm-up) or, if kept, changes the training dynamics.
    Fix: Scale the learning rate with the world size (linearly for SGD, often by the square root for
    Adam-type optimizers, with warm-up), or lower the per-device batch to keep the global batch.
    """
    spec = ctx.spec
    if not spec.instance_count or spec.instance_count < 1 or spec.distribution_name in ("invalid",):
        return
    ppn = processes_per_instance(spec, ctx.gpus_per_instance())
    if not ppn:
        yield Problem(f"world size unknown: GPUs per {spec.instance_type} not known to ddp-doctor "
                      f"(instance_count={spec.instance_count})", evidence={"instance_type": spec.instance_type})
        return
    world = ppn * spec.instance_count
    msg = f"world size {world} = {spec.instance_count} instance(s) x {ppn} process(es) per instance"
    evidence: dict[str, Any] = {"world_size": world, "processes_per_instance": ppn}
    if spec.per_device_batch_size:
        glob = spec.per_device_batch_size * world
        msg += f"; effective batch {spec.per_device_batch_size} per device x {world} = {glob} per step"
        evidence["effective_batch_size"] = glob
    else:
        msg += f"; effective batch = per-device batch x {world}"
    if spec.learning_rate:
        linear, sqrt = spec.learning_rate * world, spec.learning_rate * world ** 0.5
        msg += (f"; learning rate {spec.learning_rate:g} (single device) scales to {linear:g} (linear rule) "
                f"or {sqrt:g} (square-root rule)")
        evidence.update(learning_rate_linear=linear, learning_rate_sqrt=sqrt)
    else:
        msg += f"; a learning rate tuned on one device usually needs scaling (x{world} linear, x{world ** 0.5:.3g} sqrt)"
    yield Problem(msg, evidence=evidence)
