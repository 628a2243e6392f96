"""A DDP job on 2 gloo ranks whose training data are sharded one way or another (`--shape`):
- correct: DistributedSampler(data) alone, the same seed on every rank, set_epoch each epoch;
- accelerate: a DataLoader with a DistributedSampler handed to accelerate's Accelerator.prepare(),
  which splits it per process again (each rank draws 1/4 of the data with 2 ranks);
- wrapped: a hand-made second split, indices[rank::world], of what a DistributedSampler draws;
- subset: a per-rank Subset (indices[rank::world]) of the data set, then a DistributedSampler on it;
- seed: DistributedSampler(data, shuffle=True, seed=rank): each rank shards its own permutation;
- rank: DistributedSampler(data, num_replicas=world, rank=0): rank passed by hand, the same on all.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Sampler, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

shape = argparse.ArgumentParser()
shape.add_argument("--shape", default="correct")
shape = shape.parse_args().shape


class RankSplit(Sampler):
    """A second per-rank split of what another sampler draws."""

    def __init__(self, inner, rank, world):
        self.inner, self.rank, self.world = inner, rank, world

    def __iter__(self):
        return iter(list(self.inner)[self.rank::self.world])

    def __len__(self):
        return len(range(self.rank, len(self.inner), self.world))

    def set_epoch(self, epoch):
        self.inner.set_epoch(epoch)


torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
model = nn.Linear(8, 1)
if shape == "accelerate":
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, loader)
else:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if shape == "wrapped":
        sampler = RankSplit(DistributedSampler(data), rank, world)
    elif shape == "subset":
        data = Subset(data, list(range(len(data)))[rank::world])
        sampler = DistributedSampler(data)
    elif shape == "seed":
        sampler = DistributedSampler(data, shuffle=True, seed=rank)
    elif shape == "rank":
        sampler = DistributedSampler(data, num_replicas=world, rank=0)
    else:
        sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
dist.destroy_process_group()
os.write(1, f"rank {rank} done\n".encode())
