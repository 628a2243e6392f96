"""The record one process keeps while it trains: `Recorder` (events, optimizer steps, DataLoaders and
the `Iteration`s over them, parameter check sums) and how it is written as probe-PID.json in the run
directory; and this process's current recorder (`current_recorder`), which the wrappers record into.

The record is written at a few moments (first step, fingerprints complete, destroy_process_group,
end of the script, exit), never per batch.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any

from ddp_doctor.facts.frames import is_library_file, is_user_file
from ddp_doctor.training.probes.call_sites import user_site
from ddp_doctor.training.probes.fingerprints import tensor_sums
from ddp_doctor.training.records import probe_path, write_json

MAX_EVENTS = 400
MAX_DATA_TIMES = 512
# The names of the parameters each DDP model reduces (DDP's errors give only their indices): the
# last few models built, a bounded list of bounded names each.
MAX_DDP_MODELS = 4
MAX_PARAMETER_NAMES = 4096
PARAMETER_NAME_CHARS = 200
MAX_THREAD_ERRORS = 8

_current: "Recorder | None" = None
# Held while the current recorder is made or replaced and the wrappers are put in place.
STATE_LOCK = threading.Lock()


def int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def torch_dist() -> Any:
    """torch.distributed, imported on use: importing this module must not import torch."""
    import torch.distributed as dist
    return dist


def group_is_up() -> bool:
    """Whether the default process group exists."""
    try:
        dist = torch_dist()
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a torch that cannot say: no group, never a broken job
        return False


def collectives_issued() -> int | None:
    """How many collectives this process has issued on its live process groups: their sequence
    numbers summed (the C++-issued ones included: DDP's buckets, FSDP's gathers, DeepSpeed's
    reductions); 0 before torch.distributed is imported, None when torch cannot say. Read at every
    batch of a recorded pass: no import, a few attribute reads and one getter per group."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return 0
    try:
        groups = list(c10d._world.pg_map)
    except Exception:  # noqa: BLE001 - a torch without this registry
        return None
    total, read = 0, False
    for pg in groups:
        try:
            total += int(pg._get_sequence_number_for_group())
            read = True
        except Exception:  # noqa: BLE001 - a backend that keeps no sequence number
            continue
    return total if read or not groups else None


class Iteration:
    """One pass over a DataLoader (one `iter(loader)`): what the first K batches were made of, and
    what was done with them: `training` when an optimizer stepped between its first and last draw,
    `ddp_training` when a DDP model did training work then (its batches fed the distributed model),
    `collectives` when the process groups carried a collective then (None: unknown); `samples`: the
    indices drawn over the whole pass (counted, not kept), `complete` when the pass ran to its end
    (what the coverage rule, DDP851, adds up across ranks). Without a DDP
    model, an optimizer step with collectives around it is how FSDP, DeepSpeed or a hand-made
    all_reduce synchronise gradients; one without any trained each rank's model on its own."""

    __slots__ = ("loader", "number", "epoch", "steps_at_start", "steps_at_last", "batches",
                 "indices", "hashes", "data_times", "recorder", "done", "ddp_at_start", "ddp_at_last",
                 "coll_at_start", "coll_at_last", "samples", "complete")

    def __init__(self, recorder: "Recorder", loader: dict[str, Any], number: int, epoch: Any) -> None:
        self.recorder, self.loader, self.number, self.epoch = recorder, loader, number, epoch
        self.steps_at_start = self.steps_at_last = recorder.steps
        self.ddp_at_start = self.ddp_at_last = recorder.ddp_work
        self.coll_at_start = self.coll_at_last = collectives_issued()
        self.batches = 0
        self.indices: list[Any] = []
        self.hashes: list[Any] = []
        self.data_times: list[float] = []
        self.done = False
        self.samples = 0
        self.complete = False

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "epoch": self.epoch, "batches": self.batches,
                "training": self.steps_at_last > self.steps_at_start,
                "ddp_training": self.ddp_at_last > self.ddp_at_start,
                "collectives": (None if self.coll_at_start is None or self.coll_at_last is None
                                else self.coll_at_last != self.coll_at_start),
                "indices": self.indices, "hashes": self.hashes, "samples": self.samples,
                "complete": self.complete}


class Recorder:
    """Everything the probes saw in this process."""

    def __init__(self, out_dir: str | None) -> None:
        self.out_dir = out_dir
        self.pid = os.getpid()
        self.started = time.time()
        self.events: list[dict[str, Any]] = []
        self.steps = 0
        self.step_times: list[float] = []
        self.loaders: dict[int, dict[str, Any]] = {}
        self.iterations: dict[int, list[Iteration]] = {}
        self.data_times: dict[int, list[float]] = {}
        self.checksums: dict[str, dict[str, Any]] = {}
        self.ddp_modules: list[Any] = []   # weakrefs to DistributedDataParallel instances
        self.pg: dict[str, Any] = {}       # rank / world size / backend of the default group
        self.extra: dict[str, Any] = {}    # what callbacks add (Trainer arguments, ...)
        self.started_by: str | None = None  # a rank the script started: "ray" (a Ray worker) or "spawn"
        self.ended: dict[str, Any] | None = None
        # The latest pass over a DataLoader, every epoch (not only the ones kept in full):
        # [loader id, batches drawn, whether it ended (StopIteration), len(loader) or None]. A
        # rank whose pass ended while its peers' goes on ran out of batches first (uneven inputs).
        self.current_pass: list[Any] | None = None
        self.set_device_called = False
        # Training work on DistributedDataParallel models: forwards with autograd on (DDP then
        # all-reduces the gradients in backward) and optimizer steps over a DDP model's parameters.
        self.ddp_forwards = 0
        self.ddp_steps = 0
        # Per DDP model built (the last MAX_DDP_MODELS): its class, how many parameters its reducer
        # holds, and their names in the reducer's order (what DDP's error messages index).
        self.ddp_parameters: list[dict[str, Any]] = []
        # Threads of the script that died with an uncaught exception (the first MAX_THREAD_ERRORS)
        self.thread_errors: list[dict[str, Any]] = []

    # -- identity
    @property
    def rank(self) -> int | None:
        if self.pg.get("rank") is not None:
            return int(self.pg["rank"])
        return int_env("RANK")

    def adopt_group(self) -> None:
        """A process group made before the probes were installed (Lightning makes it before any
        callback runs; its launcher sets no RANK): take this process's rank from it."""
        if not self.pg and group_is_up():
            dist = torch_dist()
            self.pg = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                       "backend": str(dist.get_backend()), "site": None}

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        e = {"kind": kind, "t": time.time(), "site": user_site(), **data}
        if len(self.events) < MAX_EVENTS:
            self.events.append(e)
        return e

    def note_thread_error(self, args: Any) -> None:
        """threading.excepthook's `args`: a thread died with an exception; the record is written at
        once (the script goes on, and may end any way)."""
        name = getattr(args.thread, "name", None)
        if len(self.thread_errors) >= MAX_THREAD_ERRORS or args.exc_type is SystemExit or \
                str(name).startswith("ddp-doctor"):  # ddp-doctor's own threads are not the script's
            return
        frames = traceback.extract_tb(args.exc_traceback)
        user = next((f for f in reversed(frames) if is_user_file(f.filename)), None)
        call = next((f.name for f in frames if os.path.basename(f.filename) == "distributed_c10d.py"
                     and is_library_file(f.filename)), None)  # the outermost: the call the script made
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        self.thread_errors.append({
            "thread": name, "type": args.exc_type.__name__,
            "message": str(args.exc_value)[:500], "site": f"{user.filename}:{user.lineno} in {user.name}" if user
            else None, "call": call, "traceback": text[-4000:], "t": time.time()})
        self.flush(empty_too=True)

    def note_error(self, what: str, error: Exception) -> None:
        """A recording that failed: said in the record, never raised into the job."""
        self.extra.setdefault("probe_errors", []).append(f"{what}: {error!r}")

    @property
    def ddp_work(self) -> int:
        """A counter that moves whenever a DDP model does training work (see `Iteration`)."""
        return self.ddp_forwards + self.ddp_steps

    def note_ddp_parameters(self, model: str, names: list[str], count: int) -> None:
        """A DDP model was built: the names of the parameters its reducer indexes, in that order
        (`count` of them; at most MAX_PARAMETER_NAMES kept, each cut to PARAMETER_NAME_CHARS). The
        same list noted again (the model wrapped anew) moves to the end; the oldest goes first."""
        entry = {"model": model[:PARAMETER_NAME_CHARS], "count": int(count),
                 "names": [str(n)[:PARAMETER_NAME_CHARS] for n in names[:MAX_PARAMETER_NAMES]]}
        self.ddp_parameters = [e for e in self.ddp_parameters if e != entry][-(MAX_DDP_MODELS - 1):] + [entry]

    # -- steps and checksums
    def on_step(self, optimizer: Any, *_: Any) -> None:
        self.steps += 1
        if len(self.step_times) < MAX_DATA_TIMES:
            self.step_times.append(time.perf_counter())
        if self.steps == 1:
            self.checksum("first_step")
            self.flush()

    def checksum(self, point: str) -> None:
        """Sums of every parameter and buffer of the DDP-wrapped models (only those: FSDP and other
        sharded wrappers hold different shards on each rank by design)."""
        try:
            entries = []
            mods = [m() for m in self.ddp_modules]
            mods = [m for m in mods if m is not None]
            for i, m in enumerate(mods):
                prefix = f"model{i}." if len(mods) > 1 else ""
                inner = getattr(m, "module", m)
                entries += [(prefix + n, p, "param") for n, p in inner.named_parameters()]
                entries += [(prefix + n, b, "buffer") for n, b in inner.named_buffers()]
            if entries:
                self.checksums[point] = {"step": self.steps, "t": time.time(), **tensor_sums(entries)}
        except Exception as e:  # noqa: BLE001 - a probe never breaks the job
            self.note_error(f"checksum {point}", e)

    # -- output
    def to_dict(self) -> dict[str, Any]:
        loaders = []
        for lid, info in self.loaders.items():
            times = self.data_times.get(lid, [])
            loaders.append({**info, "iterations": [it.to_dict() for it in self.iterations.get(lid, [])],
                            "data_times": times})
        return {"pid": self.pid, "rank": self.rank, "local_rank": int_env("LOCAL_RANK"),
                "world_size": self.pg.get("world_size") or int_env("WORLD_SIZE"),
                "host": os.uname().nodename, "started": self.started, "time": time.time(),
                "pg": self.pg, "events": self.events, "steps": self.steps,
                "step_interval": median_interval(self.step_times), "script": script_identity(),
                "ddp_forwards": self.ddp_forwards, "ddp_steps": self.ddp_steps,
                "ddp_models": len(self.ddp_modules), "ddp_parameters": self.ddp_parameters,
                "loaders": loaders, "checksums": self.checksums, "extra": self.extra, "ended": self.ended,
                **({"thread_errors": self.thread_errors} if self.thread_errors else {}),
                **({"started_by": self.started_by} if self.started_by else {})}

    def flush(self, *, empty_too: bool = False) -> None:
        """Write the record; `empty_too`: even when nothing was recorded (a rank's script that
        ended: that it did nothing is what DDP876 judges)."""
        if not self.out_dir or os.getpid() != self.pid:
            return
        if not (self.events or self.steps or self.loaders or empty_too):
            return  # a helper process that did nothing worth reporting
        write_json(probe_path(self.out_dir, self.pid), self.to_dict())

    def end_by_os_exit(self, status: Any) -> None:
        """The script called os._exit(status): its end, with the line, written now (no exit handler
        runs after it, and no record of the script's end would come)."""
        self.end(how="os_exit", status=status if isinstance(status, int) else None, site=user_site())
        self.flush(empty_too=True)

    def end(self, **data: Any) -> None:
        """The script ended: last checksum, whether the process group is still up, flush."""
        if self.ended is not None:
            return
        self.adopt_group()
        if "end" not in self.checksums and self.steps:
            self.checksum("end")
        self.ended = {"t": time.time(), "pg_initialized": group_is_up(), **data}
        self.flush(empty_too=data.get("how") == "script")  # the rank's script ended: kept even if empty


def script_identity(argv: list[str] | None = None) -> dict[str, str] | None:
    """What the script ran was: {"name": its file name (or module), "key": a digest of its content
    and its arguments}, so a later run's step time is compared only with runs of the same script
    and arguments (the history, DDP409). The arguments themselves are never kept (secrets)."""
    import hashlib

    from ddp_doctor.preflight_ranks.rank_view import script_digest
    argv = list(sys.argv if argv is None else argv)
    if not argv or not argv[0]:
        return None
    h = hashlib.sha256((script_digest(argv[0]) or {}).get("sha256", argv[0]).encode())
    for arg in argv[1:]:
        h.update(b"\0" + str(arg).encode("utf-8", "replace"))
    return {"name": os.path.basename(argv[0]) or argv[0], "key": h.hexdigest()[:12]}


def median_interval(times: list[float]) -> float | None:
    if len(times) < 3:
        return None
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return gaps[len(gaps) // 2]


# ------------------------------------------------------------------ this process's recorder

def current_recorder() -> Recorder | None:
    """The recorder of this process, None where nothing records (or in a forked child that has not
    made its own: a DataLoader worker is not ours to record)."""
    rec = _current
    if rec is not None and rec.pid != os.getpid():
        return None
    return rec


def make_current(out_dir: str | None) -> tuple[Recorder, bool]:
    """This process's recorder, made if there is none of this process yet (then True); an existing
    one without a run directory takes `out_dir`. Call with STATE_LOCK held."""
    global _current
    if _current is None or _current.pid != os.getpid():
        _current = Recorder(out_dir)
        return _current, True
    if out_dir and not _current.out_dir:
        _current.out_dir = out_dir
    return _current, False


def renew_after_fork() -> None:
    """In a forked child: start an empty record of its own (it becomes a rank if it initialises a
    process group: ranks started with the fork start method)."""
    global _current
    rec = _current
    if rec is not None and rec.pid != os.getpid():
        _current = Recorder(rec.out_dir)
