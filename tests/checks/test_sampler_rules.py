"""Which DataLoaders the in-training sampler rules judge (checks/sampler.py), on records shaped as
the probes write them: a loader is a sharding bug (DDP850, DDP853) only when its batches feed the
DDP model's training; a plain reference model trained on the full data on every rank is not one;
evaluation on every rank over the whole set is DDP854 (info); accelerate's split_batches and
dispatch_batches loaders are sharded by design. Each rule has its failing and its passing case."""
from __future__ import annotations

from ddp_doctor.checks.sampler import sampler_rules
from ddp_doctor.checks.training_probes import probe_findings
from ddp_doctor.registry import REGISTRY

FULL = [[0, 1, 2, 3], [4, 5, 6, 7]]          # the first batches of a loader every rank draws in full
SHARD = {0: [[0, 2, 4, 6], [8, 10, 12, 14]], 1: [[1, 3, 5, 7], [9, 11, 13, 15]]}


def record(rank: int, loaders: list[dict], *, ddp_forwards: int = 12, ddp_steps: int = 12, **kw) -> dict:
    rec = {"rank": rank, "local_rank": rank, "world_size": 2, "host": "algo-1", "pid": 100 + rank,
           "pg": {"rank": rank, "world_size": 2, "backend": "gloo"}, "events": [], "steps": 24,
           "ddp_forwards": ddp_forwards, "ddp_steps": ddp_steps, "loaders": loaders, "checksums": {},
           "extra": {}, "ended": None}
    rec.update(kw)
    return rec


def loader(site: str, iterations: list[dict], **kw) -> dict:
    ld = {"id": 0, "site": site, "class": "DataLoader", "sampler": "RandomSampler",
          "samplers": ["DataLoader", "RandomSampler", "BatchSampler"], "dataset": "Points", "dataset_size": 64,
          "map_style": True, "batch_size": 4, "distributed": False, "shuffle": True, "split_batches": False,
          "dispatch": False, "iterations": iterations, "data_times": []}
    ld.update(kw)
    return ld


def it(indices: list[list[int]], *, training: bool, ddp: bool, number: int = 0) -> dict:
    """One pass: `training` an optimizer stepped between its draws, `ddp` the DDP model trained."""
    return {"number": number, "epoch": None, "batches": len(indices), "training": training,
            "ddp_training": ddp, "indices": indices, "hashes": [None] * len(indices)}


def both(make) -> dict[int, dict]:
    return {r: make(r) for r in (0, 1)}


def ids_of(findings) -> list[str]:
    return sorted(f.id for f in findings)


# ------------------------------------------------------------------ loaders that feed the DDP model

def test_unsharded_loader_feeding_the_ddp_model_is_an_error_a_sharded_one_is_not():
    bad = both(lambda r: record(r, [loader("train.py:30", [it(FULL, training=True, ddp=True)])]))
    [f] = sampler_rules(bad)
    assert f.id == "DDP850" and f.severity == "error" and f.ranks == [0, 1]
    assert "train.py:30" in f.message and "8 of 16" in f.message and "padding allows 4" in f.message
    good = both(lambda r: record(r, [loader("train.py:30", [it(SHARD[r], training=True, ddp=True)],
                                            sampler="DistributedSampler", distributed=True)]))
    assert sampler_rules(good) == []


def test_unsharded_ddp_loader_without_early_overlap_is_a_warning_a_reference_loader_is_not():
    own = {0: [[0, 1, 2, 3]], 1: [[10, 11, 12, 13]]}  # each rank shuffled with its own seed
    bad = both(lambda r: record(r, [loader("train.py:30", [it(own[r], training=True, ddp=True)])]))
    assert ids_of(sampler_rules(bad)) == ["DDP853"]
    ref = both(lambda r: record(r, [loader("train.py:40", [it(own[r], training=True, ddp=False)])]))
    assert sampler_rules(ref) == []


# ------------------------------------------------------------------ a reference model outside DDP

def test_full_data_loader_feeding_a_plain_reference_model_is_not_a_sharding_bug():
    # Every rank trains a plain (non-DDP) copy on the whole data on purpose, next to a DDP model fed
    # by a sharded loader: optimizer steps happen between the reference loader's draws, but no DDP work.
    def rec(r: int) -> dict:
        return record(r, [
            loader("test.py:69", [it(FULL, training=True, ddp=False), it(FULL, training=True, ddp=False, number=1)]),
            loader("test.py:80", [it(SHARD[r], training=True, ddp=True)], sampler="DistributedSampler",
                   distributed=True)])
    assert sampler_rules(both(rec)) == []
    assert [f for f in probe_findings(both(rec).values()) if f.category == "sampler"] == []


def test_without_a_trained_ddp_model_every_optimizer_loader_is_judged_as_before():
    # FSDP, DeepSpeed, gradients all-reduced by hand, or records of an older probe: no DDP work is
    # recorded, so a loader iterated while an optimizer stepped is the training loader.
    fsdp = both(lambda r: record(r, [loader("train.py:30", [it(FULL, training=True, ddp=False)])],
                                 ddp_forwards=0, ddp_steps=0))
    assert ids_of(sampler_rules(fsdp)) == ["DDP850"]
    old = both(lambda r: record(r, [loader("train.py:30", [{k: v for k, v in it(FULL, training=True, ddp=False).items()
                                                            if k != "ddp_training"}])],
                                ddp_forwards=0, ddp_steps=0))
    assert ids_of(sampler_rules(old)) == ["DDP850"]


# ------------------------------------------------------------------ evaluation

def test_every_rank_evaluating_the_whole_set_is_info_a_sharded_evaluation_is_silent():
    def rec(r: int, eval_indices: list[list[int]], **kw) -> dict:
        kw = {"sampler": "SequentialSampler", "shuffle": False, **kw}
        return record(r, [
            loader("train.py:30", [it(SHARD[r], training=True, ddp=True)], sampler="DistributedSampler",
                   distributed=True),
            loader("train.py:50", [it(eval_indices, training=False, ddp=False)], **kw)])
    [f] = sampler_rules(both(lambda r: rec(r, FULL)))
    assert f.id == "DDP854" and f.severity == "info" and f.category == "sampler" and f.ranks == [0, 1]
    assert "train.py:50" in f.message and "SequentialSampler" in f.message and "8 of 16" in f.message
    assert "evaluation" in f.message
    assert sampler_rules(both(lambda r: rec(r, SHARD[r], sampler="DistributedSampler", distributed=True))) == []
    # One batch per pass (`next(iter(loader))` then a step): what followed the draw is not seen.
    assert sampler_rules(both(lambda r: rec(r, [list(range(8))]))) == []
    # Evaluation on rank 0 only (the other ranks wait at a barrier): nothing to say.
    only0 = both(lambda r: rec(r, FULL if r == 0 else []))
    only0[1]["loaders"][1]["iterations"] = []
    assert sampler_rules(only0) == []


def test_full_evaluation_is_never_an_error_or_warning():
    entry = REGISTRY["DDP854"]
    assert entry.severity == "info" and entry.category == "sampler"
    assert "What:" in entry.doc and "Fix:" in entry.doc


# ------------------------------------------------------------------ accelerate's modes

def test_accelerate_split_batches_same_indices_on_every_rank_is_by_design():
    # split_batches=True: one batch of the original size, each rank keeping its slice: where a
    # wrapper loads the whole batch on each rank, the recorded indices are the same on every rank.
    split = both(lambda r: record(r, [loader("data_loader.py:441", [it(FULL, training=True, ddp=True)],
                                             wrapper="DataLoaderShard", split_batches=True, distributed=True)]))
    assert sampler_rules(split) == []
    # Without the split mode the same records are a sharding bug.
    plain = both(lambda r: record(r, [loader("data_loader.py:441", [it(FULL, training=True, ddp=True)])]))
    assert ids_of(sampler_rules(plain)) == ["DDP850"]


def test_accelerate_dispatch_batches_rank0_loads_for_everyone():
    # dispatch_batches=True: rank 0 draws (num_processes batches) and broadcasts; rank 1's
    # DataLoader is iterated but never drawn from. Its sampler is the user's plain one.
    def rec(r: int, **kw) -> dict:
        its = [it(FULL, training=True, ddp=True)] if r == 0 else [it([], training=False, ddp=False)]
        return record(r, [loader("data_loader.py:441", its, **kw)])
    assert sampler_rules(both(lambda r: rec(r, wrapper="DataLoaderDispatcher", dispatch=True,
                                            distributed=True))) == []
    # A plain loader drawn on rank 0 only, under DDP training, is still not sharded.
    assert ids_of(sampler_rules(both(rec))) == ["DDP853"]
