"""A fleet's history in S3 (issue 22): SageMaker's and other clouds' instances are new for every
job, so their own disk forgets; `--history s3://bucket/prefix` keeps the same records as the local
file (store.py) in a bucket, one small object per host per run:

    PREFIX/HOST/YYYY/MM/DD/<microseconds>-<random>.json   a JSON list of the host's records

Keys sort in time order within a host, so the newest records are the last keys listed. Reading
lists a host's keys (paged, bounded) and reads the newest `limit` objects. boto3 is imported only
when such a history is named (the `aws` extra); every call is bounded (5 s connect, 15 s read,
TRIES tries) and nothing raises to a writer: a failure is one line of text.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ddp_doctor.history.store import RunRecord, record_from_dict
from ddp_doctor.report.redact import redact_text
from ddp_doctor.report.s3 import PERMANENT, S3UriError, parse_s3_uri

TRIES = 3
MAX_PAGES = 50  # listing pages (1,000 keys each) per read
MAX_READ = 200  # objects read per call, the newest


def _code(e: BaseException) -> str:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Code") or "")
    return type(e).__name__


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "_"


class S3History:
    def __init__(self, uri: str, *, client: Any = None, session: Any = None) -> None:
        self.uri = uri
        self.bucket, prefix = parse_s3_uri(uri)
        self.prefix = prefix.strip("/")
        self._client, self._session = client, session

    @property
    def path(self) -> str:
        return self.uri

    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config
            cfg = Config(connect_timeout=5, read_timeout=15, retries={"total_max_attempts": 1})
            self._client = (self._session or boto3.Session()).client("s3", config=cfg)
        return self._client

    def _key(self, host: str, t: float) -> str:
        day = time.strftime("%Y/%m/%d", time.gmtime(t))
        name = f"{int(t * 1e6):020d}-{uuid.uuid4().hex[:8]}.json"
        return "/".join(p for p in (self.prefix, _safe(host), day, name) if p)

    def add(self, records: list[RunRecord]) -> str | None:
        """One object per host; None when written, else why not (never raises)."""
        by_host: dict[str, list[RunRecord]] = {}
        for r in records:
            by_host.setdefault(r.host, []).append(r)
        try:
            client = self.client()
        except ImportError:
            return f"the history {self.uri} needs boto3 (pip install \"ddp-doctor[aws]\"); nothing was recorded"
        except Exception as e:  # noqa: BLE001 - never raises to a writer
            return redact_text(f"the history {self.uri} could not be written: {type(e).__name__}: {e}")
        for host, recs in by_host.items():
            key = self._key(host, max(r.time for r in recs))
            body = json.dumps([r.to_dict() for r in recs], sort_keys=True).encode("utf-8")
            err = self._put(client, key, body)
            if err:
                return err
        return None

    def _put(self, client: Any, key: str, body: bytes) -> str | None:
        last = ""
        for attempt in range(1, TRIES + 1):
            try:
                client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")
                return None
            except Exception as e:  # noqa: BLE001 - botocore raises many kinds
                last = f"{type(e).__name__}: {e}"
                if _code(e) in PERMANENT or attempt == TRIES:
                    break
                time.sleep(0.25 * 2 ** (attempt - 1))
        return redact_text(f"the history s3://{self.bucket}/{key} could not be written: {last}")

    def records(self, *, host: str | None = None, instance_type: str | None = None,
                limit: int = 1000) -> list[RunRecord]:
        """The newest records (of a host, of an instance type), oldest first; [] when none or
        unreadable."""
        prefix = "/".join(p for p in (self.prefix, _safe(host) if host else "") if p)
        prefix = prefix + "/" if prefix else ""
        try:
            client = self.client()
            keys: list[str] = []
            token = None
            for _ in range(MAX_PAGES):
                kw = {"Bucket": self.bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
                page = client.list_objects_v2(**kw)
                keys += [o["Key"] for o in page.get("Contents") or [] if o.get("Key", "").endswith(".json")]
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    break
            # across hosts the keys sort by host first: order by the time in the name
            keys.sort(key=lambda k: k.rsplit("/", 1)[-1])
            out: list[RunRecord] = []
            for key in keys[-min(MAX_READ, max(1, limit)):]:
                body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read(1 << 20)
                for d in json.loads(body):
                    rec = record_from_dict(d)
                    if rec is not None and (not host or rec.host == host) and \
                            (not instance_type or rec.instance_type == instance_type):
                        out.append(rec)
        except (ImportError, S3UriError, ValueError):
            return []
        except Exception:  # noqa: BLE001 - a history that cannot be read compares nothing
            return []
        out.sort(key=lambda r: r.time)
        return out[-limit:]

    def count(self) -> int:
        return len(self.records(limit=10 ** 9))
