"""The local history of runs: one SQLite file per machine, appended to by every preflight and
run, read to compare a host with its own past.

A record is one host's entry for one job: when, which job, the host, its instance type and GPUs,
the world's layout, the versions, the job's status, the script a run trained (its file name), and
its figures (name -> value: the busbw of each collective and message size, the preflight's stage
times, the median step time, the straggler's lag, whether a host of the job was busy). A host is
compared only with records of the same series (series_of: the same layout, backend and versions;
sizes are part of each figure's name).

A figure that cannot be real is never kept and never read back (possible_figure): a value that
is not finite or is negative, a rate or step time of zero, and a busbw of a group of fewer than 2
ranks (a 1-rank "busbw" is a memory copy's speed, not a link's). Records an older ddp-doctor wrote
with such figures are read without them.

Writes are safe with several writers (ranks of one host, jobs side by side): WAL journal, a busy
timeout, and a bounded retry on "database is locked"; the file keeps at most MAX_RUNS records (the
oldest pruned). Nothing here raises to a caller that writes: a history that cannot be written is a
line of text, never a broken job. The schema is versioned (`meta.schema_version`); a file written
by a newer schema is read as far as it can be and never altered. The `script` column came later
within version 1: a file without it gains it (nullable) on its next write, inside the write's
transaction; older ddp-doctor versions read and write such a file as before.

Reading is total: History.read names a file that is no history (not a regular file, not SQLite,
corrupted or truncated, locked past the busy timeout) in HistoryUnreadable, and skips and counts
each row that is not a record as written (a figure that is not JSON, a NULL time, text for a world
size); records(), which the checks use, reads the same and never raises.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

SCHEMA_VERSION = 1
MAX_RUNS = 20_000  # records kept per file (about 20 MB); the oldest go first
BUSY_S = 5.0  # how long one statement waits for another writer's lock
TRIES = 4  # whole-transaction attempts on "database is locked", with a growing pause
HISTORY_ENV = "DDP_DOCTOR_HISTORY"  # a path, an s3:// prefix, or "off"
OFF = ("off", "none", "0", "false", "no")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    job TEXT,
    host TEXT NOT NULL,
    instance_type TEXT,
    gpus TEXT NOT NULL,
    world_size INTEGER,
    nnodes INTEGER,
    nproc_per_node INTEGER,
    backend TEXT,
    versions TEXT NOT NULL,
    status TEXT,
    figures TEXT NOT NULL,
    script TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_host ON runs (host, time);
CREATE INDEX IF NOT EXISTS runs_by_type ON runs (instance_type, time);
"""


@dataclass
class RunRecord:
    """One host's entry for one job (see the module's doc)."""

    time: float
    kind: str  # "preflight" or "run"
    host: str
    job: str | None = None
    instance_type: str | None = None
    gpus: list[str] = field(default_factory=list)  # UUIDs or serials, as NVML gives them
    world_size: int | None = None
    nnodes: int | None = None
    nproc_per_node: int | None = None
    backend: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    status: str | None = None
    figures: dict[str, float] = field(default_factory=dict)
    script: str | None = None  # the file name of the script a run trained (its figures name its digest)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SERIES_COLUMNS = ("kind", "world_size", "nnodes", "nproc_per_node", "backend")
SERIES_VERSIONS = ("torch", "nccl", "cuda")
BUSBW = ".busbw_gbps@"  # a collective's bus bandwidth at a message size: COLL.busbw_gbps@BYTES
POSITIVE = (BUSBW, "training.median_step_s@")  # rates and step times: zero is no measurement


def group_size(name: str, rec: RunRecord) -> int | None:
    """How many ranks the collective of a busbw figure ran over, from the record's layout (the
    whole job; within a node: its processes; between nodes: one per node); None when not a busbw
    figure or not known."""
    if BUSBW not in name:
        return None
    coll = name.split(BUSBW, 1)[0]
    return {"all_reduce_intra": rec.nproc_per_node, "all_reduce_inter": rec.nnodes}.get(coll, rec.world_size)


def possible_figure(name: str, value: Any, nranks: Any = None) -> bool:
    """Whether a figure can be real: a finite number, not negative, above zero for a rate or a step
    time, and a busbw measured over 2 ranks or more (`nranks`: the group's size, None when unknown)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return False
    if any(k in name for k in POSITIVE) and value <= 0:
        return False
    if BUSBW in name and isinstance(nranks, int) and not isinstance(nranks, bool) and nranks < 2:
        return False
    return True


def possible_figures(rec: RunRecord) -> dict[str, float]:
    """The record's figures less those that cannot be real (possible_figure, with the record's
    layout for the group sizes)."""
    return {k: float(v) for k, v in rec.figures.items() if possible_figure(k, v, group_size(k, rec))}


def series_of(rec: RunRecord) -> tuple[Any, ...]:
    """What makes two records comparable: the same layout, backend and versions that set the
    figures (another torch or NCCL, another world size, is another series)."""
    return (*(getattr(rec, c) for c in SERIES_COLUMNS), *(rec.versions.get(k) for k in SERIES_VERSIONS))


def default_path(env: dict[str, str] | None = None) -> str | None:
    """Where the history is kept: $DDP_DOCTOR_HISTORY (a path or an s3:// prefix; "off" turns
    it off: None), else the user's cache directory."""
    env = os.environ if env is None else env
    given = (env.get(HISTORY_ENV) or "").strip()
    if given.lower() in OFF:
        return None
    if given:
        return given
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ddp-doctor", "history.sqlite")


def choose(path: str | None, off: bool, env: Any = None) -> None:
    """--history PATH / --no-history: set for this process and the ranks it starts (they inherit
    the variable)."""
    env = os.environ if env is None else env
    if off:
        env[HISTORY_ENV] = "off"
    elif path:
        env[HISTORY_ENV] = path if path.startswith("s3://") else os.path.abspath(path)


class HistoryUnreadable(Exception):
    """The history file cannot be read as one: `why` is a phrase that follows its path."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path} {why}")
        self.path, self.why = path, why


class History:
    """The history file at `path` (made on first write, with its directory, private)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _connect(self, *, write: bool) -> sqlite3.Connection:
        if write:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o700, exist_ok=True)
        elif not os.path.exists(self.path):
            raise FileNotFoundError(self.path)
        conn = sqlite3.connect(self.path, timeout=BUSY_S, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_S * 1000)}")
        if write:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL stays consistent; a power cut may lose the last run
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        return conn

    def schema_version(self) -> int | None:
        try:
            with _closing(self._connect(write=False)) as conn:
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            return int(row[0]) if row else None
        except (OSError, sqlite3.Error, ValueError):
            return None

    def add(self, records: list[RunRecord]) -> str | None:
        """Append the records in one transaction; None when written, else why not (never raises)."""
        if not records:
            return None
        last: Exception | None = None
        for attempt in range(TRIES):
            try:
                with _closing(self._connect(write=True)) as conn:
                    newer = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                    if newer and int(newer[0]) > SCHEMA_VERSION:
                        return f"{self.path} was written by a newer ddp-doctor (schema {newer[0]}): left as it is"
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        # a version-1 file from before the script column: added under the write lock
                        if "script" not in {row[1] for row in conn.execute("PRAGMA table_info(runs)")}:
                            conn.execute("ALTER TABLE runs ADD COLUMN script TEXT")
                        conn.executemany(
                            "INSERT INTO runs (time, kind, job, host, instance_type, gpus, world_size, nnodes, "
                            "nproc_per_node, backend, versions, status, figures, script) VALUES "
                            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [_row(r) for r in records])
                        conn.execute("DELETE FROM runs WHERE id <= (SELECT MAX(id) FROM runs) - ?", (MAX_RUNS,))
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                try:
                    os.chmod(self.path, 0o600)
                except OSError:
                    pass
                return None
            except sqlite3.OperationalError as e:
                last = e
                if "locked" not in str(e) and "busy" not in str(e):
                    break
                time.sleep(0.05 * (2 ** attempt))
            except (OSError, sqlite3.Error, ValueError) as e:
                last = e
                break
        hint = "" if isinstance(last, sqlite3.OperationalError) or not isinstance(last, sqlite3.DatabaseError) else \
            " (a corrupted file: move it aside and the next run starts a new one)"
        return f"the history {self.path} could not be written: {type(last).__name__}: {last}{hint}"

    def records(self, *, host: str | None = None, instance_type: str | None = None,
                limit: int = 1000, like: RunRecord | None = None) -> list[RunRecord]:
        """The newest records (of a host, of an instance type, of `like`'s series: series_of),
        oldest first; [] when none or when the file cannot be read (rows that are not records are
        left out). Never raises."""
        try:
            return self.read(host=host, instance_type=instance_type, limit=limit, like=like)[0]
        except (HistoryUnreadable, FileNotFoundError):
            return []

    def read(self, *, host: str | None = None, instance_type: str | None = None,
             limit: int = 1000, like: RunRecord | None = None) -> tuple[list[RunRecord], int]:
        """(the newest records (of `like`'s series: series_of), oldest first; how many rows read
        were not records and were skipped). FileNotFoundError when there is no file; HistoryUnreadable when
        the file is not a history that can be read."""
        from ddp_doctor.facts.env_values import not_regular
        try:
            kind = not_regular(self.path)  # a FIFO or a device is never handed to SQLite
        except FileNotFoundError:
            raise
        except OSError as e:
            raise HistoryUnreadable(self.path, f"cannot be read: {e.strerror or e}") from None
        if kind is not None:
            raise HistoryUnreadable(self.path, f"is {kind}, not a regular file")
        where, args = [], []
        if host:
            where.append("host = ?")
            args.append(host)
        if instance_type:
            where.append("instance_type = ?")
            args.append(instance_type)
        if like is not None:  # the series' columns here, its versions (JSON) below
            for column in SERIES_COLUMNS:
                where.append(f"{column} IS ?")
                args.append(getattr(like, column))
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + \
              " ORDER BY time DESC, id DESC" + ("" if like else " LIMIT ?")
        out: list[RunRecord] = []
        skipped = 0
        try:
            with _closing(self._connect(write=False)) as conn:
                conn.row_factory = sqlite3.Row
                # newest first, read until `limit` records (of the series: its versions are checked here)
                for row in conn.execute(sql, args if like else (*args, int(limit))):
                    try:
                        rec = _record(row)
                    except (KeyError, TypeError, ValueError):
                        skipped += 1
                        continue
                    if like is None or series_of(rec) == series_of(like):
                        out.append(rec)
                        if len(out) >= limit:
                            break
        except FileNotFoundError:
            raise
        except OSError as e:
            raise HistoryUnreadable(self.path, f"cannot be read: {e.strerror or e}") from None
        except sqlite3.Error as e:
            raise HistoryUnreadable(self.path, self._unreadable(e)) from None
        return out[::-1], skipped

    def _unreadable(self, e: sqlite3.Error) -> str:
        """Why the file cannot be read, from SQLite's error."""
        text = str(e)
        if "locked" in text or "busy" in text:
            return f"is locked by another writer (waited {BUSY_S:g} s): try again"
        if "no such table" in text:
            return "is an SQLite file without ddp-doctor's history in it (no runs table)"
        return f"is not a history ddp-doctor can read (SQLite: {text}): it is corrupted, truncated or another file"

    def count(self) -> int:
        try:
            with _closing(self._connect(write=False)) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
        except (OSError, sqlite3.Error):
            return 0


class _closing:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, *exc: Any) -> None:
        self.conn.close()


def _row(r: RunRecord) -> tuple[Any, ...]:
    return (float(r.time), r.kind, r.job, r.host, r.instance_type, json.dumps(list(r.gpus)), r.world_size, r.nnodes,
            r.nproc_per_node, r.backend, json.dumps(dict(r.versions), sort_keys=True), r.status,
            json.dumps(possible_figures(r), sort_keys=True), r.script)


def _record(row: sqlite3.Row) -> RunRecord:
    """A row as the record _row wrote; ValueError (TypeError, KeyError) for a row that is not one:
    a column of another type, JSON that does not parse or holds other types, a NULL time."""
    from ddp_doctor.facts.env_values import bounded_json

    def loads(name: str, kind: type, item: Any) -> Any:
        text = row[name]
        value = bounded_json(text) if isinstance(text, str) else None
        if not isinstance(value, kind) or not all(item(v) for v in (value.values() if kind is dict else value)):
            raise ValueError(f"{name} is not a JSON {kind.__name__} as written")
        return value

    def text(name: str, required: bool = False) -> Any:
        value = row[name]
        if not (isinstance(value, str) or (value is None and not required)):
            raise ValueError(f"{name} is not text")
        return value

    def count(name: str) -> int | None:
        value = row[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{name} is not a whole number")
        return value

    when = row["time"]
    if not isinstance(when, (int, float)) or not math.isfinite(when):
        raise ValueError("time is not a number")
    figures = loads("figures", dict, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
    rec = RunRecord(time=float(when), kind=text("kind", True), host=text("host", True), job=text("job"),
                    instance_type=text("instance_type"), gpus=loads("gpus", list, lambda v: isinstance(v, str)),
                    world_size=count("world_size"), nnodes=count("nnodes"), nproc_per_node=count("nproc_per_node"),
                    backend=text("backend"), status=text("status"),
                    versions=loads("versions", dict, lambda v: v is None or isinstance(v, str)),
                    figures={str(k): float(v) for k, v in figures.items()},
                    script=text("script") if "script" in row.keys() else None)  # older files: no such column
    rec.figures = possible_figures(rec)  # one an older ddp-doctor kept that cannot be real: left out
    return rec


def record_from_dict(d: Any) -> RunRecord | None:
    """A record as RunRecord.to_dict wrote it (an S3 object's), None when it is not one."""
    if not isinstance(d, dict):
        return None
    try:
        script = d.get("script")
        rec = RunRecord(time=float(d["time"]), kind=str(d["kind"]), host=str(d["host"]), job=d.get("job"),
                        instance_type=d.get("instance_type"), gpus=list(d.get("gpus") or []),
                        world_size=d.get("world_size"), nnodes=d.get("nnodes"),
                        nproc_per_node=d.get("nproc_per_node"), backend=d.get("backend"),
                        versions=dict(d.get("versions") or {}), status=d.get("status"),
                        figures={str(k): float(v) for k, v in (d.get("figures") or {}).items()},
                        script=script if isinstance(script, str) else None)
    except (KeyError, TypeError, ValueError):
        return None
    rec.figures = possible_figures(rec)
    return rec


def iter_series(records: list[RunRecord], like: RunRecord, figure: str) -> Iterator[tuple[float, float]]:
    """(time, value) of `figure` in the records of `like`'s series, oldest first."""
    key = series_of(like)
    for r in records:
        if series_of(r) == key and figure in r.figures:
            yield r.time, float(r.figures[figure])
