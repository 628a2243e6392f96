"""What makes shards wrong, from what the ranks drew (checks/sampler.py): data sharded twice leave
part of every epoch undrawn (DDP851, with the second split named: accelerate's per-process split, a
sampler splitting a DistributedSampler's draws again, a per-rank Subset), and when ranks draw
overlapping data through a DistributedSampler, DDP850 names the argument that makes the shards
overlap (a seed per rank, rank= or num_replicas= by hand), compared across the ranks' records.
Each rule has its failing and its passing case."""
from __future__ import annotations

from ddp_doctor.checks.sampler import coverage_findings, overlap_cause, sampler_rules

DS = ["DataLoader", "DistributedSampler", "BatchSampler"]


def args(rank: int, *, seed: int = 0, num_replicas: int = 2, shuffle: bool = True) -> dict:
    return {"class": "DistributedSampler", "num_replicas": num_replicas, "rank": rank, "seed": seed,
            "shuffle": shuffle, "drop_last": False}


def loader(indices: list[list[int]], samples: int, *, complete: bool = True, **kw) -> dict:
    ld = {"id": 0, "site": "train.py:20", "class": "DataLoader", "sampler": "DistributedSampler", "samplers": DS,
          "dataset": "Points", "dataset_size": 64, "map_style": True, "batch_size": 4, "distributed": True,
          "shuffle": True, "split_batches": False, "dispatch": False, "drop_last": False, "data_times": [],
          "iterations": [{"number": 0, "epoch": 0, "batches": len(indices), "training": True, "ddp_training": True,
                          "indices": indices, "hashes": [None] * len(indices), "samples": samples,
                          "complete": complete}]}
    ld.update(kw)
    return ld


def record(rank: int, ld: dict) -> dict:
    return {"rank": rank, "world_size": 2, "pid": 100 + rank, "pg": {"rank": rank, "world_size": 2},
            "events": [], "steps": 8, "ddp_forwards": 8, "ddp_steps": 8, "loaders": [ld], "ended": None}


def quarter(rank: int) -> list[list[int]]:
    """What one rank draws when sharded twice over 64 samples and 2 ranks: 16 indices."""
    own = list(range(rank, 64, 4))
    return [own[i:i + 4] for i in range(0, 16, 4)]


def half(rank: int) -> list[list[int]]:
    own = list(range(rank, 64, 2))
    return [own[i:i + 4] for i in range(0, 32, 4)]


def test_a_distributed_sampler_prepared_by_accelerate_again_leaves_half_the_data_undrawn():
    have = {r: loader(quarter(r), 16, wrapper="DataLoaderShard", sampler_args=args(r),
                      samplers=["DataLoader", "SequentialSampler", "BatchSamplerShard", "BatchSampler",
                                "DistributedSampler"]) for r in (0, 1)}
    [f] = coverage_findings(have, 2)
    assert f.id == "DDP851" and f.severity == "warning" and f.ranks == [0, 1]
    assert "draws 32 of 64 samples, 32 never drawn" in f.message
    assert ("each rank draws 1/4 of the data with 2 ranks: sharded twice: a DistributedSampler inside, and "
            "accelerate's per-process split") in f.message
    assert "Accelerator.prepare" in f.hint and f.evidence["per_rank"] == {"0": 16, "1": 16}


def test_a_second_split_around_a_distributed_sampler_and_a_per_rank_subset_are_named():
    wrapped = {r: loader(quarter(r), 16, sampler="RankSplit", wrapped_samplers=["DistributedSampler"],
                         sampler_args=args(r)) for r in (0, 1)}
    [f] = coverage_findings(wrapped, 2)
    assert "sharded twice: a DistributedSampler inside RankSplit, which splits what it draws by rank again" in f.message
    # positions 0..31 of each rank's own Subset: the union of positions looks whole, the base is not
    subset = {r: loader(half(r)[:4] + half(r)[4:], 16, dataset_size=32, sampler_args=args(r),
                        subset={"base": "Points", "base_size": 64, "head": list(range(r, 16, 2))}) for r in (0, 1)}
    [g] = coverage_findings(subset, 2)
    assert "over Points of 64" in g.message and "each rank draws 1/4 of the data with 2 ranks" in g.message
    assert "a per-rank Subset of the data set" in g.message


def test_a_distributed_sampler_alone_covers_the_data_set():
    ok = {r: loader(half(r), 32, sampler_args=args(r)) for r in (0, 1)}
    assert coverage_findings(ok, 2) == []
    # the same Subset on every rank (a train split) is judged against the Subset, and covered
    same = {r: loader(half(r), 32, sampler_args=args(r),
                      subset={"base": "Points", "base_size": 100, "head": [0, 1, 2]}) for r in (0, 1)}
    assert coverage_findings(same, 2) == []
    # a pass cut short (max_steps), a rank missing, or rank 0 drawing for everyone: not judged
    assert coverage_findings({r: loader(quarter(r), 16, complete=False) for r in (0, 1)}, 2) == []
    assert coverage_findings({0: loader(quarter(0), 16)}, 2) == []
    assert coverage_findings({r: loader(quarter(r), 16, dispatch=True) for r in (0, 1)}, 2) == []
    # drop_last may drop each rank's last, incomplete batch: 32 a rank in batches of 5 keeps 30
    flat = {r: list(range(r, 64, 2))[:30] for r in (0, 1)}
    short = {r: loader([flat[r][i:i + 5] for i in range(0, 30, 5)], 30, drop_last=True, batch_size=5,
                       sampler_args=args(r)) for r in (0, 1)}
    assert coverage_findings(short, 2) == []


def overlap_of(seeds=(0, 0), ranks=(0, 1), replicas=(2, 2)) -> list:
    """sampler_rules over two ranks that drew the same first batches through a DistributedSampler."""
    same = [[0, 1, 2, 3], [4, 5, 6, 7]]
    recs = {r: record(r, loader(same, 8, complete=False,
                                sampler_args=args(ranks[r], seed=seeds[r], num_replicas=replicas[r])))
            for r in (0, 1)}
    return [f for f in sampler_rules(recs) if f.id == "DDP850"]


def test_overlap_through_a_distributed_sampler_names_the_seed_per_rank():
    [f] = overlap_of(seeds=(0, 1))
    assert "a DistributedSampler whose seed differs by rank (seed=0 on rank 0, seed=1 on rank 1)" in f.message
    assert "same seed on every rank" in f.hint and "use a DistributedSampler" not in f.hint.lower()
    assert f.evidence["sampler_args"]["1"]["seed"] == 1


def test_overlap_through_a_distributed_sampler_names_rank_or_num_replicas_passed_by_hand():
    [f] = overlap_of(ranks=(0, 0))
    assert "a DistributedSampler with rank=0 on ranks 0-1 (rank= passed by hand with a wrong value)" in f.message
    assert "Leave rank= and num_replicas= out" in f.hint
    [g] = overlap_of(replicas=(1, 1), ranks=(0, 0)) or [None]
    assert g is not None and "rank=0 on ranks 0-1" in g.message
    cause, hint = overlap_cause({r: {"sampler_args": args(r, num_replicas=4)} for r in (0, 1)}, 2)
    assert "num_replicas=4 in a world of 2" in cause and "num_replicas=" in hint


def test_overlap_without_a_wrong_argument_keeps_the_catalogue_hint():
    [f] = overlap_of()  # same seed, ranks 0 and 1: nothing in the arguments explains it
    assert "seed" not in f.message.split("(padding allows")[1]
    assert overlap_cause({0: {}, 1: {}}, 2) == ("", None)
