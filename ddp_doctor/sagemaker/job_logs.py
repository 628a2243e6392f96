"""What AWS kept of a SageMaker training job, for `ddp-doctor analyze --sagemaker-job`: its
description (sagemaker:DescribeTrainingJob) and its hosts' CloudWatch Logs streams in
/aws/sagemaker/TrainingJobs (logs:DescribeLogStreams, logs:GetLogEvents), written into a directory
as one plain log file per host (`algo-1.log`), which the post-mortem then reads like any console.

Everything is bounded: each call (connect and read timeouts, a few retries for throttling), the
pages read, the bytes kept (a share of `total_bytes` per host, at most `stream_bytes`), and the
whole fetch's time (DEADLINE_S: an endpoint that answers a byte at a time defeats the per-call
timeouts, never the deadline). A stream larger than its share keeps its beginning (a quarter of
the share: how the job started) and its end (the rest, read backwards from the last event: how the
job failed); the middle is not read, and the stream's summary says so (`truncated`, `why`). When
the deadline runs out while the streams are read, what was read is kept: the stream being read is
`truncated`, those not reached say so in `why`, and `JobLogs.cut_short` (the summary's
`cut_short`) says what ran out.

A failure becomes a JobLogsError: one line, `usage` when the user can fix the command line (a
job name that is not one, or not found; no region); the deadline running out before any stream
is read is one too. boto3 is imported only when logs are read.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Iterator

from ddp_doctor.sagemaker.aws import (
    AWS_EXTRA_HINT,
    CREDENTIAL_CODES,
    DENIED_CODES,
    _one_line,  # the AWS message on one line, markup removed: one rule with the job check's
    require_boto3,
)
from ddp_doctor.time_limit import call_with_time_limit

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
STREAM_BYTES = 64 * 2**20   # at most this much of one host's stream is kept
TOTAL_BYTES = 256 * 2**20   # ... and this much of all of them (the temporary directory's size)
MAX_HOSTS = 512             # hosts whose streams are read; a job's further hosts are listed, not read
MAX_LISTED = 2000           # streams listed (hosts x restarts)
MAX_PAGES = 500             # get_log_events pages per stream and direction (CloudWatch may answer empty pages)
CONNECT_TIMEOUT, READ_TIMEOUT = 5.0, 15.0
ATTEMPTS = 4                # per call, first try included: paging many pages meets throttling
HEAD_SHARE = 4              # a cut stream keeps 1/HEAD_SHARE of its budget from its beginning
# The whole fetch, every call of it: a user at a terminal waits for it. Reading TOTAL_BYTES is
# about 256 GetLogEvents pages of 1 MB (CloudWatch answers 25 a second per account) plus a few
# calls per host: a minute or two over a slow link. Five minutes lets that finish and stops an
# endpoint that trickles (each byte inside READ_TIMEOUT) from holding the command for hours.
DEADLINE_S = 300.0

# SageMaker's own rule for a training job's name; it also keeps the stream prefix to this job's.
JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
# NAME/algo-2-1700000000: the host, then the epoch second its container started (a restarted job,
# e.g. managed spot, gets a new stream per host).
_STREAM = re.compile(r"^(?P<host>.+)-(?P<epoch>\d{9,})$")
THROTTLING_CODES = {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded",
                    "ProvisionedThroughputExceededException", "SlowDown", "ServiceUnavailable",
                    "ServiceUnavailableException"}


class JobLogsError(Exception):
    """Reading the job failed: a one-line message; `usage` when the command line is at fault."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class StreamRead:
    """One CloudWatch stream: what of it was read and where it went (`file`, None when not read)."""

    name: str
    host: str | None
    events: int = 0
    bytes: int = 0
    truncated: bool = False
    why: str | None = None     # why it is cut or was not read
    file: str | None = None


@dataclass
class JobLogs:
    """The job as described, and its streams as read."""

    job: str
    region: str
    status: str | None = None
    secondary_status: str | None = None
    failure_reason: str | None = None
    instance_type: str | None = None
    instance_count: int | None = None
    times: dict[str, str] = field(default_factory=dict)
    streams: list[StreamRead] = field(default_factory=list)
    streams_unlisted: bool = False  # more streams than MAX_LISTED: the rest were not even listed
    cut_short: str | None = None    # the fetch's deadline ran out while the streams were read: what was not read

    @property
    def read(self) -> list[StreamRead]:
        return [s for s in self.streams if s.file]

    def world(self) -> dict[str, Any]:
        """The report's world, as far as the job's description tells it."""
        return {"platform": "sagemaker", "instance_type": self.instance_type,
                **({"instance_type_from": "the SageMaker job's description"} if self.instance_type else {}),
                "instance_count": self.instance_count, "region": self.region}

    def summary(self) -> dict[str, Any]:
        """measurements.post_mortem.sagemaker: the job, how it ended, each stream as read."""
        streams = [{k: v for k, v in asdict(s).items() if k != "file" and (k != "why" or v)} for s in self.streams]
        out: dict[str, Any] = {"job": self.job, "status": self.status, "failure_reason": self.failure_reason,
                               "secondary_status": self.secondary_status, "log_group": LOG_GROUP,
                               "times": dict(self.times), "streams": streams}
        if self.streams_unlisted:
            out["streams_unlisted"] = f"more than {MAX_LISTED} streams: the rest were not listed"
        if self.cut_short:
            out["cut_short"] = self.cut_short
        return out


def fetch_job_logs(job: str, directory: str, *, region: str | None = None, session: Any = None,
                   stream_bytes: int = STREAM_BYTES, total_bytes: int = TOTAL_BYTES,
                   page_events: int | None = None, attempts: int = ATTEMPTS,
                   deadline: float | None = None) -> JobLogs:
    """Describe `job`, and write its hosts' streams into `directory` (one `HOST.log` each).
    `page_events`: get_log_events' limit (None: CloudWatch's page, up to 10,000 events or 1 MB).
    `deadline`: seconds for every call together (None: DEADLINE_S); see the module doc for what
    is kept when it runs out."""
    if not JOB_NAME.match(job or ""):
        raise JobLogsError(f"{job!r} is not a SageMaker training job name (1-63 letters, digits and hyphens)",
                           usage=True)
    try:
        require_boto3()
    except ImportError:
        raise JobLogsError(f"reading a SageMaker job's logs needs boto3: {AWS_EXTRA_HINT}") from None
    reader = _Reader(region, session, attempts, DEADLINE_S if deadline is None else deadline)
    try:
        logs = reader.describe(job)
        names, logs.streams_unlisted = reader.stream_names(job)
    except _OutOfTime as t:
        raise JobLogsError(f"{t}: AWS or the network answered too slowly; no stream was read") from None
    logs.streams = _choose(job, names)
    todo = [s for s in logs.streams if not s.why]
    left = total_bytes
    for i, s in enumerate(todo):
        if reader.ran_out:
            s.why = f"not read: {reader.ran_out}"
            continue
        share = min(stream_bytes, left // (len(todo) - i))  # what earlier hosts left goes to later ones
        s.file = os.path.join(directory, _file_name(s, {os.path.basename(t.file) for t in todo if t.file}))
        reader.read_stream(s, share, page_events)
        left -= s.bytes
    if reader.ran_out:
        if not any(s.events for s in todo):  # nothing to judge: a failed fetch, as one with no streams
            raise JobLogsError(f"{reader.ran_out}: AWS or the network answered too slowly; no event was read")
        unread = sum(1 for s in todo if not s.file)
        logs.cut_short = f"{reader.ran_out}" + (f": {unread} stream(s) not read" if unread else "")
    return logs


def _choose(job: str, names: list[str]) -> list[StreamRead]:
    """One stream per host, its newest (a restarted job's earlier streams are named, not read);
    hosts past MAX_HOSTS are named, not read."""
    latest: dict[str, tuple[int, str]] = {}
    streams = []
    for name in names:
        m = _STREAM.match(name[len(job) + 1:])
        host = m.group("host") if m else name[len(job) + 1:]
        epoch = int(m.group("epoch")) if m else 0
        streams.append(StreamRead(name=name, host=host if m else None))
        if (epoch, name) > latest.get(host, (-1, "")):
            latest[host] = (epoch, name)
    newest = {name for _, name in latest.values()}
    hosts = 0
    for s in sorted(streams, key=lambda s: _host_order(s.host or s.name)):
        if s.name not in newest:
            s.why = "an earlier stream of this host (the job restarted): not read"
        elif hosts >= MAX_HOSTS:
            s.why = f"more than {MAX_HOSTS} hosts: not read"
        else:
            hosts += 1
    return sorted(streams, key=lambda s: (_host_order(s.host or s.name), s.name))


def _host_order(host: str) -> tuple[Any, ...]:
    """algo-2 before algo-10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", host))


def _file_name(s: StreamRead, taken: set[str]) -> str:
    """HOST.log (algo-1.log), a name safe in a directory and not taken yet."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", s.host or s.name.split("/", 1)[-1]).strip("._") or "stream"
    name, n = f"{base}.log", 1
    while name in taken:
        n += 1
        name = f"{base}-{n}.log"
    return name


def _line(event: dict[str, Any]) -> str:
    return str(event.get("message") or "").rstrip("\r\n") + "\n"


def _size(line: str) -> int:
    return len(line.encode("utf-8", "replace"))


def _iso(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


class _Reader:
    """The two clients and the one place their errors become JobLogsError."""

    def __init__(self, region: str | None, session: Any, attempts: int, deadline: float) -> None:
        import boto3
        import botocore.exceptions as bx
        from botocore.config import Config
        try:
            self.session = session or boto3.Session(region_name=region)
        except bx.BotoCoreError as e:  # a profile that does not exist
            raise JobLogsError(f"AWS configuration: {_one_line(str(e))}") from None
        self.region = region or self.session.region_name
        if not self.region:
            raise JobLogsError("no AWS region: pass --region, or set AWS_DEFAULT_REGION or a profile's region",
                               usage=True)
        cfg = Config(connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
                     retries={"total_max_attempts": max(1, attempts), "mode": "standard"})
        self.attempts = max(1, attempts)
        try:
            self.sagemaker = self.session.client("sagemaker", region_name=self.region, config=cfg)
            self.logs = self.session.client("logs", region_name=self.region, config=cfg)
        except bx.InvalidRegionError:
            raise JobLogsError(f"{self.region!r} is not an AWS region", usage=True) from None
        except bx.BotoCoreError as e:
            raise JobLogsError(f"AWS configuration: {_one_line(str(e))}") from None
        # the clock starts with the first call: making the clients reads their models, locally
        self.deadline, self.until = deadline, time.monotonic() + deadline
        self.ran_out: str | None = None  # the deadline ran out: no further call is made

    def call(self, client: Any, method: str, **kwargs: Any) -> dict[str, Any]:
        """client.method(**kwargs) within what is left of the fetch's deadline (else _OutOfTime:
        the call is left behind in its thread); an AWS error becomes a JobLogsError naming the
        permission."""
        import botocore.exceptions as bx
        api = client.meta.method_to_api_mapping.get(method, method)
        permission = f"{client.meta.service_model.signing_name}:{api}"
        left = self.until - time.monotonic()
        got = call_with_time_limit(lambda: getattr(client, method)(**kwargs), left,
                                   name="ddp-doctor-sagemaker-logs") if left > 0 else None
        if got is None or not got.finished:
            self.ran_out = f"the fetch's whole deadline ({self.deadline:g} s) ran out " + (
                f"during {api}" if got is not None else f"before {api}")
            raise _OutOfTime(self.ran_out)
        try:
            if got.error is not None:
                raise got.error
            return dict(got.value or {})
        except bx.ClientError as e:
            err = e.response.get("Error", {}) if isinstance(e.response, dict) else {}
            code, message = str(err.get("Code") or ""), _one_line(str(err.get("Message") or ""))
            status = (e.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in CREDENTIAL_CODES:
                raise JobLogsError(f"AWS did not accept the credentials for {api} ({code}): {message}") from None
            if code in DENIED_CODES or status == 403:
                raise JobLogsError(f"{api} was denied ({code or status}): the identity needs {permission}; "
                                   f"AWS said: {message}") from None
            if code in THROTTLING_CODES:
                raise JobLogsError(f"{api} was throttled ({code}) {self.attempts} time(s) in a row; "
                                   f"try again later") from None
            raise _Answer(code, message, api) from None
        except (bx.NoCredentialsError, bx.PartialCredentialsError):
            raise JobLogsError("no AWS credentials found (environment, profile, SSO or instance role)") from None
        except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError) as e:
            raise JobLogsError(f"{api}: AWS did not answer ({type(e).__name__}): {_one_line(str(e))}") from None
        except bx.BotoCoreError as e:
            raise JobLogsError(f"{api}: {type(e).__name__}: {_one_line(str(e))}") from None

    def describe(self, job: str) -> JobLogs:
        try:
            d = self.call(self.sagemaker, "describe_training_job", TrainingJobName=job)
        except _Answer as a:
            # AWS: ValidationException "Requested resource not found."; moto: "Could not find training job"
            if re.search(r"not (be )?found|could not find|does not exist", a.message, re.IGNORECASE):
                raise JobLogsError(f"no SageMaker training job {job!r} in {self.region}", usage=True) from None
            raise JobLogsError(a.line) from None
        rc = d.get("ResourceConfig") or {}
        count = rc.get("InstanceCount")
        itype = rc.get("InstanceType")
        groups = rc.get("InstanceGroups") or []  # a heterogeneous cluster: its groups instead
        if groups and count is None:
            count = sum(int(g.get("InstanceCount") or 0) for g in groups)
            itype = itype or ",".join(sorted({str(g.get("InstanceType")) for g in groups}))
        times = {k: _iso(d[key]) for k, key in (("created", "CreationTime"), ("started", "TrainingStartTime"),
                                                ("ended", "TrainingEndTime")) if d.get(key) is not None}
        return JobLogs(job=job, region=self.region, status=d.get("TrainingJobStatus"),
                       secondary_status=d.get("SecondaryStatus"), failure_reason=d.get("FailureReason"),
                       instance_type=itype, instance_count=int(count) if count is not None else None, times=times)

    def stream_names(self, job: str) -> tuple[list[str], bool]:
        """This job's stream names, and whether the listing was cut at MAX_LISTED."""
        names: list[str] = []
        token = None
        while True:
            kw: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": job + "/"}
            if token:
                kw["nextToken"] = token
            try:
                page = self.call(self.logs, "describe_log_streams", **kw)
            except _Answer as a:
                if a.code == "ResourceNotFoundException":  # no log group: no job wrote logs in this region
                    return [], False
                raise JobLogsError(a.line) from None
            names += [str(s["logStreamName"]) for s in page.get("logStreams") or [] if s.get("logStreamName")]
            nxt = page.get("nextToken")
            if not nxt or nxt == token:
                return names, False
            if len(names) >= MAX_LISTED:
                return names[:MAX_LISTED], True
            token = nxt

    def _pages(self, stream: str, head: bool, limit: int | None) -> Iterator[list[dict[str, Any]]]:
        """The stream's events page by page, from its beginning (`head`) or its end (each page
        newest first then), until the token repeats, or MAX_PAGES (then a _Cut)."""
        token = None
        for _ in range(MAX_PAGES):
            kw: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": head}
            if token:
                kw["nextToken"] = token
            if limit:
                kw["limit"] = limit
            try:
                page = self.call(self.logs, "get_log_events", **kw)
            except _Answer as a:
                raise _Cut(f"{a.line} (the stream was not read further)") from None
            events = list(page.get("events") or [])
            yield events if head else events[::-1]
            nxt = page.get("nextForwardToken" if head else "nextBackwardToken")
            if not nxt or nxt == token:
                return
            token = nxt
        raise _Cut(f"more than {MAX_PAGES} pages")

    def read_stream(self, s: StreamRead, budget: int, limit: int | None) -> None:
        """Write stream `s` into s.file: all of it within `budget` bytes, else its beginning (a
        quarter of the budget) and its end (the rest)."""
        assert s.file
        head_budget = budget // HEAD_SHARE
        seam = _Seam()  # the beginning's last millisecond: its events may come again from the end
        cut = None
        with open(s.file, "w", encoding="utf-8", errors="replace", newline="\n",
                  opener=lambda p, f: os.open(p, f, 0o600)) as out:
            out_of_time = False
            try:
                for events in self._pages(s.name, True, limit):
                    for ev in events:
                        line, ts = _line(ev), int(ev.get("timestamp") or 0)
                        size = _size(line)
                        if s.bytes + size > head_budget:
                            cut = f"over its share of the byte bound ({budget} bytes)"
                            break
                        out.write(line)
                        s.events, s.bytes = s.events + 1, s.bytes + size
                        seam.add(ts, size)
                    if cut:
                        break
            except _OutOfTime as t:  # no time left to read its end either
                cut, out_of_time = str(t), True
            except _Cut as c:
                cut = str(c)
            newest = seam.ts
            if out_of_time:
                s.truncated, s.why = True, f"{cut}: the rest was not read"
            elif cut:
                end = self._read_end(s, budget - s.bytes, seam, limit)
                for ts, line, size in end.events:
                    out.write(line)
                    s.events, s.bytes = s.events + 1, s.bytes + size
                    newest = ts
                if not end.met:
                    s.truncated = True
                    s.why = f"{cut}: its middle was not read" if end.cut is None else f"{cut}; its end: {end.cut}"
        if newest:  # the file's time is its last line's, as if the host had written it (orders the hosts)
            os.utime(s.file, (newest / 1000, newest / 1000))

    def _read_end(self, s: StreamRead, budget: int, seam: _Seam, limit: int | None) -> _End:
        """The end of a stream whose beginning was cut, read backwards within `budget` bytes until
        it meets the beginning (at `seam`)."""
        tail: list[tuple[int, str, int]] = []  # newest first
        used, met, cut = 0, False, None
        try:
            for events in self._pages(s.name, False, limit):
                for ev in events:
                    ts, line = int(ev.get("timestamp") or 0), _line(ev)
                    if seam.ts is not None and ts < seam.ts:
                        met = True
                        break
                    size = _size(line)
                    # the seam's millisecond holds up to seam.count events written already: room for them
                    if used + size > budget + (seam.bytes if ts == seam.ts else 0):
                        break
                    tail.append((ts, line, size))
                    used += size
                else:
                    continue
                break
            else:
                met = True  # the stream's first event was reached
        except _Cut as c:
            cut = str(c)
        # A stream's events come in timestamp order: of those in the seam's millisecond, the
        # oldest seam.count are the beginning's last events, written already.
        same = 0
        while same < len(tail) and tail[-1 - same][0] == seam.ts:
            same += 1
        del tail[len(tail) - min(same, seam.count):]
        used = sum(e[2] for e in tail)
        while tail and used > budget:  # the room for repeats held new events: the oldest go
            used -= tail.pop()[2]
            met = False
        return _End(events=tail[::-1], met=met, cut=cut)


class _Seam:
    """The last millisecond written from a stream's beginning: how many events, how many bytes."""

    def __init__(self) -> None:
        self.ts: int | None = None
        self.count = self.bytes = 0

    def add(self, ts: int, size: int) -> None:
        if ts != self.ts:
            self.ts, self.count, self.bytes = ts, 0, 0
        self.count += 1
        self.bytes += size


@dataclass
class _End:
    events: list[tuple[int, str, int]]  # (timestamp, line, bytes), oldest first
    met: bool                      # it met the beginning: nothing between them is missing
    cut: str | None                # why reading it stopped early, when not the byte bound


class _Answer(Exception):
    """An AWS answer the caller interprets (not found, a parameter refused)."""

    def __init__(self, code: str, message: str, api: str) -> None:
        super().__init__(code)
        self.code, self.message = code, message
        self.line = f"{api}: {code or 'error'}: {message}"


class _Cut(Exception):
    """Reading a stream stopped early (a page bound, an error on the stream): why."""


class _OutOfTime(_Cut):
    """The fetch's deadline ran out (DEADLINE_S): why; no further call is made."""
