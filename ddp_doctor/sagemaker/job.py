"""Check a SageMaker training job's settings from the client, before `estimator.fit()`.

    JobSpec (CLI flags, a JSON/YAML file, or a dict from a notebook)
        -> JobContext (the spec + lazily created boto3 clients, every AWS answer cached)
        -> checks in stage "job" (ddp_doctor/checks/sagemaker_job.py, DDP900-DDP999)
        -> findings -> report (same schema as preflight) -> text / --json / --report / S3

boto3 is an optional extra (`pip install "ddp-doctor[aws]"`): nothing here imports it until a
context first talks to AWS. Credentials, region and endpoints come from boto3's usual chain
(environment, profile, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_<SERVICE>, instance role).

An AWS call that fails for want of permission, credentials or a reachable endpoint never raises:
:meth:`JobContext.call` records it and the report carries it as DDP900 (a permission is missing,
named as IAM writes it, e.g. ``ec2:DescribeSecurityGroups``) or DDP901 (AWS could not be asked).

Python API (notebooks)::

    from ddp_doctor.sagemaker.job import check_job
    report = check_job({"instance_type": "ml.p4d.24xlarge", "instance_count": 2,
                        "distribution": {"torch_distributed": {"enabled": True}}, ...})
    report["status"]  # "pass" | "warn" | "fail"
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping

AWS_EXTRA_HINT = 'pip install "ddp-doctor[aws]"'
STAGE = "job"

# -- the instances ---------------------------------------------------------------------------
# GPUs per instance (EC2 user guide; DOMAIN.md instance table). Types not listed are looked up
# with ec2:DescribeInstanceTypes; trn types count NeuronCores (what torchrun starts one rank per).
GPUS_PER_INSTANCE: dict[str, int] = {
    "ml.p3.2xlarge": 1, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8,
    "ml.p5en.48xlarge": 8,
    "ml.g4dn.xlarge": 1, "ml.g4dn.2xlarge": 1, "ml.g4dn.4xlarge": 1, "ml.g4dn.8xlarge": 1,
    "ml.g4dn.16xlarge": 1, "ml.g4dn.12xlarge": 4,
    "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1, "ml.g5.16xlarge": 1,
    "ml.g5.12xlarge": 4, "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8,
    "ml.trn1.2xlarge": 2, "ml.trn1.32xlarge": 32, "ml.trn1n.32xlarge": 32,
}


def is_gpu_type(instance_type: str) -> bool:
    return bool(re.match(r"^ml\.(p|g)\d", instance_type or ""))


def is_trn_type(instance_type: str) -> bool:
    return bool(re.match(r"^ml\.trn\d", instance_type or ""))


# -- the spec ----------------------------------------------------------------------------------

class SpecError(ValueError):
    """The job description itself cannot be used (a usage error: exit code 2)."""


@dataclass(frozen=True)
class JobSpec:
    """What `estimator.fit()` would be asked to run. Field names follow the SageMaker SDK's
    estimator arguments (security_group_ids, subnets, entry_point, ...)."""

    instance_type: str | None = None
    instance_count: int = 1
    distribution: dict[str, Any] | None = None
    framework_version: str | None = None
    py_version: str | None = None
    entry_point: str | None = None
    role: str | None = None
    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()          # S3 URIs (a fit() channel dict is accepted too)
    output_path: str | None = None
    region: str | None = None
    profile: str | None = None
    per_device_batch_size: int | None = None
    learning_rate: float | None = None    # the single-device learning rate, for the scaling note

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        if not isinstance(data, Mapping):
            raise SpecError(f"a job spec is a mapping of estimator settings, not {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        aliases = {"input": "inputs", "security_groups": "security_group_ids", "distribution_config": "distribution"}
        values: dict[str, Any] = {}
        unknown = []
        for key, value in data.items():
            name = aliases.get(str(key), str(key)).replace("-", "_")
            if name not in names:
                unknown.append(str(key))
                continue
            values[name] = value
        if unknown:
            raise SpecError(f"unknown job setting(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(sorted(names))}")
        return cls(**_coerce(values))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in fields(self) if f.name != "profile"}

    def merged(self, overrides: Mapping[str, Any]) -> "JobSpec":
        """This spec with the given (non-None) settings replacing its own (CLI flags over --config)."""
        base = self.to_dict()
        base["profile"] = self.profile
        base.update({k: v for k, v in overrides.items() if v is not None})
        return JobSpec.from_dict(base)

    @property
    def distribution_name(self) -> str:
        """smdistributed | pytorchddp | torch_distributed | mpi | none | invalid (see DDP902)."""
        return distribution_name(self.distribution)

    @property
    def efa(self) -> bool:
        from ddp_doctor.checks.sagemaker_env import EFA_INSTANCES
        return (self.instance_type or "") in EFA_INSTANCES

    @property
    def gpus_per_instance(self) -> int | None:
        return GPUS_PER_INSTANCE.get(self.instance_type or "")


def _as_list(name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    if isinstance(value, Mapping):  # fit(inputs={"train": "s3://..."}) or channel -> TrainingInput dict
        out = []
        for v in value.values():
            uri = v.get("s3_data") or v.get("S3Uri") if isinstance(v, Mapping) else v
            out.extend(_as_list(name, uri))
        return tuple(out)
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(_as_list(name, v))
        return tuple(out)
    raise SpecError(f"{name} must be a string or a list of strings, not {value!r}")


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for name in ("subnets", "security_group_ids", "inputs"):
        if name in out:
            out[name] = _as_list(name, out[name])
    if "distribution" in out and isinstance(out["distribution"], str):
        try:
            out["distribution"] = json.loads(out["distribution"]) if out["distribution"].strip() else None
        except ValueError as e:
            raise SpecError(f"distribution is not valid JSON: {e}") from None
    for name in ("instance_count", "per_device_batch_size"):
        if out.get(name) is not None:
            try:
                out[name] = int(out[name])
            except (TypeError, ValueError):
                raise SpecError(f"{name} must be a whole number, not {out[name]!r}") from None
    if out.get("learning_rate") is not None:
        try:
            out["learning_rate"] = float(out["learning_rate"])
        except (TypeError, ValueError):
            raise SpecError(f"learning_rate must be a number, not {out['learning_rate']!r}") from None
    for name in ("instance_type", "framework_version", "py_version", "entry_point", "role",
                 "output_path", "region", "profile"):
        if out.get(name) is not None and not isinstance(out[name], str):
            out[name] = str(out[name])
    return out


KNOWN_DISTRIBUTIONS = ("smdistributed", "pytorchddp", "torch_distributed", "mpi")
# Keys the SDK accepts beside the distribution itself.
DISTRIBUTION_EXTRAS = ("instance_groups",)


def _enabled(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("enabled") is True


def distribution_name(dist: Any) -> str:
    if not dist:
        return "none"
    if not isinstance(dist, Mapping):
        return "invalid"
    on = [k for k in KNOWN_DISTRIBUTIONS
          if (k == "smdistributed" and _enabled((dist.get(k) or {}).get("dataparallel")
                                                if isinstance(dist.get(k), Mapping) else None))
          or (k != "smdistributed" and _enabled(dist.get(k)))]
    if len(on) == 1:
        return on[0]
    return "none" if not on and not any(k not in DISTRIBUTION_EXTRAS for k in dist) else "invalid"


def load_spec_file(path: str) -> JobSpec:
    """A JobSpec from a JSON or YAML file (YAML needs PyYAML)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SpecError(f"cannot read --config {path}: {e.strerror or e}") from None
    if path.lower().endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise SpecError(f"--config {path} is YAML, which needs PyYAML (`pip install pyyaml`); "
                            f"or write the same settings as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SpecError(f"--config {path} is not valid YAML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise SpecError(f"--config {path} is not valid JSON: {e}") from None
    return JobSpec.from_dict(data or {})


# -- talking to AWS ----------------------------------------------------------------------------

# How IAM names each service's actions (the prefix) when it differs from boto3's client name.
IAM_PREFIX = {"service-quotas": "servicequotas"}
# boto3 operations whose IAM action is not the API name.
IAM_ACTION = {("s3", "HeadBucket"): "s3:ListBucket", ("s3", "ListObjectsV2"): "s3:ListBucket",
              ("s3", "HeadObject"): "s3:GetObject"}
DENIED_CODES = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess",
                "AuthorizationError", "Forbidden", "403"}
CREDENTIAL_CODES = {"InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
                    "AuthFailure", "UnrecognizedClientException", "InvalidAccessKeyId", "InvalidToken",
                    "RequestExpired"}
NOT_FOUND_CODES = {"NoSuchEntity", "NoSuchBucket", "NoSuchKey", "404", "NotFound",
                   "InvalidGroup.NotFound", "InvalidSubnetID.NotFound", "NoSuchResourceException",
                   "ValidationError", "InvalidParameterValue"}


MESSAGE_LIMIT = 300  # characters of an AWS error message quoted in a finding


def _one_line(text: str) -> str:
    """An AWS error message on one line, without markup (a proxy may answer with an HTML page)."""
    text = " ".join(re.sub(r"<[^>]{0,200}>", " ", text).split())
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + "..."


@dataclass
class Reply:
    """An AWS answer: `data` when ok, else the error code and message. `recorded` means the
    failure was about access (permission, credentials, endpoint) and is reported as DDP900/DDP901,
    so the check that asked says nothing more about it."""

    ok: bool
    data: dict[str, Any] = field(default_factory=dict)
    code: str | None = None
    message: str = ""
    recorded: bool = False

    @property
    def not_found(self) -> bool:
        return not self.ok and not self.recorded and (self.code or "") in NOT_FOUND_CODES


@dataclass
class AwsFailure:
    kind: str            # "denied" | "unreachable"
    service: str
    operation: str       # the API name, e.g. DescribeSecurityGroups
    permission: str      # e.g. ec2:DescribeSecurityGroups
    code: str
    message: str
    checks: list[str] = field(default_factory=list)


class JobContext:
    """The spec plus boto3 clients made on first use from one session. Every call goes through
    :meth:`call`, which caches answers (checks share them) and turns AWS errors into records."""

    def __init__(self, spec: JobSpec, session: Any = None, *, connect_timeout: float = 5.0,
                 read_timeout: float = 15.0) -> None:
        self.spec = spec
        self._session = session
        self._clients: dict[str, Any] = {}
        self._cache: dict[tuple[str, str, str], Reply] = {}
        self._lock = threading.RLock()
        self._timeouts = (connect_timeout, read_timeout)
        self.failures: dict[tuple[str, str], AwsFailure] = {}
        self.current_check: str | None = None

    @property
    def session(self) -> Any:
        with self._lock:
            if self._session is None:
                import boto3
                self._session = boto3.Session(profile_name=self.spec.profile, region_name=self.spec.region)
            return self._session

    @property
    def region(self) -> str | None:
        try:
            return self.spec.region or self.session.region_name
        except Exception:  # noqa: BLE001 - a bad profile is reported through call()
            return self.spec.region

    def client(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                from botocore.config import Config
                cfg = Config(connect_timeout=self._timeouts[0], read_timeout=self._timeouts[1],
                             retries={"total_max_attempts": 2, "mode": "standard"})
                self._clients[service] = self.session.client(service, region_name=self.spec.region or None,
                                                             config=cfg)
            return self._clients[service]

    def call(self, service: str, method: str, **kwargs: Any) -> Reply:
        """client(service).method(**kwargs), cached; AWS errors come back in the Reply."""
        key = (service, method, json.dumps(kwargs, sort_keys=True, default=str))
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            if cached.recorded:
                self._note_check(service, method)
            return cached
        reply = self._call(service, method, kwargs)
        with self._lock:
            self._cache[key] = reply
        return reply

    def _api_name(self, service: str, method: str) -> str:
        """The API's own name (DescribeSecurityGroups), from botocore's model when the client exists."""
        client = self._clients.get(service)
        mapping = getattr(getattr(client, "meta", None), "method_to_api_mapping", None) or {}
        return mapping.get(method) or "".join(p[:1].upper() + p[1:] for p in method.split("_"))

    def _permission(self, service: str, api: str) -> str:
        return IAM_ACTION.get((service, api), f"{IAM_PREFIX.get(service, service)}:{api}")

    def _note_check(self, service: str, method: str) -> None:
        f = self.failures.get((service, self._api_name(service, method)))
        if f is not None and self.current_check and self.current_check not in f.checks:
            f.checks.append(self.current_check)

    def _record(self, kind: str, service: str, api: str, code: str, message: str) -> Reply:
        with self._lock:
            f = self.failures.setdefault((service, api), AwsFailure(
                kind=kind, service=service, operation=api, permission=self._permission(service, api),
                code=code, message=message))
            if self.current_check and self.current_check not in f.checks:
                f.checks.append(self.current_check)
        return Reply(ok=False, code=code, message=message, recorded=True)

    def _call(self, service: str, method: str, kwargs: dict[str, Any]) -> Reply:
        import botocore.exceptions as bx
        api = self._api_name(service, method)
        try:
            client = self.client(service)
            api = self._api_name(service, method)
            result = getattr(client, method)(**kwargs)
            return Reply(ok=True, data=dict(result or {}))
        except bx.ClientError as e:
            err = e.response.get("Error", {}) if isinstance(e.response, dict) else {}
            code = str(err.get("Code") or "")
            message = _one_line(str(err.get("Message") or e))
            status = (e.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in DENIED_CODES or (status == 403 and code not in CREDENTIAL_CODES):
                return self._record("denied", service, api, code or "403", message)
            if code in CREDENTIAL_CODES:
                return self._record("unreachable", service, api, code, message)
            # Not found, or an answer the asking check explains better itself (e.g. Service
            # Quotas not offered for this service or endpoint): the check decides.
            return Reply(ok=False, code=code or str(status), message=message)
        except (bx.NoCredentialsError, bx.PartialCredentialsError, bx.NoRegionError,
                bx.ProfileNotFound, bx.EndpointConnectionError, bx.ConnectTimeoutError,
                bx.ReadTimeoutError) as e:
            return self._record("unreachable", service, api, type(e).__name__, _one_line(str(e)))
        except bx.BotoCoreError as e:
            return Reply(ok=False, code=type(e).__name__, message=_one_line(str(e)))

    def caller_arn(self) -> str | None:
        """Who the calls were made as (sts:GetCallerIdentity never needs a permission)."""
        r = self.call("sts", "get_caller_identity")
        return r.data.get("Arn") if r.ok else None

    # ---- shared lookups (cached through call)
    def security_groups(self) -> dict[str, dict[str, Any]] | None:
        ids = list(self.spec.security_group_ids)
        if not ids:
            return {}
        r = self.call("ec2", "describe_security_groups", Filters=[{"Name": "group-id", "Values": ids}])
        if not r.ok:
            return None
        return {g["GroupId"]: g for g in r.data.get("SecurityGroups", [])}

    def subnets(self) -> dict[str, dict[str, Any]] | None:
        ids = list(self.spec.subnets)
        if not ids:
            return {}
        r = self.call("ec2", "describe_subnets", Filters=[{"Name": "subnet-id", "Values": ids}])
        if not r.ok:
            return None
        return {s["SubnetId"]: s for s in r.data.get("Subnets", [])}

    def gpus_per_instance(self) -> int | None:
        """From the table, else ec2:DescribeInstanceTypes (quietly: it only feeds the world block)."""
        known = self.spec.gpus_per_instance
        itype = self.spec.instance_type or ""
        if known is not None or not itype.startswith("ml."):
            return known
        r = self.call("ec2", "describe_instance_types", InstanceTypes=[itype[3:]])
        if not r.ok:
            with self._lock:  # an informational lookup: its failure is not worth a finding
                self.failures.pop(("ec2", "DescribeInstanceTypes"), None)
            return None
        types = r.data.get("InstanceTypes") or []
        gpus = (types[0].get("GpuInfo") or {}).get("Gpus") if types else None
        return sum(int(g.get("Count", 0)) for g in gpus) if gpus else (0 if types else None)


# -- running the checks -------------------------------------------------------------------------

def processes_per_instance(spec: JobSpec, gpus: int | None) -> int | None:
    dist = spec.distribution or {}
    mpi = dist.get("mpi") if isinstance(dist, Mapping) else None
    if spec.distribution_name == "mpi" and isinstance(mpi, Mapping) and isinstance(mpi.get("processes_per_host"), int):
        return int(mpi["processes_per_host"])
    if spec.distribution_name == "none":
        return 1
    return gpus if gpus else (1 if gpus == 0 else None)


def world_of_job(spec: JobSpec, gpus: int | None, region: str | None = None) -> dict[str, Any]:
    """The report's world block for the planned job."""
    ppn = processes_per_instance(spec, gpus)
    name = spec.distribution_name
    launcher = {"torch_distributed": "torchrun", "smdistributed": "mpirun", "pytorchddp": "mpirun",
                "mpi": "mpirun", "none": "python"}.get(name, "unknown")
    backend = ("smddp" if name in ("smdistributed", "pytorchddp")
               else "nccl" if is_gpu_type(spec.instance_type or "") else None)
    count = spec.instance_count if spec.instance_count and spec.instance_count > 0 else None
    return {
        "launcher": launcher, "backend": backend,
        "world_size": ppn * count if ppn and count else None,
        "nnodes": count, "nproc_per_node": ppn, "master_addr": None, "master_port": None,
        "platform": "sagemaker", "planned": True, "instance_type": spec.instance_type,
        "instance_count": spec.instance_count, "distribution": name,
        "gpus_per_instance": gpus, "region": region or spec.region,
    }


def failure_findings(ctx: JobContext) -> list[Any]:
    """DDP900 / DDP901 findings for the AWS calls that could not be made."""
    from ddp_doctor.checks import internal as events
    from ddp_doctor.checks import sagemaker_job as jc
    out = []
    failures = sorted(ctx.failures.values(), key=lambda f: (f.kind != "unreachable", f.permission))
    who = None
    if any(f.kind == "denied" for f in failures):
        who = ctx.caller_arn()
    for f in failures:
        for_checks = f" (needed by {', '.join(sorted(f.checks))})" if f.checks else ""
        evidence = {"permission": f.permission, "operation": f.operation, "service": f.service,
                    "error_code": f.code, "checks": sorted(f.checks)}
        if f.kind == "denied":
            msg = (f"{f.operation} was denied ({f.code}): {who or 'the caller'} lacks {f.permission}"
                   f"{for_checks}; those checks were not done. AWS said: {f.message}")
            hint = (f"Grant {f.permission} to {who or 'the identity you run ddp-doctor as'} (an IAM policy "
                    f'statement {{"Effect": "Allow", "Action": "{f.permission}", "Resource": "*"}}), or '
                    f"verify what {', '.join(sorted(f.checks)) or 'the check'} covers by hand.")
            out.append(events.event_finding(jc.PERMISSION_MISSING, msg, rank=None, hint=hint, evidence=evidence))
        elif f.kind == "unreachable":
            msg = (f"{f.operation} ({f.permission}) could not be called: {f.code}: {f.message}{for_checks}; "
                   f"those checks were not done")
            out.append(events.event_finding(jc.AWS_UNREACHABLE, msg, rank=None, evidence=evidence))
        else:
            msg = (f"{f.operation} ({f.permission}) could not be called: {f.code}: {f.message}{for_checks}; "
                   f"those checks were not done")
            out.append(events.event_finding(jc.AWS_UNREACHABLE, msg, rank=None, evidence=evidence))
    return out


def run_checks(ctx: JobContext, *, select: list[str] | None = None, skip: list[str] | None = None) -> dict[str, Any]:
    """Run every job check on `ctx` and build the report."""
    from ddp_doctor import registry, runner
    from ddp_doctor.report import build as reportlib
    findings = []
    for entry in registry.checks_for(STAGE, select, skip):
        ctx.current_check = entry.id
        findings.extend(runner.run_entry(entry, (ctx,), rank=None))
    ctx.current_check = None
    findings.extend(failure_findings(ctx))
    gpus = None
    if not any(f.kind == "unreachable" for f in ctx.failures.values()):
        gpus = ctx.gpus_per_instance()
    else:
        gpus = ctx.spec.gpus_per_instance
    return reportlib.build_report(world=world_of_job(ctx.spec, gpus, ctx.region), ranks=[], findings=findings)


def check_job(spec: JobSpec | Mapping[str, Any], session: Any = None, *, select: Iterable[str] | None = None,
              skip: Iterable[str] | None = None) -> dict[str, Any]:
    """Check a planned SageMaker training job; returns the report dict (schema_version 1).

    `spec` is a :class:`JobSpec` or a dict of estimator settings (instance_type, instance_count,
    distribution, framework_version, py_version, entry_point, role, subnets, security_group_ids,
    inputs, output_path, region, per_device_batch_size, learning_rate). `session` is a
    boto3.Session; by default one is made from boto3's usual chain. Raises SpecError for a spec
    that cannot be read and ImportError (with the install hint) without boto3; AWS errors become
    findings."""
    require_boto3()
    job = spec if isinstance(spec, JobSpec) else JobSpec.from_dict(spec)
    return run_checks(JobContext(job, session), select=list(select or []), skip=list(skip or []))


def require_boto3() -> None:
    try:
        import boto3  # noqa: F401
    except ImportError:
        raise ImportError(f"the SageMaker job check needs boto3: {AWS_EXTRA_HINT}") from None


# -- command line ----------------------------------------------------------------------------

def add_parser(p: Any) -> None:
    p.add_argument("--config", metavar="FILE", help="job settings as JSON (or YAML with PyYAML), keyed "
                                                     "like the estimator's arguments; flags override it")
    p.add_argument("--instance-type", metavar="TYPE", help="e.g. ml.p4d.24xlarge")
    p.add_argument("--instance-count", metavar="N", help="number of instances (default 1)")
    p.add_argument("--distribution", metavar="JSON",
                   help='the estimator\'s distribution dict, e.g. \'{"torch_distributed": {"enabled": true}}\'')
    p.add_argument("--framework-version", metavar="V", help="PyTorch framework version, e.g. 2.3.0")
    p.add_argument("--py-version", metavar="PY", help="e.g. py311")
    p.add_argument("--entry-point", metavar="SCRIPT", help="the training script, e.g. train.py")
    p.add_argument("--role", metavar="NAME_OR_ARN", help="the execution role")
    p.add_argument("--subnets", action="append", metavar="IDS", help="subnet IDs, comma-separated or repeated")
    p.add_argument("--security-group-ids", action="append", metavar="IDS",
                   help="security group IDs, comma-separated or repeated")
    p.add_argument("--input", action="append", metavar="S3_URI", help="an input channel's S3 URI (repeatable)")
    p.add_argument("--output-path", metavar="S3_URI", help="the estimator's output_path")
    p.add_argument("--region", metavar="REGION", help="AWS region (default: boto3's)")
    p.add_argument("--profile", metavar="NAME", help="AWS profile (default: boto3's)")
    p.add_argument("--per-device-batch-size", metavar="N", help="for the effective batch size note")
    p.add_argument("--learning-rate", metavar="LR", help="the single-device learning rate, for the scaling note")
    p.add_argument("--report", metavar="PATH", help="also write the JSON report here "
                                                    "(default: $DDP_DOCTOR_REPORT when set)")
    p.add_argument("--report-s3-uri", metavar="S3_URI", help="also upload the JSON report there")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--select", action="append", metavar="X", help="run only these checks (IDs, prefixes, categories)")
    p.add_argument("--skip", action="append", metavar="X", help="skip these checks")
    p.add_argument("--verbose", "-v", action="store_true", help="show every info finding and hint")


def spec_from_args(args: Any) -> JobSpec:
    base = load_spec_file(args.config) if args.config else JobSpec()
    flags = {"instance_type": args.instance_type, "instance_count": args.instance_count,
             "distribution": args.distribution, "framework_version": args.framework_version,
             "py_version": args.py_version, "entry_point": args.entry_point, "role": args.role,
             "subnets": args.subnets, "security_group_ids": args.security_group_ids,
             "inputs": args.input, "output_path": args.output_path, "region": args.region,
             "profile": args.profile, "per_device_batch_size": args.per_device_batch_size,
             "learning_rate": args.learning_rate}
    return base.merged(flags)


def command(args: Any) -> int:
    """`ddp-doctor sagemaker-check`: 0 no errors, 3 errors found, 2 usage error, 1 failed."""
    import sys

    from ddp_doctor import registry
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.report import sinks
    from ddp_doctor.report.publish import Output, show, upload_report, warn
    try:
        require_boto3()
    except ImportError as e:
        sys.stderr.write(f"ddp-doctor sagemaker-check: error: {e}\n")
        return reportlib.EXIT_INTERNAL
    try:
        spec = spec_from_args(args)
    except SpecError as e:
        sys.stderr.write(f"ddp-doctor sagemaker-check: error: {e}\n")
        return reportlib.EXIT_USAGE
    select, skip = registry.parse_selectors(args.select), registry.parse_selectors(args.skip)
    bad = registry.unknown_selectors(select + skip)
    if bad:
        sys.stderr.write(f"ddp-doctor sagemaker-check: error: --select/--skip: {', '.join(bad)} match no "
                         f"check ID, ID prefix or category (see `ddp-doctor list-checks`)\n")
        return reportlib.EXIT_USAGE
    rep = run_checks(JobContext(spec), select=select, skip=skip)
    path = args.report or os.environ.get("DDP_DOCTOR_REPORT")
    out = Output(report_path=path, json=args.json, verbose=args.verbose, report_s3_uri=args.report_s3_uri)
    if path:
        err = sinks.write_report_file(rep, path)
        if err:
            warn(err)
            path = None
    show(rep, out, path)
    if args.report_s3_uri:
        upload_report(rep, out, os.environ)
    return reportlib.exit_code(rep)
