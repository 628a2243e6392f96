"""Talking to AWS for the job checks: JobContext (the spec + lazily made boto3 clients) and its answers.

What is inside: JobContext, whose :meth:`JobContext.call` caches every answer (checks share them)
and turns AWS errors into a Reply instead of raising; AwsFailure, the record of a call denied
(reported as DDP900) or not made at all (DDP901); the IAM naming of boto3 calls; require_boto3.

boto3 is an optional extra (`pip install "ddp-doctor[aws]"`): nothing here imports it until a
context first talks to AWS. Credentials, region and endpoints come from boto3's usual chain
(environment, profile, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_<SERVICE>, instance role).
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.sagemaker.spec import JobSpec

AWS_EXTRA_HINT = 'pip install "ddp-doctor[aws]"'


def require_boto3() -> None:
    """Raise ImportError with the install hint when boto3 (the aws extra) is missing."""
    try:
        import boto3  # noqa: F401
    except ImportError:
        raise ImportError(f"the SageMaker job check needs boto3: {AWS_EXTRA_HINT}") from None


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
