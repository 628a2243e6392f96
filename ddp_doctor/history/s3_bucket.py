"""A fleet's history in S3: SageMaker's and other clouds' instances are new for every job, so
their own disk forgets; `--history s3://bucket/prefix` keeps the same records as the local file
(database.py) in a bucket, one small object per host per run:

    PREFIX/HOST/YYYY/MM/DD/<microseconds>-<random>.json   a JSON list of the host's records

Keys sort in time order within a host, so the newest records are the last keys listed. Reading
lists a host's keys (paged, bounded) and reads the newest `limit` objects. boto3 is imported only
when such a history is named (the `aws` extra). Every call is bounded (5 s connect, 15 s read,
TRIES tries), and each write and each read as a whole (WRITE_DEADLINE_S, READ_DEADLINE_S): an
endpoint that answers a byte at a time defeats the per-call timeouts, never the deadline. A stop
signal (`stop`, from a parent that holds them) cuts the wait short. Nothing raises: a write that
failed is one line of text, a read that failed is no records.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, TypeVar

from ddp_doctor.history.database import RunRecord, record_from_dict, series_of
from ddp_doctor.report.redact import redact_text
from ddp_doctor.report.s3 import PERMANENT, parse_s3_uri
from ddp_doctor.time_limit import call_until

TRIES = 3
MAX_PAGES = 50  # listing pages (1,000 keys each) per read
MAX_READ = 200  # objects read per call, the newest
# A write is one small object per host, after the report's upload (report/s3.py, 30 s at most):
# 20 s keeps both well inside SageMaker's 120 s between StopTrainingJob's SIGTERM and its SIGKILL,
# and is far more than a put takes (tens of ms in region), with room for a retry after a throttle.
WRITE_DEADLINE_S = 20.0
# A read lists up to MAX_PAGES pages and gets up to MAX_READ objects, one after another: a few
# seconds in region. 30 s lets a slow but working endpoint finish and bounds what a report, or
# `ddp-doctor history`, waits for a history it only compares against.
READ_DEADLINE_S = 30.0
STOPPED = "cut short by a stop signal"

T = TypeVar("T")


def _code(e: BaseException) -> str:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Code") or "")
    return type(e).__name__


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "_"


class S3History:
    """The history under an s3:// prefix. `stop(s)` (optional: a parent that holds the stop signals
    passes SignalCatcher.wait_new) waits up to s seconds for a stop signal and returns it, truthy,
    when one came: it ends a write's or a read's wait at once. `write_deadline` and `read_deadline`
    (None: WRITE_DEADLINE_S, READ_DEADLINE_S) bound each write and each read as a whole. Once one ran
    out or was stopped, later calls of this history give up at once: the endpoint is known to be
    too slow, and a caller that compares against several hosts would otherwise wait once per host."""

    def __init__(self, uri: str, *, client: Any = None, session: Any = None,
                 stop: Callable[[float], Any] | None = None, write_deadline: float | None = None,
                 read_deadline: float | None = None) -> None:
        self.uri = uri
        self.bucket, prefix = parse_s3_uri(uri)
        self.prefix = prefix.strip("/")
        self._client, self._session = client, session
        self.read_error: str | None = None  # why the last read found nothing, when it failed
        self.stop = stop
        self.write_deadline, self.read_deadline = write_deadline, read_deadline
        self.gave_up: str | None = None  # why an earlier call was abandoned: later ones are not tried

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

    def _bounded(self, fn: Callable[[], T], deadline: float, what: str) -> tuple[T | None, str | None]:
        """fn() within `deadline` seconds, cut short by a stop: (its value, None), else (None, why
        not). fn catches what it expects; anything else it raises is the why, never raised."""
        if self.gave_up:
            return None, f"not tried, after an earlier call got {self.gave_up}"
        got, stopped = call_until(fn, deadline, stop=self.stop, name=f"ddp-doctor-history-{what}")
        if stopped:
            self.gave_up = STOPPED
        elif not got.finished:
            self.gave_up = f"no answer within {deadline:g} s (a {what}'s whole deadline: the endpoint is slow)"
        elif got.error is not None:
            return None, f"{type(got.error).__name__}: {got.error}"
        else:
            return got.value, None
        return None, self.gave_up

    def _key(self, host: str, t: float) -> str:
        day = time.strftime("%Y/%m/%d", time.gmtime(t))
        name = f"{int(t * 1e6):020d}-{uuid.uuid4().hex[:8]}.json"
        return "/".join(p for p in (self.prefix, _safe(host), day, name) if p)

    def add(self, records: list[RunRecord]) -> str | None:
        """One object per host; None when written, else why not, one line (never raises). The whole
        write, every host's object and every try, has one deadline (WRITE_DEADLINE_S)."""
        by_host: dict[str, list[RunRecord]] = {}
        for r in records:
            by_host.setdefault(r.host, []).append(r)
        try:  # local work (boto3's import, its service model), outside the deadline of the calls
            client = self.client()
        except ImportError:
            return f"the history {self.uri} needs boto3 (pip install \"ddp-doctor[aws]\"); nothing was recorded"
        except Exception as e:  # noqa: BLE001 - never raises to a writer
            return redact_text(f"the history {self.uri} could not be written: {type(e).__name__}: {e}")

        def write() -> str | None:
            for host, recs in by_host.items():
                key = self._key(host, max(r.time for r in recs))
                body = json.dumps([r.to_dict() for r in recs], sort_keys=True).encode("utf-8")
                err = self._put(client, key, body)
                if err:
                    return err
            return None

        deadline = WRITE_DEADLINE_S if self.write_deadline is None else self.write_deadline
        said, why = self._bounded(write, deadline, "write")
        if why:
            return redact_text(f"the history {self.uri} could not be written: {why}")
        return redact_text(said) if said else None

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
        return f"the history s3://{self.bucket}/{key} could not be written: {last}"

    def records(self, *, host: str | None = None, instance_type: str | None = None,
                limit: int = 1000, like: RunRecord | None = None) -> list[RunRecord]:
        """The newest records (of a host, of an instance type, of `like`'s series: series_of),
        oldest first; [] when none or
        unreadable, as when the read (every page and object) outlasts its deadline (READ_DEADLINE_S)
        or a stop comes: a history that cannot be read compares nothing (`read_error` says why)."""
        prefix = "/".join(p for p in (self.prefix, _safe(host) if host else "") if p)
        prefix = prefix + "/" if prefix else ""
        self.read_error = None
        try:  # local work (boto3's import, its service model), outside the deadline of the calls
            client = self.client()
        except ImportError:
            self.read_error = "it needs boto3 (pip install \"ddp-doctor[aws]\")"
            return []
        except Exception as e:  # noqa: BLE001 - a bad configuration: a history that cannot be read
            self.read_error = redact_text(f"{type(e).__name__}: {e}")
            return []

        def read() -> list[RunRecord]:
            try:
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
                                (not instance_type or rec.instance_type == instance_type) and \
                                (like is None or series_of(rec) == series_of(like)):
                            out.append(rec)
            except Exception as e:  # noqa: BLE001 - a history that cannot be read compares nothing
                self.read_error = redact_text(f"{type(e).__name__}: {e}")
                return []
            return out

        deadline = READ_DEADLINE_S if self.read_deadline is None else self.read_deadline
        got, why = self._bounded(read, deadline, "read")
        if why:
            self.read_error = redact_text(why)
        return sorted(got or [], key=lambda r: r.time)[-limit:]

    def count(self) -> int:
        return len(self.records(limit=10 ** 9))
