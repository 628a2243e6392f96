"""Which DataLoaders the in-training sampler rules judge (checks/sampler.py), on records shaped as
the probes write them: a loader is a sharding bug (DDP850, DDP853) only when its batches feed the
DDP model's training; a plain reference model trained on the full data on every rank is not one;
evaluation on every rank over the whole set is DDP854 (info); accelerate's split_batches and
dispatch_batches loaders are sharded by design; with no DDP model, the overlap matters only where
collectives synchronised the training, and ranks that each trained alone are DDP855. Each rule has
its failing and its passing case."""
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


# ------------------------------------------------------------------ no DDP model: synchronised or alone

def plain(indices: list[list[int]], *, collectives: bool | None, number: int = 0) -> dict:
    """A training pass with no DDP model: `collectives` whether the process groups carried any
    between its draws (FSDP, DeepSpeed, all_reduce by hand), None where the probe could not say."""
    return {**it(indices, training=True, ddp=False, number=number), "collectives": collectives}


def no_ddp(loaders_of, *, group: bool = True, **kw) -> dict[int, dict]:
    """Ranks of a job in which no model was ever wrapped in DDP; `group`: the script formed one (a
    library did, called from train.py:12)."""
    def rec(r: int) -> dict:
        events = ([{"kind": "init_process_group", "site": "train.py:12", "ok": True, "by_library": True}]
                  if group else [])
        return record(r, loaders_of(r), ddp_forwards=0, ddp_steps=0, ddp_models=0, events=events,
                      pg={"rank": r, "world_size": 2, "backend": "gloo", "site": "train.py:12"} if group else {},
                      **kw)
    return both(rec)


def test_overlap_matters_only_when_the_gradients_are_synchronised():
    # Gradients all-reduced between the draws (no DDP wrapper): two ranks trained one model on the
    # same data, the sharding bug.
    synced = no_ddp(lambda r: [loader("train.py:30", [plain(FULL, collectives=True)])])
    [f] = sampler_rules(synced)
    assert f.id == "DDP850" and f.severity == "error" and f.ranks == [0, 1]
    # The same draws with no collective between them, the reference loaders of a test script next
    # to a prepared loader included: no model's gradients were synchronised, so no loader is a
    # sampler to fix (not DDP850, not DDP853, not DDP852) ...
    alone = no_ddp(lambda r: [loader("test_script.py:67", [plain(FULL, collectives=False),
                                                           plain(FULL, collectives=False, number=1)]),
                              loader("data_loader.py:441", [plain(FULL, collectives=False)],
                                     wrapper="DataLoaderShard", distributed=True)])
    found = sampler_rules(alone)
    assert not {f.id for f in found} & {"DDP850", "DDP852", "DDP853"}
    # ... but a job whose ranks never synchronised anything while training: DDP855, once.
    [f] = found
    assert f.id == "DDP855" and f.severity == "error" and f.category == "sampler" and f.ranks == [0, 1]
    assert "each trained on all the data: no model was wrapped in DistributedDataParallel" in f.message
    assert "the process group formed at train.py:12 (by a library) carried no collective" in f.message
    assert "did not see the launcher" in f.message
    assert "data_loader.py:441" in f.message and "1 more DataLoader(s) (made at test_script.py:67)" in f.message
    assert "use_cpu=True" in f.hint and "LOCAL_RANK" in f.hint and "accelerate launch" in f.hint


def test_ranks_without_a_process_group_or_ddp_model_say_the_framework_missed_the_launcher():
    lone = no_ddp(lambda r: [loader("train.py:30", [plain(FULL, collectives=False)])], group=False)
    [f] = sampler_rules(lone)
    assert f.id == "DDP855" and f.ranks == [0, 1]
    assert ("ranks 0-1 each trained on all the data: no model was wrapped in DistributedDataParallel and the "
            "script formed no process group - the framework did not see the launcher") in f.message
    assert "train.py:30" in f.message and "8 of 16" in f.message
    assert f.evidence["process_group"] is False and f.evidence["loaders"] == ["train.py:30"]


def test_trained_alone_needs_overlap_no_ddp_model_and_no_synchronised_training():
    # Each rank reads its own part (different indices, or the same indices over rank-sharded data).
    own = no_ddp(lambda r: [loader("train.py:30", [plain(SHARD[r], collectives=False)], sampler="DistributedSampler",
                                   distributed=True)])
    assert sampler_rules(own) == []
    rank_data = no_ddp(lambda r: [loader("train.py:30", [{**plain(FULL, collectives=False),
                                                          "hashes": [[f"r{r}-{b}-{i}" for i in range(4)]
                                                                     for b in range(2)]}])])
    assert sampler_rules(rank_data) == []
    # A DDP model was made (if never trained): the ranks were meant to be one job, not DDP855.
    made = no_ddp(lambda r: [loader("train.py:30", [plain(FULL, collectives=False)])])
    for rec in made.values():
        rec["ddp_models"] = 1
    assert sampler_rules(made) == []
    # Another loader's training was synchronised: that one is judged, this one fed an unsynchronised
    # model (a reference) and is not.
    mixed = no_ddp(lambda r: [loader("train.py:30", [plain(SHARD[r], collectives=True)], sampler="DistributedSampler",
                                     distributed=True),
                              loader("train.py:40", [plain(FULL, collectives=False)])])
    assert sampler_rules(mixed) == []
    # A probe that could not read the collectives: judged as before (DDP850).
    unknown = no_ddp(lambda r: [loader("train.py:30", [plain(FULL, collectives=None)])])
    assert ids_of(sampler_rules(unknown)) == ["DDP850"]
    # One rank: nothing to compare.
    one = {0: no_ddp(lambda r: [loader("train.py:30", [plain(FULL, collectives=False)])])[0]}
    one[0]["world_size"] = 1
    one[0]["pg"]["world_size"] = 1
    assert sampler_rules(one) == []


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
