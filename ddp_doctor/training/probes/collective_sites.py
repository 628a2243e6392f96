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
import mmap
import os
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
_on_failure: list[Callable[[], None]] = []
# Without torch's flight recorder (torch before 2.5 on gloo) these calls are the ledger: each also
# keeps its process group and tensors (`enable_detail`).
_detail = False


# The newest call, also in a file mapped in memory (keep_calls_in): what survives a native abort or
# SIGKILL of the process, where the ring above does not.
NOTE_BYTES = 4096
_note: mmap.mmap | None = None

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
                if _detail or _note is not None:
                    call[4] = _describe_call(args, kwargs, op)
                if _note is not None:
                    _write_note(op, call[4], call[0])
            except Exception:  # noqa: BLE001 - a probe never breaks the call
                pass
            _calls.append(call)
            _recorded += 1
            _local.inside = True
            try:
                return orig(*args, **kwargs)
            except Exception:
                call[1] = time.time_ns()  # ended, as the ledger the hook leaves says
                _failed()
                raise
            finally:
                _local.inside = False
                call[1] = time.time_ns()
        return collective
    return make


def on_failure(hook: Callable[[], None]) -> None:
    """Call `hook` when a collective raises, before the exception goes on (a rank whose exception
    its script's framework keeps, Ray Train's workers: its ledger is left then, child_beat.py)."""
    _on_failure.append(hook)


def _failed() -> None:
    for hook in _on_failure:
        try:
            hook()
        except Exception:  # noqa: BLE001 - a probe never changes the exception the script sees
            pass


def keep_calls_in(path: str) -> None:
    """Also keep the newest call's operation, process group and tensors in `path` (0600), a file
    mapped in memory: the kernel keeps what was written when the process dies at once (gloo's
    abort on a collective mismatch, SIGKILL), so the call a crashed rank was inside is known with
    its tensors (read_note). About 3 us more per Python-level call; nothing per DDP bucket."""
    global _note
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, NOTE_BYTES)
        _note = mmap.mmap(fd, NOTE_BYTES)
    finally:
        os.close(fd)


def _write_note(op: str, described: tuple[str, list[list[int]], list[str]] | None, start_ns: int) -> None:
    pg, sizes, dtypes = described or ("0", [], [])
    # tab-separated Python literals: a json.dumps costs several times more per call
    data = f"{_recorded + 1}\t{op}\t{pg!r}\t{sizes!r}\t{dtypes!r}\t{start_ns}\n".encode()
    if _note is not None and len(data) <= NOTE_BYTES:
        _note[: len(data)] = data


def read_note(path: str) -> dict[str, Any] | None:
    """The newest call a process kept in `path` (keep_calls_in): {"n", "op", "pg", "input_sizes",
    "input_dtypes", "time_ns"}, or None."""
    import ast
    try:
        with open(path, "rb") as f:
            head = f.read(NOTE_BYTES).split(b"\n", 1)[0].decode("utf-8")
        n, op, pg, sizes, dtypes, start = head.split("\t")
        note = {"n": int(n), "op": op, "pg": str(ast.literal_eval(pg)), "input_sizes": ast.literal_eval(sizes),
                "input_dtypes": ast.literal_eval(dtypes), "time_ns": int(start)}
    except (OSError, ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return note if isinstance(note["input_sizes"], list) and isinstance(note["input_dtypes"], list) else None


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


# Collectives whose input is not their first argument (the output comes first): the argument's
# position and keyword. The others take their input first (all_reduce(tensor), broadcast(tensor),
# gather(tensor, gather_list), scatter's source is its list).
_INPUT_ARGUMENT = {
    "all_gather": (1, "tensor"), "all_gather_into_tensor": (1, "input_tensor"),
    "all_gather_coalesced": (1, "input_tensor_list"), "reduce_scatter": (1, "input_list"),
    "reduce_scatter_tensor": (1, "input"), "all_to_all": (1, "input_tensor_list"),
    "all_to_all_single": (1, "input"),
}


def _describe_call(args: tuple[Any, ...], kwargs: dict[str, Any],
                   op: str = "") -> tuple[str, list[list[int]], list[str]]:
    """(process group, input sizes, input dtypes) of a call, as the flight recorder names them: the
    input tensors (all_gather's own tensor, not the list it gathers into)."""
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
    where = _INPUT_ARGUMENT.get(op)
    if where is not None:
        position, name = where
        tensors = _tensors(args[position] if len(args) > position else kwargs.get(name))
    else:
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
