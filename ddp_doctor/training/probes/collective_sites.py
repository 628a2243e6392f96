"""Where the script called each Python-level collective (`dist.all_reduce`, `dist.barrier`, ...):
what torch's flight recorder lacks. Each call leaves (start, end, op, user file:line) in a bounded
ring; the ledger writer gives a recorder entry the site of the call whose time window holds the
entry's creation time (the window of a call still running is open). DDP's own collectives (its
bucket all_reduces) are issued from C++ and have no Python site: they keep none.

Cost: one short stack walk per Python-level call (about 1 us, bench/overhead.py --cases ledger);
nothing per DDP gradient bucket. The walk keeps the frame's code object and instruction offset, and
the line number is worked out only when the calls are read (at a dump): `f_lineno` scans the code's
line table from its start, which for a loop at the end of a long module costs tens of us a call.
"""
from __future__ import annotations

import collections
import sys
import threading
import time
import types
from typing import Any, Callable

from ddp_doctor.facts.frames import is_user_file

MAX_CALLS = 2000  # the flight recorder's default buffer here: as many calls as entries kept

_calls: collections.deque[list[Any]] = collections.deque(maxlen=MAX_CALLS)
_local = threading.local()
_recorded = 0  # calls ever appended (more than MAX_CALLS: the oldest were dropped)
# Without torch's flight recorder (torch before 2.5 on gloo) these calls are the ledger: each also
# keeps its process group and tensors (`enable_detail`).
_detail = False


_user_files: dict[str, bool] = {}  # file name -> the user's code (not a library's, not ours)
_LAZY_LINES = hasattr(types.CodeType, "co_lines")  # Python 3.10 on


def _is_user_file(name: str) -> bool:
    user = _user_files.get(name)
    if user is None:
        if len(_user_files) > 4096:  # bounded, whatever the script compiles
            _user_files.clear()
        user = _user_files[name] = is_user_file(name)
    return user


OUTER_SITES = 3  # the callers' lines kept above the call's own: where a helper that reduces was called


def _site() -> tuple[Any, tuple[Any, ...]]:
    """Where the script called the wrapper: its innermost frame outside the libraries and
    ddp-doctor, as (code, instruction offset), made "file:line" by `_resolve` when the calls are
    read (on Python 3.9, "file:line" at once); and the next OUTER_SITES frames of the user's code
    around it, innermost first (an `evaluate()` that reduces, called under `if rank == 0:`)."""
    f = sys._getframe(2)
    found: list[Any] = []
    while f is not None and len(found) <= OUTER_SITES:
        code = f.f_code
        if _is_user_file(code.co_filename):
            found.append((code, f.f_lasti) if _LAZY_LINES else f"{code.co_filename}:{f.f_lineno}")
        f = f.f_back
    return (found[0], tuple(found[1:])) if found else (None, ())


def _line(code: types.CodeType, offset: int) -> int | None:
    """The line of the instruction at byte `offset` (what the frame's f_lineno said then)."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line
    return None


def _resolve(site: Any, memo: dict[tuple[int, int], str]) -> str | None:
    if not isinstance(site, tuple):
        return site
    code, offset = site
    key = (id(code), offset)  # not the code itself: hashing a code object hashes all its constants
    text = memo.get(key)
    if text is None:
        line = _line(code, offset)
        text = memo[key] = f"{code.co_filename}:{line if line is not None else code.co_firstlineno}"
    return text


def collective_wrapper(op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            if getattr(_local, "inside", False):  # all_gather_object calls all_gather: one site
                return orig(*args, **kwargs)
            global _recorded
            # start, end, op, the user's line, the call's details (without a flight recorder), the
            # callers' lines
            call = [time.time_ns(), None, op, None, None, ()]
            try:
                call[3], call[5] = _site()
                if _detail:
                    call[4] = _describe_call(args, kwargs)
            except Exception:  # noqa: BLE001 - a probe never breaks the call
                pass
            _calls.append(call)
            _recorded += 1
            _local.inside = True
            try:
                return orig(*args, **kwargs)
            finally:
                _local.inside = False
                call[1] = time.time_ns()
        return collective
    return make


def calls() -> list[list[Any]]:
    """[start_ns, end_ns or None while running, op, site, [the callers' sites]] of the calls kept,
    oldest first."""
    memo: dict[tuple[int, int], str] = {}
    return [[c[0], c[1], c[2], _resolve(c[3], memo), [_resolve(o, memo) for o in c[5]]] for c in list(_calls)]


# ------------------------------------------------------------ without torch's flight recorder

_DTYPES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
           "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def enable_detail() -> None:
    global _detail
    _detail = True


def _tensors(value: Any) -> list[Any]:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(hasattr(v, "shape") for v in value):
        return list(value)
    return []


def _describe_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, list[list[int]], list[str]]:
    """(process group, input sizes, input dtypes) of a call, as the flight recorder names them."""
    group = kwargs.get("group")
    if group is None:
        group = next((a for a in args if type(a).__name__.startswith("ProcessGroup")), None)
    pg = "0"
    if group is not None:
        try:
            import torch.distributed as dist
            pg = str(dist.distributed_c10d._get_process_group_name(group))
        except Exception:  # noqa: BLE001 - a private torch call: a group it cannot name is named by its id
            pg = f"group-{id(group)}"
    tensors = next((t for t in (_tensors(a) for a in (*args, *kwargs.values())) if t), [])
    return (pg, [list(t.shape) for t in tensors],
            [_DTYPES.get(str(t.dtype).rsplit(".", 1)[-1], str(t.dtype)) for t in tensors])


def fallback_dump() -> dict[str, Any] | None:
    """The calls kept, shaped like the flight recorder's dump (per-group sequence numbers counted
    from the first call kept); None when they were not kept in detail."""
    if not _detail:
        return None
    memo: dict[tuple[int, int], str] = {}
    seq: dict[str, int] = {}
    entries = []
    first = _recorded - len(_calls)
    for i, c in enumerate(list(_calls)):
        pg, sizes, dtypes = c[4] or ("0", [], [])
        seq[pg] = seq.get(pg, 0) + 1
        entries.append({
            "record_id": first + i, "collective_seq_id": seq[pg], "process_group": [pg, ""],
            "profiling_name": f"python:{c[2]}", "input_sizes": sizes, "input_dtypes": dtypes,
            "time_created_ns": c[0], "retired": c[1] is not None, "is_p2p": False,
            "user_site": _resolve(c[3], memo), "user_op": c[2],
            **({"user_callers": [_resolve(o, memo) for o in c[5]]} if c[5] else {})})
    return {"entries": entries, "pg_config": {}, "source": "python_calls"}


def annotate(entries: list[dict[str, Any]], recorded: list[list[Any]] | None = None) -> None:
    """Give each flight recorder entry created inside a recorded call that call's `user_site`
    (and `user_op`, the function the script called)."""
    recorded = calls() if recorded is None else recorded
    if not recorded:
        return
    starts = [c[0] for c in recorded]
    import bisect
    for e in entries:
        created = e.get("time_created_ns")
        if not isinstance(created, int) or not created:
            continue
        i = bisect.bisect_right(starts, created) - 1  # the latest call started before the entry
        if i < 0:
            continue
        start, end, op, site = recorded[i][:4]
        if (end is None or created <= end) and site:
            e["user_site"], e["user_op"] = site, op
            callers = recorded[i][4] if len(recorded[i]) > 4 else []
            if callers:
                e["user_callers"] = callers
