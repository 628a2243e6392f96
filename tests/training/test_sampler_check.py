"""ddp_doctor.check_sampler: disjoint shards, full coverage, order changing between epochs."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler, SequentialSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import ddp_doctor

DATA = TensorDataset(torch.arange(10))


def ids(findings):
    return sorted(f.id for f in findings)


def test_distributed_sampler_in_a_loader_passes_padding_included():
    # 10 samples over 4 ranks: 2 padded repeats, by design
    sampler = DistributedSampler(DATA, num_replicas=4, rank=0, shuffle=True, seed=3)
    assert ddp_doctor.check_sampler(DataLoader(DATA, sampler=sampler, batch_size=2), epochs=2) == []


def test_plain_loader_in_a_world_of_two_overlaps():
    findings = ddp_doctor.check_sampler(DataLoader(DATA, shuffle=True), world_size=2)
    assert ids(findings) == ["DDP850"]
    assert "RandomSampler over 10 samples and 2 ranks: 10 index draws repeat" in findings[0].message


def test_sequential_sampler_overlaps_too():
    assert ids(ddp_doctor.check_sampler(SequentialSampler(DATA), world_size=3)) == ["DDP850"]


def test_world_of_one_is_fine_for_any_sampler():
    assert ddp_doctor.check_sampler(RandomSampler(DATA), world_size=1) == []


def test_sampler_for_a_smaller_dataset_misses_samples():
    small = TensorDataset(torch.arange(6))
    sampler = DistributedSampler(small, num_replicas=2, rank=0, shuffle=False)
    findings = ddp_doctor.check_sampler(sampler, dataset_size=10)
    assert ids(findings) == ["DDP851"] and "6 of 10 distinct samples: 4 never drawn" in findings[0].message


class FixedShuffle(Sampler):
    """Shuffles with a fixed seed and ignores the epoch: the same order every epoch."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        self.n, self.rank, self.world = n, rank, world
        self.num_replicas = world

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        order = torch.randperm(self.n, generator=g).tolist()
        return iter(order[self.rank::self.world])

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))


def test_same_order_every_epoch_is_flagged():
    findings = ddp_doctor.check_sampler(FixedShuffle(10, 0, 1), world_size=1, dataset_size=10)
    assert ids(findings) == ["DDP852"]


def test_distributed_sampler_changes_order_when_set_epoch_is_called():
    sampler = DistributedSampler(DATA, num_replicas=2, rank=1, shuffle=True)
    assert ddp_doctor.check_sampler(sampler, epochs=3) == []


def test_num_replicas_larger_than_the_world_misses_samples():
    # num_replicas=8 in a world of 4: the shards of ranks 4-7 are never drawn
    sampler = DistributedSampler(TensorDataset(torch.arange(16)), num_replicas=8, rank=0, shuffle=False)
    findings = ddp_doctor.check_sampler(sampler, world_size=4)
    assert ids(findings) == ["DDP851"]
    assert "8 of 16 distinct samples: 8 never drawn" in findings[0].message
    assert "num_replicas=8 in a world of 4" in findings[0].message and "ranks 4-7" in findings[0].message


def test_num_replicas_from_world_size_env(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    sampler = DistributedSampler(TensorDataset(torch.arange(16)), num_replicas=8, rank=0, shuffle=False)
    assert ids(ddp_doctor.check_sampler(sampler)) == ["DDP851"]
    ok = DistributedSampler(TensorDataset(torch.arange(16)), num_replicas=4, rank=0, shuffle=False)
    assert ddp_doctor.check_sampler(ok) == []
