"""The NCCL flight recorder's own dumps, read as ledgers of collectives (checks/collectives.py).

When an NCCL collective times out, torch's NCCL watchdog writes every rank's flight recorder to
a file (TORCH_NCCL_DUMP_ON_TIMEOUT; the rank that timed out tells the others through the store),
then aborts the process (SIGABRT): the rank may never reach the point where ddp-doctor writes its
own ledger-RANK.json. `ddp-doctor run` points these dumps into the run directory
(:func:`dump_env`) and reads them back here (:func:`read_dumps`), each as a ledger of the same
shape as ledger-RANK.json (source "nccl_dump", position "hung": it was written on a timeout).

Names, from torch's sources (c10d DebugInfoWriter::getWriter, FlightRecorder): the file is
PREFIX + global rank; PREFIX comes from TORCH_FR_DUMP_TEMP_FILE, then the older
TORCH_NCCL_DEBUG_INFO_TEMP_FILE (torch before the rename reads only that one, default
/tmp/nccl_trace_rank_; newer torch ~/.cache/torch/comm_lib_trace_rank_). With
TORCH_FR_DUMP_DYNAMIC_FILE_NAME set, torch writes to the variable's exact value with no rank
suffix: then the user names the files and ddp-doctor leaves the prefix alone.

The files are pickles written by torch's C++ pickler (dicts, lists, tuples, strings, numbers). They
are read with a restricted unpickler that builds plain containers only: any other global (a class,
a function such as os.system) is refused and the file skipped, so reading a dump never runs code.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import pickle
import re
from typing import Any

from ddp_doctor.facts.env_values import env_bool
from ddp_doctor.facts.own_env import default_own, set_own

DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"
OLD_DUMP_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"  # torch before the flight recorder's rename
DYNAMIC_NAME_ENV = "TORCH_FR_DUMP_DYNAMIC_FILE_NAME"  # torch writes to the exact value, no rank suffix
DUMP_ON_TIMEOUT_ENV = "TORCH_NCCL_DUMP_ON_TIMEOUT"
FILE_PREFIX = "nccl-fr-rank-"
MAX_DUMP_BYTES = 32 * 1024 * 1024  # a dump of 2000 entries with stacks is a few MiB; read whole, per rank


def dump_prefix(run_dir: str) -> str:
    return os.path.join(run_dir, FILE_PREFIX)


def dump_env(env: Any, run_dir: str) -> None:
    """Dump on timeout, into the run directory, unless the user chose where (or to not dump)."""
    default_own(env, DUMP_ON_TIMEOUT_ENV, "1")
    if DUMP_ENV in env or OLD_DUMP_ENV in env or env_bool(env, DYNAMIC_NAME_ENV):
        return  # the user's own dump location: never moved
    for name in (DUMP_ENV, OLD_DUMP_ENV):  # a per-node path, ddp-doctor's: never compared across nodes
        set_own(env, name, dump_prefix(run_dir))


def aids_env(env: Any, run_dir: str) -> None:
    """NCCL's own debugging aids for the ranks of `ddp-doctor run`, each unless the user set it:
    its INFO log for INIT and NET (which network it chose: EFA through aws-ofi-nccl, or TCP
    sockets; read by DDP335) into the run directory rather than the user's output, the heartbeat
    monitor of torch's NCCL watchdog, and error handling that tears the job down on a timeout
    (torch before 2.2 defaulted to none, and a timed-out rank hung). Each value set here is marked
    as ddp-doctor's own (facts/own_env.py): the cross-rank comparison (DDP706) reads the user's."""
    from ddp_doctor.facts.efa import nccl_log_env
    nccl_log_env(env, run_dir)
    default_own(env, "TORCH_NCCL_ENABLE_MONITORING", "1")
    default_own(env, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "480")  # torch's default, said explicitly
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env and "NCCL_ASYNC_ERROR_HANDLING" not in env:
        if torch_before(2, 2):
            set_own(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")


def torch_before(major: int, minor: int) -> bool:
    """Whether the installed torch is older than major.minor (True when it cannot be told)."""
    try:
        from importlib.metadata import version
        found = re.match(r"(\d+)\.(\d+)", version("torch"))
    except Exception:  # noqa: BLE001 - no torch metadata: assume the older names are needed
        return True
    return found is None or (int(found.group(1)), int(found.group(2))) < (major, minor)


# ------------------------------------------------------------------------------------ reading

def _same(value: Any, *_: Any) -> Any:
    return value


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


# What torch's C++ pickler may write besides plain containers; each maps to a pure function of
# ours (never to torch's or anything importable): type tags and specialised lists become data.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch.jit._pickle", "restore_type_tag"): _same,
    ("torch.jit._pickle", "build_intlist"): _as_list,
    ("torch.jit._pickle", "build_doublelist"): _as_list,
    ("torch.jit._pickle", "build_boollist"): _as_list,
}


class _DataOnly(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        target = _ALLOWED.get((module, name))
        if target is None:
            raise pickle.UnpicklingError(f"refused global {module}.{name} in a flight recorder dump")
        return target

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused persistent id in a flight recorder dump")


def load(path: str) -> dict[str, Any] | None:
    """One dump as plain JSON-like data (tuples become lists), or None for anything else: a
    file that is not a dump, truncated, too large, or holding a global other than plain data."""
    try:
        if os.path.getsize(path) > MAX_DUMP_BYTES:
            return None
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:1] == b"{":
            data = json.loads(raw.decode("utf-8"))  # a JSON dump
        else:
            import io
            data = _DataOnly(io.BytesIO(raw)).load()
        data = json.loads(json.dumps(data, default=str))  # OrderedDict, tuples, bytes: plain JSON
    except Exception:  # noqa: BLE001 - junk, a refused global, a partial write: skipped
        return None
    if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
        return None
    return data


def _pg_of(entry: dict[str, Any]) -> str:
    pg = entry.get("process_group")
    return str(pg[0]) if isinstance(pg, list) and pg else str(entry.get("pg_id"))


def _latest_incarnation(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Without the script's start time: the entries of each process group since its sequence
    numbers last restarted (the preflight's default group, destroyed before the script made its
    own, counts from 1 again under the same name)."""
    ordered = sorted(entries, key=lambda e: _int(e.get("record_id")))
    start: dict[str, int] = {}  # group -> index in `ordered` where its latest incarnation begins
    last: dict[str, int] = {}
    for i, e in enumerate(ordered):
        seq = _int(e.get("collective_seq_id"))
        if e.get("is_p2p") or not seq:
            continue
        key = _pg_of(e)
        if key in last and seq <= last[key]:
            start[key] = i
        last[key] = seq
    return [e for i, e in enumerate(ordered) if i >= start.get(_pg_of(e), 0)]


def as_ledger(path: str, data: dict[str, Any], rank: int, since_ns: int | None = None) -> dict[str, Any]:
    """A dump in the shape of ledger-RANK.json: its entries since `since_ns` (the script's start,
    from the rank's own ledger) when known, else those of the latest incarnation of each group."""
    everything = [e for e in data.get("entries") or [] if isinstance(e, dict)]
    if since_ns:
        entries = [e for e in everything if _int(e.get("time_created_ns")) >= since_ns]
    else:
        entries = _latest_incarnation(everything)
    try:
        when = os.path.getmtime(path)
    except OSError:
        when = 0.0
    return {"rank": rank, "pid": None, "time": when, "source": "nccl_dump", "position": "hung",
            "steps": None, "where": None, "since_ns": since_ns or 0,
            "complete": any(e.get("record_id") == 0 for e in everything), "entries": entries,
            "pg_config": data.get("pg_config") if isinstance(data.get("pg_config"), dict) else {},
            "path": path, "version": data.get("version")}


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def dump_files(run_dir: str) -> dict[int, str]:
    """rank -> the dump file of that rank in the run directory."""
    out: dict[int, str] = {}
    pattern = re.compile(re.escape(FILE_PREFIX) + r"(\d+)$")
    for p in glob.glob(os.path.join(glob.escape(run_dir), FILE_PREFIX + "*")):
        m = pattern.match(os.path.basename(p))
        if m and os.path.isfile(p):
            out[int(m.group(1))] = p
    return out


def read_dumps(run_dir: str, ledgers: dict[int, dict[str, Any]] | None = None,
               since: float = 0.0) -> dict[int, dict[str, Any]]:
    """Every readable dump of the run directory (written at `since` or later) as a ledger; the
    script's start comes from the rank's own ledger, else the earliest of the others' (every
    rank's preflight ends before any rank's script begins)."""
    ledgers = ledgers or {}
    starts = [int(d["since_ns"]) for d in ledgers.values() if isinstance(d, dict) and _int(d.get("since_ns")) > 0]
    fallback = min(starts) if starts else None
    out: dict[int, dict[str, Any]] = {}
    for rank, path in sorted(dump_files(run_dir).items()):
        try:
            if os.path.getmtime(path) < since:
                continue
        except OSError:
            continue
        data = load(path)
        if data is None:
            continue
        own = ledgers.get(rank) or {}
        since_ns = _int(own.get("since_ns")) or fallback
        out[rank] = as_ledger(path, data, rank, since_ns)
    return out


def merged(run_dir: str, ledgers: dict[int, dict[str, Any]], since: float = 0.0) -> dict[int, dict[str, Any]]:
    """The ranks' ledgers with the NCCL dumps: for a rank with both, the newer one (the dump is
    written when NCCL's watchdog timed out; the rank may have been aborted before its ledger)."""
    from ddp_doctor.training import records
    out = dict(ledgers)
    dumps = read_dumps(run_dir, ledgers, since)
    beats = records.read_heartbeats(run_dir) if dumps else {}
    for rank, dumped in dumps.items():
        own = out.get(rank)
        if own is None or float(dumped["time"]) >= float(own.get("time") or 0):
            hb = beats.get(rank) or {}  # where the rank was last seen, and its steps
            where = hb.get("where") or hb.get("innermost")
            dumped["where"] = str(where) if where else None
            dumped["steps"] = hb.get("steps") if isinstance(hb.get("steps"), int) else None
            out[rank] = dumped
    return out
