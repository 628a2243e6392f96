"""What each process passed to init_process_group, written the moment it calls it (init-PID.json in
the run directory), before the call can block: the explicit rank / world_size, the rendezvous
variables at the call and at the script's start, the launcher's own values, and the call site.
A rank that passed rank=0 by hand waits inside init until torch's timeout; the parent reads these
records while it waits and names the problem at once (checks/init_arguments.py).

Also in the processes the script starts itself (torch.multiprocessing.spawn, multiprocessing,
subprocess: children.py installs the probes there): the values exactly as passed (`rank_passed`,
`world_size_passed`, world_size=0 included), the text of each argument at the call
(`world_size=training_args.n_gpu`), and, in a child of torch.multiprocessing.spawn, how many
processes that spawn started and which one this is (`spawn`): `spawn_wrapper` leaves them in
SPAWN_ENV for the children it starts.
"""
from __future__ import annotations

import ast
import json
import linecache
import operator
import os
import sys
import threading
import time
from typing import Any, Callable

from ddp_doctor.training.probes.call_sites import user_site
from ddp_doctor.training.records import JOB_FIELD, current_job, init_call_path, write_json

RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# init_process_group(backend, init_method, timeout, world_size, rank, store, ...): positions of
# the arguments read here, as torch (1.x to 2.13) declares them.
_POSITIONS = {"backend": 0, "init_method": 1, "world_size": 3, "rank": 4}

SPAWN_ENV = "DDP_DOCTOR_SPAWNED_BY"  # {"parent": pid, "nprocs": n, "site": file:line} while a spawn starts
TEXT_LIMIT = 80  # characters of an argument's source text kept

_launcher: dict[str, Any] = {}  # the rank process's own values, set before the script starts
_env_writes: dict[str, dict[str, Any]] = {}  # variable -> {"value", "site"}: the script's last write of it


def env_write_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """os.environ's __setitem__ (item assignment, update, setdefault): for a rendezvous variable,
    the value and the user's line that set it, so an init record can say where a MASTER_PORT that
    differs between ranks came from."""
    def __setitem__(self: Any, key: Any, value: Any) -> None:
        orig(self, key, value)
        if self is os.environ and key in RENDEZVOUS_VARS:
            try:
                _env_writes[key] = {"value": value, "site": user_site()}
            except Exception:  # noqa: BLE001 - a probe never breaks the call
                pass
    return __setitem__


def env_set_sites() -> dict[str, str]:
    """Where this process set the rendezvous variables it holds now: {"MASTER_PORT": "train.py:12"}."""
    return {k: str(w["site"]) for k, w in _env_writes.items()
            if w.get("site") and os.environ.get(k) == w.get("value")}


def remember_launcher(launcher_rank: int | None, launcher_world: int | None) -> None:
    """Called by the rank process before it runs the script: what the launcher gave it, and the
    rendezvous variables as they were then (the script may change them)."""
    _launcher.update(pid=os.getpid(), rank=launcher_rank, world_size=launcher_world,
                     env={k: os.environ.get(k) for k in RENDEZVOUS_VARS})


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    pos = _POSITIONS[name]
    return args[pos] if len(args) > pos else None


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _passed(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> int | None:
    """The value passed for `name` when it is a whole number (torch's default, -1, included)."""
    v = _argument(args, kwargs, name)
    if v is None or isinstance(v, bool):
        return None
    try:
        return operator.index(v)  # an int, a numpy integer; not a float or a string
    except TypeError:
        return None


def _parsed(site: str | None, line_source: Callable[[str], list[str]]) -> tuple[str, int, str, Any] | None:
    """(path, line, source, tree) of the file a "file:line" site names; None when it cannot be read
    or parsed."""
    if not site or ":" not in site:
        return None
    path, _, line_text = site.rpartition(":")
    try:
        line = int(line_text)
        source = "".join(line_source(path))
        tree = ast.parse(source) if source else None
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return None
    return path, line, source, tree


def argument_texts(site: str | None, line_source: Callable[[str], list[str]] = linecache.getlines) -> dict[str, str]:
    """The source text of rank=, world_size= and init_method= in the init_process_group call at
    `site` (file:line): `{"world_size": "training_args.n_gpu"}`. Empty when it cannot be read."""
    parsed = _parsed(site, line_source)
    if parsed is None:
        return {}
    _, line, source, tree = parsed
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and n.lineno <= line <= (n.end_lineno or n.lineno)
             and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == "init_process_group"] if tree else []
    if not calls:
        return {}
    call = min(calls, key=lambda n: (n.end_lineno or n.lineno) - n.lineno)  # the innermost
    out: dict[str, str] = {}
    for name, pos in _POSITIONS.items():
        if name == "backend":
            continue
        node = next((k.value for k in call.keywords if k.arg == name), None)
        if node is None and len(call.args) > pos and not any(isinstance(a, ast.Starred) for a in call.args[:pos + 1]):
            node = call.args[pos]
        text = ast.get_source_segment(source, node) if node is not None else None
        if text:
            text = " ".join(text.split())
            out[name] = text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT - 3] + "..."
    return out


def assignment_of(site: str | None, name: str,
                  line_source: Callable[[str], list[str]] = linecache.getlines) -> dict[str, str] | None:
    """Where a bare name passed to init_process_group at `site` (file:line) was computed: the last
    `name = ...` above the call in its file (`{"text": "rank = int(os.environ['LOCAL_RANK'])",
    "site": "train.py:8"}`); None when it cannot be read. A courtesy for the message, never a verdict."""
    parsed = _parsed(site, line_source) if name.isidentifier() else None
    if parsed is None:
        return None
    path, line, source, tree = parsed
    found = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
             and n.lineno < line
             and any(isinstance(t, ast.Name) and t.id == name
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))] if tree else []
    if not found:
        return None
    node = max(found, key=lambda n: n.lineno)
    text = " ".join((ast.get_source_segment(source, node) or "").split())
    if not text:
        return None
    return {"text": text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT - 3] + "...", "site": f"{path}:{node.lineno}"}


def spawn_of_this_process() -> dict[str, Any] | None:
    """In a child of torch.multiprocessing.spawn / start_processes: the spawn that started it
    (its parent's pid, how many processes it started, its call site) and this child's index."""
    try:
        info = json.loads(os.environ.get(SPAWN_ENV) or "null")
    except ValueError:
        return None
    if not isinstance(info, dict) or info.get("parent") != os.getppid():
        return None  # set by a grandparent: this process was started some other way
    index = None
    frame = sys._getframe(1)
    while frame is not None:  # torch.multiprocessing.spawn._wrap(fn, i, args, error_file)
        code = frame.f_code
        if code.co_name == "_wrap" and code.co_filename.endswith(os.path.join("multiprocessing", "spawn.py")):
            i = frame.f_locals.get("i")
            index = i if isinstance(i, int) else None
            break
        frame = frame.f_back
    return {**info, "index": index}


def call_record(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    rank_arg, world_arg = _as_int(_argument(args, kwargs, "rank")), _as_int(_argument(args, kwargs, "world_size"))
    init_method = _argument(args, kwargs, "init_method")
    launched = _launcher.get("pid") == os.getpid()  # the rank process itself, not a child it started
    site = user_site()
    texts: dict[str, str] = {}
    computed = None
    try:
        texts = argument_texts(site)
        computed = assignment_of(site, texts.get("rank", ""))
    except Exception:  # noqa: BLE001 - the texts are a courtesy
        pass
    spawn = None if launched else spawn_of_this_process()
    return {
        "pid": os.getpid(), "ppid": os.getppid(), "host": os.uname().nodename, "time": time.time(), "done": False,
        # the job this process agreed on at its preflight: a later job on the same port (the same
        # run directory for hand-started ranks) never reads this call as its own
        **({JOB_FIELD: current_job()} if current_job() else {}),
        "site": site,
        "rank_arg": rank_arg if rank_arg is not None and rank_arg >= 0 else None,
        "world_size_arg": world_arg if world_arg is not None and world_arg > 0 else None,
        "rank_passed": _passed(args, kwargs, "rank"), "world_size_passed": _passed(args, kwargs, "world_size"),
        "arg_text": texts,
        **({"rank_computed": computed} if computed else {}),
        "init_method": str(init_method) if init_method is not None else None,
        "store_given": kwargs.get("store") is not None,
        "env": {k: os.environ.get(k) for k in RENDEZVOUS_VARS},
        **({"env_set_at": sites} if (sites := env_set_sites()) else {}),
        "launched_rank": launched,
        **({"launcher": {k: _launcher.get(k) for k in ("rank", "world_size", "env")}} if launched else {}),
        **({"spawn": spawn} if spawn else {}),
    }


def init_arguments_wrapper(out_dir: Callable[[], str | None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            path = None
            lock = threading.Lock()  # the record is rewritten by the claim's watch too

            def write_claims(claims: dict[str, Any]) -> None:
                with lock:
                    rec["claims"] = claims
                    write_json(path, rec)  # type: ignore[arg-type]

            try:
                d = out_dir()
                if d:
                    rec = call_record(args, kwargs)
                    path = init_call_path(d, rec["pid"])
                    write_json(path, rec)
            except Exception:  # noqa: BLE001 - a probe never breaks the call
                path = None
            if path:
                try:  # the rank claimed, in the job's store: a duplicate on another node is seen
                    from ddp_doctor.training.probes.rank_claims import claim_rank
                    claims = claim_rank(rec, write_claims)
                    if claims:
                        write_claims(claims)
                except Exception:  # noqa: BLE001 - a probe never breaks the call
                    pass
            ok = False
            try:
                result = orig(*args, **kwargs)
                ok = True
                return result
            finally:
                if path:
                    try:
                        with lock:
                            rec["done"], rec["ok"], rec["ended"] = True, ok, time.time()
                            write_json(path, rec)
                    except Exception:  # noqa: BLE001 - a probe never breaks the call
                        pass
        return init_process_group
    return make


def spawn_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """torch.multiprocessing.start_processes (which mp.spawn calls): while it starts the processes,
    SPAWN_ENV tells each child who started it and how many were started (its init record keeps it:
    a world size other than that is judged without waiting for torch's timeout)."""
    def start_processes(*args: Any, **kwargs: Any) -> Any:
        before = os.environ.get(SPAWN_ENV)
        try:
            n = kwargs.get("nprocs", args[2] if len(args) > 2 else 1)
            os.environ[SPAWN_ENV] = json.dumps({"parent": os.getpid(), "nprocs": int(n), "site": user_site()})
        except Exception:  # noqa: BLE001 - a probe never breaks the call
            pass
        try:
            return orig(*args, **kwargs)
        finally:
            if before is None:
                os.environ.pop(SPAWN_ENV, None)
            else:
                os.environ[SPAWN_ENV] = before
    return start_processes
