"""A correct DDP script with two loaders that every rank reads in full on purpose, as distributed test
scripts of training libraries do:

- the DDP model trains on a loader sharded by DistributedSampler;
- a plain (non-DDP) reference model trains on every rank over the whole data set, to compare with
  the distributed result;
- after each epoch every rank evaluates the DDP model over the whole validation set (no backward).

    --unsharded   the DDP model's loader has no DistributedSampler: every rank trains on the same data
"""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

unsharded = "--unsharded" in sys.argv[1:]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(0)
x = torch.randn(128, 4, generator=g)
train_set = TensorDataset(x, x.sum(1, keepdim=True))
val_set = TensorDataset(x[:64] + 1, x[:64].sum(1, keepdim=True) + 4)

torch.manual_seed(0)
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sampler = None if unsharded else DistributedSampler(train_set, shuffle=True, seed=0)
train_loader = DataLoader(train_set, batch_size=8, sampler=sampler, shuffle=unsharded,
                          generator=torch.Generator().manual_seed(1) if unsharded else None)

torch.manual_seed(0)
reference = nn.Linear(4, 1)  # trained on the full data on every rank, on purpose
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
ref_loader = DataLoader(train_set, batch_size=8 * world, shuffle=True, generator=torch.Generator().manual_seed(2))
val_loader = DataLoader(val_set, batch_size=16)  # every rank evaluates the whole validation set

for epoch in range(2):
    if sampler is not None:
        sampler.set_epoch(epoch)
    for xb, yb in train_loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    for xb, yb in ref_loader:
        ref_opt.zero_grad()
        nn.functional.mse_loss(reference(xb), yb).backward()
        ref_opt.step()
    model.eval()
    with torch.no_grad():
        val = sum(nn.functional.mse_loss(model(xb), yb, reduction="sum").item() for xb, yb in val_loader)
    model.train()

os.write(1, f"rank {rank} done val {val / len(val_set):.4f}\n".encode())
dist.destroy_process_group()
