"""The S3 sink: upload a finished (redacted) report with bounded retries.

Like every sink it never raises: it returns None on success or the error text, which the caller
prints as a warning. An upload failure must never change an exit code or fail the training.
boto3 is imported only when an upload is asked for (the `aws` extra).

Where the report goes, from an S3 URI:
- ``s3://bucket/prefix/`` (ends with ``/``) or ``s3://bucket``: ``prefix/ddp-doctor-report.json``;
  on SageMaker the job name is put in between (``prefix/<job>/ddp-doctor-report.json``) so jobs
  sharing one URI keep their own reports, next to the job's output when the URI is the
  estimator's output_path;
- ``s3://bucket/path/name.json``: exactly that key.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from ddp_doctor.report.redact import redact_obj, redact_text
from ddp_doctor.report.sinks import report_json
from ddp_doctor.time_limit import call_until

S3_URI_ENV = "DDP_DOCTOR_REPORT_S3_URI"
REPORT_NAME = "ddp-doctor-report.json"
TRIES = 3
BACKOFF_S = 0.5  # 0.5 s, then 1 s between the three tries
CONNECT_TIMEOUT_S = 5.0  # each connection
READ_TIMEOUT_S = 10.0    # each read of the answer
DEADLINE_S = 30.0        # the whole upload, every try together: a trickling endpoint cannot hold it longer
STOPPED = "upload cut short by a stop signal"
# Errors a retry cannot fix: give up at once.
PERMANENT = {"NoSuchBucket", "AccessDenied", "InvalidBucketName", "AllAccessDisabled", "InvalidAccessKeyId",
             "SignatureDoesNotMatch", "AccountProblem", "NoCredentialsError", "NoRegionError",
             "PartialCredentialsError", "ProfileNotFound"}


class S3UriError(ValueError):
    pass


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise S3UriError(f"{uri!r} is not an S3 URI (s3://bucket/prefix/)")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise S3UriError(f"{uri!r} names no bucket")
    return bucket, key


def job_name(env: Mapping[str, str]) -> str | None:
    """The SageMaker training job's name, inside a training container."""
    name = env.get("SAGEMAKER_JOB_NAME") or env.get("TRAINING_JOB_NAME")
    if name:
        return name
    from ddp_doctor.facts.env_values import bounded_json  # SM_TRAINING_ENV as any SM_* JSON: bounded
    try:
        te = bounded_json(env.get("SM_TRAINING_ENV") or "{}")
        return str(te.get("job_name")) if isinstance(te, dict) and te.get("job_name") else None
    except ValueError:
        return None


def report_location(uri: str, env: Mapping[str, str] | None = None, suffix: str = "") -> tuple[str, str]:
    """(bucket, key) the report goes to; `suffix` (e.g. ".rank3") marks a rank's own report."""
    bucket, key = parse_s3_uri(uri)
    if key.endswith(".json") and not key.endswith("/"):
        if suffix:
            key = key[: -len(".json")] + suffix + ".json"
        return bucket, key
    parts = [p for p in key.split("/") if p]
    job = job_name(env or {})
    if job:
        parts.append(job)
    name = REPORT_NAME if not suffix else REPORT_NAME[: -len(".json")] + suffix + ".json"
    return bucket, "/".join(parts + [name])


def _error_code(e: BaseException) -> str:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Code") or "")
    return type(e).__name__


def upload_report(report: dict[str, Any], uri: str, *, env: Mapping[str, str] | None = None,
                  suffix: str = "", session: Any = None, client: Any = None, tries: int = TRIES,
                  backoff: float = BACKOFF_S, sleep: Callable[[float], None] = time.sleep,
                  deadline: float | None = None, stop: Callable[[float], Any] | None = None) -> str | None:
    """Upload the redacted report as JSON to `uri` (see the module doc for the key).
    Returns None on success, else why it failed (after up to `tries` attempts). The whole upload
    (credentials, connection, every try and its backoff) is bounded by `deadline` seconds (None:
    DEADLINE_S, read at the call): an endpoint that never answers, or answers a byte at a time, is
    left behind in its thread (botocore's read timeout bounds each read, not a trickling answer).
    `stop(s)` waits up to s seconds for a stop signal and returns it: one that comes ends the wait at
    once (STOPPED in the text)."""
    deadline = DEADLINE_S if deadline is None else deadline
    try:
        bucket, key = report_location(uri, env, suffix)
    except S3UriError as e:
        return f"could not upload the report: {e}"
    where = f"s3://{bucket}/{key}"

    def attempts() -> str | None:
        nonlocal client
        try:
            body = (report_json(redact_obj(report)) + "\n").encode("utf-8")
            if client is None:
                import boto3
                from botocore.config import Config
                cfg = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                             retries={"total_max_attempts": 1})
                client = (session or boto3.Session()).client("s3", config=cfg)
        except ImportError:
            return 'could not upload the report: boto3 is not installed (pip install "ddp-doctor[aws]")'
        except Exception as e:  # noqa: BLE001 - a sink never raises
            return f"could not upload the report to {where}: {type(e).__name__}: {e}"
        last = ""
        attempt = 0
        for attempt in range(1, max(1, tries) + 1):
            try:
                client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
                return None
            except Exception as e:  # noqa: BLE001 - botocore raises many kinds; _error_code says which to retry
                code = _error_code(e)
                last = f"{type(e).__name__}: {e}"
                if code in PERMANENT or attempt >= tries:
                    break
                sleep(backoff * (2 ** (attempt - 1)))
        return f"could not upload the report to {where} (after {attempt} {'try' if attempt == 1 else 'tries'}): {last}"

    got, stopped = call_until(attempts, deadline, stop=stop, name="ddp-doctor-s3-upload")
    if stopped:
        return redact_text(f"{STOPPED}: the report's upload to {where} was abandoned")
    if not got.finished:
        return redact_text(f"could not upload the report to {where}: no answer within {deadline:g} s "
                           f"(the upload's whole deadline; the endpoint is slow or unreachable)")
    if got.error is not None:  # attempts() catches what botocore raises; anything else is said, never raised
        return redact_text(f"could not upload the report to {where}: {type(got.error).__name__}: {got.error}")
    return redact_text(got.value) if got.value else None
