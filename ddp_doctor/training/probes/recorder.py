"""In-training probes: a per-process timeline of what the script does with torch.distributed, and
fingerprints of what each rank trains on, recorded while the real job runs.

`install()` wraps a few torch entry points in place (init_process_group, destroy_process_group,
cuda.set_device, DistributedDataParallel, DataLoader and its iterator, DistributedSampler.set_epoch,
Trainer.__init__ once transformers is imported) and registers an optimizer step hook. The wrappers only record and then
call the original: no collective is added, nothing the script sees changes. Per batch the cost is a
few attribute reads and two clock reads; the first K batches of a loader's first 4 epochs also keep
their indices (the first 4 a per-sample content fingerprint), and parameters are check-summed after the first optimizer
step and at the end.

The record of a process is written as a file in the run directory (probe-PID.json), at a few
moments (first step, fingerprints complete, destroy_process_group, end of the script, exit), never
per batch. `probe_rules.py` turns the records of all ranks into findings; the fingerprints
themselves are in `fingerprints.py`.

Child interpreters the script starts (torch.multiprocessing.spawn, subprocess) get the probes
through `site/sitecustomize.py` on PYTHONPATH, the way coverage.py measures subprocesses.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable

from ddp_doctor.training import TOOL_DIR
from ddp_doctor.training.probes.fingerprints import as_indices, sample_hashes, tensor_sums
from ddp_doctor.training.probes.import_hooks import when_imported

PROBE_DIR_ENV = "DDP_DOCTOR_PROBE_DIR"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
K_BATCHES = 8            # batches per epoch whose indices are kept
HASH_BATCHES = 4         # of those, batches whose samples' contents are fingerprinted (the costly part)
MAX_ITERATIONS = 4       # epochs per loader kept in full
MAX_EVENTS = 400
MAX_DATA_TIMES = 512
SHUFFLING = ("RandomSampler", "SeedableRandomSampler", "SubsetRandomSampler", "WeightedRandomSampler")
SHARDING = ("BatchSamplerShard", "IterableDatasetShard", "DataLoaderShard", "DataLoaderDispatcher",
            "DistributedSampler", "DistributedSamplerWrapper", "DistributedBucketSampler")

_recorder: "Recorder | None" = None
_patched = False
_lock = threading.Lock()


def _here() -> str:
    return TOOL_DIR


def user_site() -> str | None:
    """file:line of the innermost frame outside ddp-doctor, torch and the standard library: where
    the script (or the library it called) did what is recorded."""
    from ddp_doctor.training.run.watchdog import _skip_dirs
    skip = _skip_dirs()
    frames = [(f.f_code.co_filename, line) for f, line in traceback.walk_stack(sys._getframe(1))]
    for name, line in frames:
        if not name.startswith(skip) and not name.startswith("<"):
            return f"{name}:{line}"
    # a training package installed in site-packages: its innermost frame outside torch and us
    torch_mod = sys.modules.get("torch")
    ours = (_here(), *([os.path.dirname(os.path.abspath(torch_mod.__file__))] if torch_mod else []))
    for name, line in frames:
        if not name.startswith(ours) and not name.startswith("<") and "site-packages" in name:
            return f"{name}:{line}"
    return None


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _dist() -> Any:
    import torch.distributed as dist
    return dist


def _pg_up() -> bool:
    try:
        dist = _dist()
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001
        return False


class Iteration:
    """One pass over a DataLoader (one `iter(loader)`): what the first K batches were made of."""

    __slots__ = ("loader", "number", "epoch", "steps_at_start", "steps_at_last", "batches",
                 "indices", "hashes", "data_times", "recorder", "done")

    def __init__(self, recorder: "Recorder", loader: dict[str, Any], number: int, epoch: Any) -> None:
        self.recorder, self.loader, self.number, self.epoch = recorder, loader, number, epoch
        self.steps_at_start = self.steps_at_last = recorder.steps
        self.batches = 0
        self.indices: list[Any] = []
        self.hashes: list[Any] = []
        self.data_times: list[float] = []
        self.done = False

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "epoch": self.epoch, "batches": self.batches,
                "training": self.steps_at_last > self.steps_at_start,
                "indices": self.indices, "hashes": self.hashes}


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
        self.ended: dict[str, Any] | None = None
        self.set_device_called = False

    # -- identity
    @property
    def rank(self) -> int | None:
        if self.pg.get("rank") is not None:
            return int(self.pg["rank"])
        return _int_env("RANK")

    def adopt_group(self) -> None:
        """A process group made before the probes were installed (Lightning makes it before any
        callback runs; its launcher sets no RANK): take this process's rank from it."""
        if not self.pg and _pg_up():
            dist = _dist()
            self.pg = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                       "backend": str(dist.get_backend()), "site": None}

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        e = {"kind": kind, "t": time.time(), "site": user_site(), **data}
        if len(self.events) < MAX_EVENTS:
            self.events.append(e)
        return e

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
            self.extra.setdefault("probe_errors", []).append(f"checksum {point}: {e!r}")

    # -- output
    def to_dict(self) -> dict[str, Any]:
        loaders = []
        for lid, info in self.loaders.items():
            times = self.data_times.get(lid, [])
            loaders.append({**info, "iterations": [it.to_dict() for it in self.iterations.get(lid, [])],
                            "data_times": times})
        return {"pid": self.pid, "rank": self.rank, "local_rank": _int_env("LOCAL_RANK"),
                "world_size": self.pg.get("world_size") or _int_env("WORLD_SIZE"),
                "host": os.uname().nodename, "started": self.started, "time": time.time(),
                "pg": self.pg, "events": self.events, "steps": self.steps,
                "step_interval": _median_interval(self.step_times),
                "loaders": loaders, "checksums": self.checksums, "extra": self.extra, "ended": self.ended}

    def flush(self) -> None:
        if not self.out_dir or os.getpid() != self.pid:
            return
        if not (self.events or self.steps or self.loaders):
            return  # a helper process that did nothing worth reporting
        from ddp_doctor.training.records import probe_path, write_json
        write_json(probe_path(self.out_dir, self.pid), self.to_dict())

    def end(self, **data: Any) -> None:
        """The script ended: last checksum, whether the process group is still up, flush."""
        if self.ended is not None:
            return
        self.adopt_group()
        if "end" not in self.checksums and self.steps:
            self.checksum("end")
        self.ended = {"t": time.time(), "pg_initialized": _pg_up(), **data}
        self.flush()


def _median_interval(times: list[float]) -> float | None:
    if len(times) < 3:
        return None
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return gaps[len(gaps) // 2]


# ------------------------------------------------------------------ install

def recorder() -> Recorder | None:
    rec = _recorder
    if rec is not None and rec.pid != os.getpid():
        return None  # a forked child (a DataLoader worker): not ours to record
    return rec


def install(out_dir: str | None) -> Recorder:
    """Start recording in this process (idempotent); returns the recorder."""
    global _recorder
    with _lock:
        if _recorder is None or _recorder.pid != os.getpid():
            _recorder = Recorder(out_dir)
            atexit.register(_at_exit)
        elif out_dir and not _recorder.out_dir:
            _recorder.out_dir = out_dir
        _patch()
    return _recorder


def _at_exit() -> None:
    rec = recorder()
    if rec is not None:
        rec.end(how="exit")


def _after_fork_in_child() -> None:
    global _recorder
    rec = _recorder
    if rec is not None and rec.pid != os.getpid():
        # A forked child starts with an empty record of its own: it becomes a rank if it
        # initialises a process group (ranks started with the fork start method).
        _recorder = Recorder(rec.out_dir)


def _before_fork() -> None:
    rec = recorder()
    if rec is None:
        return
    try:
        import torch
        if not torch.cuda.is_initialized():
            return
    except Exception:  # noqa: BLE001
        return
    stack = [f.filename for f in traceback.extract_stack()]
    if any(os.path.join("torch", "utils", "data") in s for s in stack):
        return  # DataLoader workers fork after CUDA by design; they do not touch CUDA
    rec.event("fork_after_cuda")
    rec.flush()


def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    orig = getattr(owner, name)
    if getattr(orig, "_ddp_doctor_probe", False):
        return
    new = make(orig)
    functools.update_wrapper(new, orig)
    new._ddp_doctor_probe = True  # type: ignore[attr-defined]
    new._ddp_doctor_orig = orig  # type: ignore[attr-defined]
    setattr(owner, name, new)


def _patch() -> None:
    global _patched
    if _patched:
        return
    _patched = True
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    init = _make_init(c10d.init_process_group)
    for owner in (dist, c10d):
        _wrap(owner, "init_process_group", lambda orig: init)
    destroy = _make_destroy(c10d.destroy_process_group)
    for owner in (dist, c10d):
        _wrap(owner, "destroy_process_group", lambda orig: destroy)
    _wrap(torch.cuda, "set_device", _make_set_device)
    _wrap(DistributedDataParallel, "__init__", _make_ddp_init)
    from torch.utils.data.distributed import DistributedSampler
    _wrap(DistributedSampler, "set_epoch", _make_set_epoch)
    _wrap(DataLoader, "__init__", _make_loader_init)
    _wrap(DataLoader, "__iter__", _make_loader_iter)
    _wrap(_BaseDataLoaderIter, "_next_index", _make_next_index)
    _wrap(_BaseDataLoaderIter, "__next__", _make_next)
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(_on_step)
    except Exception:  # noqa: BLE001
        pass
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    when_imported("transformers.trainer", _patch_trainer)


def _on_step(optimizer: Any, *args: Any) -> None:
    rec = recorder()
    if rec is not None:
        rec.on_step(optimizer, *args)


def _called_from_library() -> bool:
    """Whether the code that called into torch (past torch's and ddp-doctor's own frames) is an
    installed library (Trainer/accelerate, Lightning) rather than the user's script."""
    import sysconfig
    torch_dir = os.path.dirname(os.path.dirname(os.path.abspath(_dist().__file__)))
    libs = tuple({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    for frame, _ in traceback.walk_stack(sys._getframe(1)):
        name = frame.f_code.co_filename
        if name.startswith((torch_dir, _here())) or name.startswith("<"):
            continue
        return name.startswith(libs)
    return False


def _quietly(rec: Recorder, what: str, record: Callable[[], Any]) -> Any:
    """Run a wrapper's recording; whatever goes wrong in it is noted in the record, never raised
    into the user's call (which then runs, and fails or not, exactly as without the probes)."""
    try:
        return record()
    except Exception as e:  # noqa: BLE001 - a probe never breaks the job
        rec.extra.setdefault("probe_errors", []).append(f"{what}: {e!r}")
        return None


def _make_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        rec = recorder()
        if rec is None:
            return orig(*args, **kwargs)
        def before() -> dict[str, Any]:
            backend = kwargs.get("backend", args[0] if args else None)
            timeout = kwargs.get("timeout")
            already = _pg_up()
            e = rec.event("init_process_group", backend=str(backend) if backend is not None else None,
                          timeout_s=timeout.total_seconds() if hasattr(timeout, "total_seconds") else None,
                          already_initialized=already, by_library=_called_from_library(),
                          previous_site=rec.pg.get("site") if already else None)
            if already:
                rec.flush()  # torch is about to refuse: keep the record
            return e

        def after(e: dict[str, Any] | None) -> None:
            dist = _dist()
            rec.pg = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                      "backend": str(dist.get_backend()), "site": (e or {}).get("site")}
            if e is not None:
                e["ok"] = True

        e = _quietly(rec, "init_process_group", before)
        result = orig(*args, **kwargs)
        _quietly(rec, "init_process_group", lambda: after(e))
        return result
    return init_process_group


def _make_destroy(orig: Callable[..., Any]) -> Callable[..., Any]:
    def destroy_process_group(group: Any = None) -> Any:
        rec = recorder()
        if rec is not None and group is None and _pg_up():
            def before() -> None:
                rec.event("destroy_process_group")
                if rec.steps:
                    rec.checksum("end")
                rec.flush()
                share_across_nodes(rec)
            _quietly(rec, "destroy_process_group", before)
        return orig(group) if group is not None else orig()
    return destroy_process_group


STORE_WAIT = 15.0  # seconds rank 0 waits for the other nodes' records at destroy_process_group


def share_across_nodes(rec: Recorder) -> None:
    """Ranks on other nodes write their records in another directory: while the process group is
    still up, every rank puts its record in the group's store and rank 0 copies the others into
    its run directory (bounded waits, no collective), so its report covers every node."""
    try:
        dist = _dist()
        world = dist.get_world_size()
        local = _int_env("LOCAL_WORLD_SIZE") or _int_env("OMPI_COMM_WORLD_LOCAL_SIZE")
        if not rec.out_dir or world <= 1 or local is None or local >= world:
            return
        from ddp_doctor.training.probes.session import gather
        from ddp_doctor.training.records import write_json
        store = dist.distributed_c10d._get_default_store()
        rank = dist.get_rank()
        store.set(f"ddp_doctor/node-records/{rank}", json.dumps(rec.to_dict(), default=str))
        if rank != 0:
            return
        got, _ = gather(store, "ddp_doctor/node-records", world, STORE_WAIT)
        for d in got:
            if d.get("rank") not in (None, 0):
                write_json(os.path.join(rec.out_dir, f"probe-remote-{d['rank']}.json"), d)
    except Exception as e:  # noqa: BLE001 - a probe never breaks the job
        rec.extra.setdefault("probe_errors", []).append(f"share across nodes: {e!r}")


def _make_set_device(orig: Callable[..., Any]) -> Callable[..., Any]:
    def set_device(device: Any) -> Any:
        rec = recorder()
        if rec is not None:
            rec.set_device_called = True
            _quietly(rec, "set_device", lambda: rec.event("set_device", device=str(device)))
        return orig(device)
    return set_device


def _make_set_epoch(orig: Callable[..., Any]) -> Callable[..., Any]:
    def set_epoch(self: Any, epoch: int) -> Any:
        rec = recorder()
        if rec is not None:
            _quietly(rec, "set_epoch", lambda: rec.event("set_epoch", epoch=epoch if isinstance(epoch, int) else
                                                         str(epoch), shuffle=bool(getattr(self, "shuffle", False))))
        return orig(self, epoch)
    return set_epoch


def _module_device(module: Any) -> str | None:
    for p in getattr(module, "parameters", lambda: [])():
        return str(p.device)
    return None


def _make_ddp_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        rec = recorder()
        if rec is None:
            return orig(self, module, *args, **kwargs)
        _quietly(rec, "DistributedDataParallel", lambda: _record_ddp(rec, module, args, kwargs))
        orig(self, module, *args, **kwargs)
        rec.ddp_modules.append(weakref.ref(self))
    return __init__


def _record_ddp(rec: Recorder, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    import torch
    pg_up = _pg_up()
    device_ids = kwargs.get("device_ids", args[0] if args else None)
    current = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    backend = str(_dist().get_backend()) if pg_up else None
    count = torch.cuda.device_count() if backend == "nccl" else 0
    rec.event("ddp", pg_initialized=pg_up, device_ids=[str(d) for d in device_ids] if device_ids else None,
              module_device=_module_device(module), current_device=current, device_count=count,
              set_device_called=rec.set_device_called, backend=backend, module_class=type(module).__name__)
    if not pg_up:
        rec.flush()  # the constructor is about to fail: keep the record


def _sampler_info(loader: Any) -> dict[str, Any]:
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else None
    batch_inner = getattr(batch_sampler, "batch_sampler", None)  # accelerate's shards wrap one
    deepest = getattr(batch_inner, "sampler", None)
    names = [type(x).__name__ for x in (loader, sampler, batch_sampler, inner, batch_inner, deepest)
             if x is not None]
    dataset = getattr(loader, "dataset", None)
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001
        size = None
    from torch.utils.data import IterableDataset
    s = inner if inner is not None and type(sampler).__name__ == "SequentialSampler" else sampler
    shuffle = bool(type(s).__name__ in SHUFFLING or getattr(s, "shuffle", False)
                   or any(n in SHUFFLING for n in names))
    return {"class": type(loader).__name__, "sampler": type(sampler).__name__ if sampler is not None else None,
            "batch_sampler": type(batch_sampler).__name__ if batch_sampler is not None else None,
            "samplers": names, "dataset": type(dataset).__name__, "dataset_size": size,
            "map_style": not isinstance(dataset, IterableDataset),
            "batch_size": getattr(loader, "batch_size", None) or getattr(batch_sampler, "batch_size", None),
            "distributed": any(n in SHARDING for n in names) or (
                hasattr(sampler, "num_replicas") and hasattr(sampler, "rank")),
            "shuffle": shuffle}


def _distributed_sampler(loader: Any) -> Any:
    from torch.utils.data.distributed import DistributedSampler
    for s in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if isinstance(s, DistributedSampler):
            return s
    return None


def _make_loader_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        rec = recorder()
        if rec is None:
            return
        try:
            lid = len(rec.loaders)
            object.__setattr__(self, "_ddp_doctor_id", lid)
            e = rec.event("dataloader", id=lid, pg_initialized=_pg_up())
            rec.loaders[lid] = {"id": lid, "site": e["site"], **_sampler_info(self)}
            e.update({k: rec.loaders[lid][k] for k in ("sampler", "dataset_size", "distributed")})
        except Exception:  # noqa: BLE001
            pass
    return __init__


def _make_loader_iter(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __iter__(self: Any) -> Any:
        it = orig(self)
        rec = recorder()
        lid = getattr(self, "_ddp_doctor_id", None)
        if rec is None or lid is None:
            return it
        try:
            its = rec.iterations.setdefault(lid, [])
            ds = _distributed_sampler(self)
            epoch = getattr(ds, "epoch", None) if ds is not None else None
            if lid in rec.loaders:
                rec.loaders[lid]["iterated"] = rec.loaders[lid].get("iterated", 0) + 1
                rec.loaders[lid].update(_sampler_info(self))  # accelerate may swap samplers late
            if len(its) >= MAX_ITERATIONS:
                it._ddp_doctor_state = None  # enough epochs kept: later ones cost nothing
                return it
            state = Iteration(rec, rec.loaders.get(lid, {}), len(its), epoch)
            its.append(state)
            it._ddp_doctor_state = state
        except Exception:  # noqa: BLE001
            pass
        return it
    return __iter__


def _make_next_index(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _next_index(self: Any) -> Any:
        idx = orig(self)
        state = getattr(self, "_ddp_doctor_state", None)
        if state is not None and len(state.indices) < K_BATCHES:
            state.indices.append(as_indices(idx))
        return idx
    return _next_index


def _make_next(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __next__(self: Any) -> Any:
        state = getattr(self, "_ddp_doctor_state", None)
        if state is None:
            return orig(self)
        state.steps_at_last = state.recorder.steps  # also on the call that ends the epoch
        t0 = time.perf_counter()
        data = orig(self)
        dt = time.perf_counter() - t0
        rec = state.recorder
        state.batches += 1
        times = rec.data_times.setdefault(state.loader.get("id", -1), [])
        if len(times) < MAX_DATA_TIMES:
            times.append(dt)
        if state.batches <= HASH_BATCHES:
            i = state.batches - 1
            idx = state.indices[i] if i < len(state.indices) else None
            try:
                state.hashes.append(sample_hashes(data, len(idx) if idx else None))
            except Exception:  # noqa: BLE001
                state.hashes.append(None)
        if state.batches == K_BATCHES and state.number == 0:
            rec.flush()  # the first epoch's fingerprints survive a crash; later ones go at the end
        return data
    return __next__


def _patch_trainer(module: Any) -> None:
    trainer = getattr(module, "Trainer", None)
    if trainer is None:
        return

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            rec = recorder()
            if rec is not None:
                _quietly(rec, "Trainer", lambda: note_trainer(kwargs.get("model", args[0] if args else None)))
            return orig(self, *args, **kwargs)
        return __init__
    _wrap(trainer, "__init__", make)


def note_trainer(model: Any) -> None:
    """Record a Trainer being built, and whether its model is already wrapped in DDP."""
    rec = recorder()
    if rec is None or any(e["kind"] == "trainer" for e in rec.events):
        return
    from torch.nn.parallel import DistributedDataParallel
    wrapped = isinstance(model, DistributedDataParallel)
    inner = model.module if wrapped else model
    rec.event("trainer", model_class=type(inner).__name__ if inner is not None else None, ddp_wrapped=wrapped)


def install_in_child() -> None:
    """From sitecustomize: record this interpreter once it imports torch (not before: importing
    torch at start-up would slow down every Python the script starts)."""
    out_dir = os.environ.get(PROBE_DIR_ENV)
    if not out_dir:
        return
    when_imported("torch", lambda _m: install(out_dir))


def child_env(env: dict[str, str], out_dir: str) -> None:
    """Make Python processes started with `env` record too (PYTHONPATH + the probe directory)."""
    env[PROBE_DIR_ENV] = out_dir
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *parts])
