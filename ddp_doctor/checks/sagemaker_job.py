"""Client-side checks of a planned SageMaker job's own settings (DDP900-DDP906, DDP916, stage "job").

What is inside: the DDP900 / DDP901 declarations (AWS calls that were denied or could not be made,
raised by ddp_doctor.job_check), the distribution dict, instance count and type, entry point,
framework / py versions, and the effective batch size note. The checks against the AWS account
(network, IAM, S3, quota: DDP907-DDP915) are in ddp_doctor.checks.sagemaker_account.

Each check takes a :class:`ddp_doctor.sagemaker.aws.JobContext` (the spec plus lazily created
boto3 clients) and yields problems, like every other check. AWS calls go through ``ctx.call``,
which caches answers and records calls that were denied or could not be made: those become
DDP900 / DDP901, so a check that could not ask AWS says nothing.

Facts follow the SageMaker Python SDK (distribution shapes, SMDDP instance list, framework
versions); see docs/facts.md, "Client side".
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterator, Mapping

from ddp_doctor.facts.instances import SMDDP_INSTANCES, SMDDP_OLDER_INSTANCES, is_gpu_type, is_trn_type
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check, declare
from ddp_doctor.sagemaker.aws import JobContext
from ddp_doctor.sagemaker.spec import DISTRIBUTION_EXTRAS, KNOWN_DISTRIBUTIONS, processes_per_instance

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
    """, cause_class="network")

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


def local_mode(ctx: JobContext) -> bool:
    """SageMaker local mode ("local", "local_gpu"): no instance type or quota to check."""
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
            msg = _unknown_keys("distribution.smdistributed.dataparallel", dp,
                                ALLOWED_KEYS["smdistributed.dataparallel"])
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
       stage=STAGE, timeout=TIMEOUT, severities=("info",))
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
    Severity: error for a malformed distribution; info for a distribution that is not PyTorch DDP,
    which ddp-doctor does not check.
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
       stage=STAGE, timeout=TIMEOUT, severities=("warning",))
def instance_count(ctx: JobContext) -> Iterator[Problem]:
    """
    What: instance_count is below 1, or more than 1 instance is asked for with no distribution.
    Why: SageMaker rejects a count below 1; with several instances and no distribution every
    instance runs its own `python train.py`, so the instances train separately (and write over
    each other's model) instead of as one data-parallel job.
    Fix: Set instance_count to 1 or more; for several instances set a distribution, e.g.
    distribution={"torch_distributed": {"enabled": True}}.
    Severity: error for an instance count below 1; a warning for several instances with no
    distribution (each trains its own copy, which may be intended).
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
       stage=STAGE, timeout=TIMEOUT, severities=("warning",))
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
    Severity: error for an instance type the distribution does not run on; a warning for one
    supported only by older smdistributed versions.
    """
    spec = ctx.spec
    itype = spec.instance_type
    name = spec.distribution_name
    if not itype:
        yield Problem("no instance type given", hint="Pass --instance-type, e.g. ml.p4d.24xlarge.")
        return
    if local_mode(ctx):
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


@check("DDP906", category="sagemaker_job", severity="error",
       title="Framework version not supported by the distribution", stage=STAGE, timeout=TIMEOUT,
       severities=("warning",))
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
    Severity: error for a version known to be unsupported; a warning for a version not in ddp-
    doctor's table (perhaps newer than it).
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
        msg += (f"; a learning rate tuned on one device usually needs scaling (x{world} linear, "
                f"x{world ** 0.5:.3g} sqrt)")
    yield Problem(msg, evidence=evidence)
