"""Wrappers around the data path: DataLoader.__init__ (which sampler, over what), DataLoader.__iter__
(one `Iteration` per epoch, for a loader's first MAX_ITERATIONS epochs), the loader iterator's
_next_index and __next__ (indices of the first K_BATCHES batches, content fingerprints of the first
HASH_BATCHES, time waited for each batch, whether collectives ran between the draws) and
DistributedSampler.set_epoch. Per batch the cost is a few attribute reads, two clock reads and the
process groups' sequence numbers (a getter each).

accelerate's prepared loaders (DataLoaderShard, DataLoaderDispatcher) are not DataLoaders: each holds
one as `base_dataloader` and iterates it. When that DataLoader is iterated, the object iterating it is
looked up (`_accelerate_wrapper`, by the attribute, not by import: accelerate is not a dependency)
and its mode recorded: `split_batches` (one batch of the original size cut into one slice per rank)
and `dispatch` (rank 0 loads and broadcasts; the other ranks' DataLoader is never drawn from).

At construction (and again at each iter, where accelerate may have swapped the samplers) the
arguments of the DistributedSampler the loader draws through are recorded (`sampler_args`:
num_replicas, rank, seed, shuffle, drop_last; found up to a few samplers deep, inside a sampler that
wraps it), with the loader's drop_last and, for a `Subset`, its base data set and the head of its
indices (`subset`): the sampler rules compare them across ranks (DDP850's cause, DDP851's second
split). Every batch's indices are counted (`samples`) and a pass that ran to its end is `complete`."""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

from ddp_doctor.training.probes.fingerprints import as_indices, sample_hashes
from ddp_doctor.training.probes.patching import record_quietly
from ddp_doctor.training.probes.recorder import (
    MAX_DATA_TIMES,
    Iteration,
    collectives_issued,
    current_recorder,
    group_is_up,
)

K_BATCHES = 8            # batches per epoch whose indices are kept
HASH_BATCHES = 4         # of those, batches whose samples' contents are fingerprinted (the costly part)
MAX_ITERATIONS = 4       # epochs per loader kept in full
SHUFFLING = ("RandomSampler", "SeedableRandomSampler", "SubsetRandomSampler", "WeightedRandomSampler")
SHARDING = ("BatchSamplerShard", "IterableDatasetShard", "DataLoaderShard", "DataLoaderDispatcher",
            "DistributedSampler", "DistributedSamplerWrapper", "DistributedBucketSampler",
            "UnrepeatedDistributedSampler", "UnrepeatedDistributedSamplerWrapper")
DISPATCHING = ("DataLoaderDispatcher",)


def set_epoch_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def set_epoch(self: Any, epoch: int) -> Any:
        rec = current_recorder()
        if rec is not None:
            record_quietly(rec, "set_epoch", lambda: rec.event(
                "set_epoch", epoch=epoch if isinstance(epoch, int) else str(epoch),
                shuffle=bool(getattr(self, "shuffle", False))))
        return orig(self, epoch)
    return set_epoch


SAMPLER_DEPTH = 3        # samplers looked into for a DistributedSampler wrapped inside another
SUBSET_HEAD = 8          # a Subset's first indices kept: enough to tell one rank's split from another's


def _wrapped_samplers(roots: list[Any]) -> list[Any]:
    """The samplers held by `roots`' attributes (a sampler that wraps another: `self.inner = ...`),
    breadth first, up to SAMPLER_DEPTH levels; a few attribute reads, once per loader."""
    from torch.utils.data import Sampler
    seen = {id(x) for x in roots}
    found: list[Any] = []
    level = list(roots)
    for _ in range(SAMPLER_DEPTH):
        nxt = []
        for obj in level:
            for v in list(getattr(obj, "__dict__", {}).values())[:32]:
                if isinstance(v, Sampler) and id(v) not in seen:
                    seen.add(id(v))
                    found.append(v)
                    nxt.append(v)
        level = nxt
    return found


def _sampler_args(samplers: list[Any]) -> dict[str, Any] | None:
    """The arguments of the first DistributedSampler among `samplers` (Lightning's and accelerate's
    subclasses included): what each rank's shard is made of."""
    from torch.utils.data.distributed import DistributedSampler
    for s in samplers:
        if isinstance(s, DistributedSampler):
            out: dict[str, Any] = {"class": type(s).__name__}
            for name in ("num_replicas", "rank", "seed", "shuffle", "drop_last"):
                v = getattr(s, name, None)
                out[name] = v if isinstance(v, (bool, int)) or v is None else str(v)[:40]
            return out
    return None


def _subset_info(dataset: Any) -> dict[str, Any] | None:
    """A torch Subset: its base data set, the base's size and the head of its indices."""
    from torch.utils.data import Subset
    if not isinstance(dataset, Subset):
        return None
    try:
        base_size = len(dataset.dataset)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a user's dataset's __len__ may raise anything: size unknown
        base_size = None
    try:
        head = [int(i) for i in list(dataset.indices[:SUBSET_HEAD])]
    except Exception:  # noqa: BLE001 - indices of an odd type: not compared
        head = None
    return {"base": type(dataset.dataset).__name__, "base_size": base_size, "head": head}


def sampler_info(loader: Any) -> dict[str, Any]:
    """What a DataLoader draws with: its samplers (accelerate's shards included), data set, batch
    size, whether it shuffles and whether it is sharded across ranks."""
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
    except Exception:  # noqa: BLE001 - a user's dataset's __len__ may raise anything: size unknown
        size = None
    from torch.utils.data import IterableDataset
    s = inner if inner is not None and type(sampler).__name__ == "SequentialSampler" else sampler
    shuffle = bool(type(s).__name__ in SHUFFLING or getattr(s, "shuffle", False)
                   or any(n in SHUFFLING for n in names))
    split = any(getattr(x, "split_batches", False) is True for x in (loader, batch_sampler, dataset))
    chain = [x for x in (sampler, batch_sampler, inner, batch_inner, deepest) if x is not None]
    wrapped = _wrapped_samplers(chain)
    args = _sampler_args(chain + wrapped)
    return {"class": type(loader).__name__, "sampler": type(sampler).__name__ if sampler is not None else None,
            "batch_sampler": type(batch_sampler).__name__ if batch_sampler is not None else None,
            "samplers": names, "dataset": type(dataset).__name__, "dataset_size": size,
            "map_style": not isinstance(dataset, IterableDataset),
            "batch_size": getattr(loader, "batch_size", None) or getattr(batch_sampler, "batch_size", None),
            "distributed": any(n in SHARDING for n in names) or args is not None or (
                hasattr(sampler, "num_replicas") and hasattr(sampler, "rank")),
            "shuffle": shuffle, "split_batches": split, "dispatch": type(loader).__name__ in DISPATCHING,
            "drop_last": bool(getattr(loader, "drop_last", False) or getattr(batch_sampler, "drop_last", False)),
            "sampler_args": args, "wrapped_samplers": [type(x).__name__ for x in wrapped][:8],
            "subset": _subset_info(dataset)}


def _accelerate_wrapper(loader: Any) -> Any:
    """The object iterating `loader` as its `base_dataloader` (accelerate's DataLoaderShard or
    DataLoaderDispatcher), found among the few frames that called DataLoader.__iter__; else None."""
    frame = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not loader and getattr(owner, "base_dataloader", None) is loader:
            return owner
        frame = frame.f_back
    return None


def wrapper_info(owner: Any) -> dict[str, Any]:
    """What an accelerate wrapper around a DataLoader adds: its class, split/dispatch mode."""
    name = type(owner).__name__
    return {"wrapper": name, "distributed": True,
            "split_batches": bool(getattr(owner, "split_batches", False) is True),
            "dispatch": name in DISPATCHING or callable(getattr(owner, "_fetch_batches", None))}


def _distributed_sampler(loader: Any) -> Any:
    from torch.utils.data.distributed import DistributedSampler
    for s in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if isinstance(s, DistributedSampler):
            return s
    return None


def loader_init_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        rec = current_recorder()
        if rec is None:
            return
        try:
            lid = len(rec.loaders)
            object.__setattr__(self, "_ddp_doctor_id", lid)
            e = rec.event("dataloader", id=lid, pg_initialized=group_is_up())
            rec.loaders[lid] = {"id": lid, "site": e["site"], **sampler_info(self)}
            e.update({k: rec.loaders[lid][k] for k in ("sampler", "dataset_size", "distributed")})
        except Exception:  # noqa: BLE001 - a probe never breaks the user's DataLoader
            pass
    return __init__


def loader_iter_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __iter__(self: Any) -> Any:
        it = orig(self)
        rec = current_recorder()
        lid = getattr(self, "_ddp_doctor_id", None)
        if rec is None or lid is None:
            return it
        try:
            try:
                length = len(self)
            except Exception:  # noqa: BLE001 - an iterable data set has no length (TypeError), or any
                length = None
            rec.current_pass = [lid, 0, False, length]
            it._ddp_doctor_pass = rec.current_pass
            its = rec.iterations.setdefault(lid, [])
            ds = _distributed_sampler(self)
            epoch = getattr(ds, "epoch", None) if ds is not None else None
            if lid in rec.loaders:
                rec.loaders[lid]["iterated"] = rec.loaders[lid].get("iterated", 0) + 1
                info = sampler_info(self)  # accelerate may swap samplers late
                owner = _accelerate_wrapper(self)
                if owner is not None:
                    split = info["split_batches"]
                    info.update(wrapper_info(owner))
                    info["split_batches"] = info["split_batches"] or split
                rec.loaders[lid].update(info)
            if len(its) >= MAX_ITERATIONS:
                it._ddp_doctor_state = None  # enough epochs kept: later ones cost nothing
                return it
            state = Iteration(rec, rec.loaders.get(lid, {}), len(its), epoch)
            its.append(state)
            it._ddp_doctor_state = state
        except Exception:  # noqa: BLE001 - a probe never breaks the user's DataLoader
            pass
        return it
    return __iter__


def next_index_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _next_index(self: Any) -> Any:
        idx = orig(self)
        state = getattr(self, "_ddp_doctor_state", None)
        if state is not None:
            try:
                state.samples += len(idx)
            except TypeError:  # no automatic batching: one index a draw
                state.samples += 1
            if len(state.indices) < K_BATCHES:
                state.indices.append(as_indices(idx))
        return idx
    return _next_index


def _counted(it: Any, orig: Callable[..., Any]) -> Any:
    """The next batch, counted in the pass (Recorder.current_pass), which a StopIteration ends."""
    passing = getattr(it, "_ddp_doctor_pass", None)
    if passing is None:
        return orig(it)
    try:
        data = orig(it)
    except StopIteration:
        passing[2] = True
        raise
    passing[1] += 1
    return data


def next_batch_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __next__(self: Any) -> Any:
        state = getattr(self, "_ddp_doctor_state", None)
        if state is None:
            return _counted(self, orig)
        state.steps_at_last = state.recorder.steps  # also on the call that ends the epoch
        state.ddp_at_last = state.recorder.ddp_work
        state.coll_at_last = collectives_issued()
        t0 = time.perf_counter()
        try:
            data = _counted(self, orig)
        except StopIteration:
            state.complete = True  # the pass ran to its end: its `samples` are the whole epoch
            raise
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
            except Exception:  # noqa: BLE001 - a user's batch may be anything: its hash is unknown
                state.hashes.append(None)
        if state.batches == K_BATCHES and state.number == 0:
            rec.flush()  # the first epoch's fingerprints survive a crash; later ones go at the end
        return data
    return __next__
