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


MAX_DUMP_ITEMS = 4_000_000  # values a dump may expand to, each memo reference counted whole
MAX_DUMP_DEPTH = 64  # containers within containers (a real dump nests about 6 deep)

# opcodes that push one value built from nothing on the stack
_SCALARS = frozenset((
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING",
    "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE",
    "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT", "BINFLOAT", "NONE", "NEWTRUE",
    "NEWFALSE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "EMPTY_SET", "GLOBAL"))
_INTO_TOP = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}  # pop n values into the container below them
_MARKED_INTO_TOP = frozenset(("APPENDS", "SETITEMS", "ADDITEMS"))
_MARKED_NEW = frozenset(("LIST", "TUPLE", "DICT", "FROZENSET"))
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_CALLS = {"REDUCE": 2, "NEWOBJ": 2, "NEWOBJ_EX": 3, "STACK_GLOBAL": 2}  # pop n, push the result


class DumpRefused(ValueError):
    """A dump not read, and why (DDP951 names it)."""


def check_pickle(raw: bytes) -> None:
    """Walk a pickle's opcodes without building anything, and refuse it (DumpRefused) when what
    loading it would make is too large: each value counts once for every place it appears (a memo
    reference, GET or DUP, counts as the whole value it refers to, so a "billion laughs" of nested
    references is refused before it is loaded or expanded), past MAX_DUMP_ITEMS in all; containers
    nested past MAX_DUMP_DEPTH; or an opcode a plain-data pickle never holds (persistent ids,
    extension codes, out-of-band buffers, INST/OBJ)."""
    import pickletools
    sizes: list[int] = []  # per stack value: how many values it stands for, once expanded
    depths: list[int] = []
    marks: list[int] = []
    memo: dict[Any, tuple[int, int]] = {}
    total = 0

    def push(size: int, depth: int) -> None:
        nonlocal total
        total += size
        if total > MAX_DUMP_ITEMS or size > MAX_DUMP_ITEMS:
            raise DumpRefused(f"it expands to more than {MAX_DUMP_ITEMS:,} values")
        if depth > MAX_DUMP_DEPTH:
            raise DumpRefused(f"it nests deeper than {MAX_DUMP_DEPTH} levels")
        sizes.append(size)
        depths.append(depth)

    def pop(n: int) -> tuple[int, int]:
        if n > len(sizes) - (marks[-1] if marks else 0):
            raise DumpRefused("its opcodes are malformed (a stack underflow)")
        size, depth = sum(sizes[len(sizes) - n:]), max(depths[len(depths) - n:], default=0)
        del sizes[len(sizes) - n:], depths[len(depths) - n:]
        return size, depth

    def pop_mark() -> tuple[int, int]:
        if not marks:
            raise DumpRefused("its opcodes are malformed (no mark)")
        start = marks[-1]
        got = pop(len(sizes) - start)
        marks.pop()
        return got

    try:
        for op, arg, _ in pickletools.genops(raw):
            name = op.name
            if name in _SCALARS:
                push(1, 0)
            elif name == "MARK":
                marks.append(len(sizes))
                if len(marks) > MAX_DUMP_DEPTH:
                    raise DumpRefused(f"it nests deeper than {MAX_DUMP_DEPTH} levels")
            elif name in _MARKED_NEW:
                size, depth = pop_mark()
                push(1 + size, depth + 1)
            elif name in _TUPLES:
                size, depth = pop(_TUPLES[name])
                push(1 + size, depth + 1)
            elif name in _INTO_TOP or name in _MARKED_INTO_TOP:
                size, depth = pop_mark() if name in _MARKED_INTO_TOP else pop(_INTO_TOP[name])
                if not sizes or (marks and len(sizes) <= marks[-1]):
                    raise DumpRefused("its opcodes are malformed (nothing to add to)")
                sizes[-1] += size
                depths[-1] = max(depths[-1], depth + 1)
                total += size
                if total > MAX_DUMP_ITEMS or sizes[-1] > MAX_DUMP_ITEMS:
                    raise DumpRefused(f"it expands to more than {MAX_DUMP_ITEMS:,} values")
                if depths[-1] > MAX_DUMP_DEPTH:
                    raise DumpRefused(f"it nests deeper than {MAX_DUMP_DEPTH} levels")
            elif name in _CALLS:
                size, depth = pop(_CALLS[name])
                push(1 + size, depth)
            elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                if not sizes:
                    raise DumpRefused("its opcodes are malformed (a memo of nothing)")
                memo[len(memo) if name == "MEMOIZE" else arg] = (sizes[-1], depths[-1])
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise DumpRefused("its opcodes are malformed (a memo reference to nothing)")
                push(*memo[arg])
            elif name == "DUP":
                if not sizes:
                    raise DumpRefused("its opcodes are malformed (DUP of nothing)")
                push(sizes[-1], depths[-1])
            elif name == "POP":
                pop(1) if sizes and not (marks and len(sizes) == marks[-1]) else pop_mark()
            elif name == "POP_MARK":
                pop_mark()
            elif name in ("PROTO", "FRAME"):
                continue
            elif name == "STOP":
                return
            else:  # PERSID, BINPERSID, EXT1/2/4, INST, OBJ, NEXT_BUFFER, READONLY_BUFFER
                raise DumpRefused(f"it holds the opcode {name}, which no plain-data dump holds")
    except DumpRefused:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as e:  # genops on junk
        raise DumpRefused(f"it is not a pickle ({e})") from None
    raise DumpRefused("it is cut (no STOP opcode)")


def load_why(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """One dump as plain JSON-like data (tuples become lists) and None, or None and why it was not
    read: a file that is not a dump, truncated, over MAX_DUMP_BYTES, expanding past
    MAX_DUMP_ITEMS values or MAX_DUMP_DEPTH levels (check_pickle: refused before it is loaded), or
    holding a global other than plain data (refused as it loads: never called)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_DUMP_BYTES + 1)
        if len(raw) > MAX_DUMP_BYTES:
            return None, f"larger than {MAX_DUMP_BYTES // (1024 * 1024)} MiB: not read"
        if raw[:1] == b"{":
            from ddp_doctor.facts.env_values import bounded_json
            data = bounded_json(raw.decode("utf-8"), max_depth=MAX_DUMP_DEPTH, max_bytes=MAX_DUMP_BYTES)
        else:
            import io
            check_pickle(raw)
            data = _DataOnly(io.BytesIO(raw)).load()
        data = json.loads(json.dumps(data, default=str))  # OrderedDict, tuples, bytes: plain JSON
    except DumpRefused as e:
        return None, f"refused: {e}"
    except pickle.UnpicklingError as e:
        return None, f"refused: {e}"
    except OSError as e:
        return None, f"unreadable: {e.strerror or e}"
    except ValueError as e:  # bounded_json's phrase: "larger than ...", "nested N levels deep ..."
        return None, f"it is {str(e)[:200]}"
    except RecursionError:
        return None, f"refused: it nests deeper than {MAX_DUMP_DEPTH} levels"
    except Exception:  # noqa: BLE001 - junk, a partial write: skipped
        return None, "truncated, or another format"
    if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
        return None, "a pickle that is no flight-recorder dump (no entries)"
    return data, None


def load(path: str) -> dict[str, Any] | None:
    """One dump as plain JSON-like data, or None for anything else (load_why says why)."""
    return load_why(path)[0]


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
