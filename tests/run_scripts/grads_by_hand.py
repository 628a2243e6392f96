"""A plain model (no DistributedDataParallel) trained on 2 ranks over a loader with no
DistributedSampler, so every rank draws the same samples.

    (default)    gloo group; the gradients are all-reduced by hand after each backward: one model
                 trained on the same data twice over, a sharding bug (DDP850)
    --no-sync    gloo group, nothing all-reduced: each rank trains its own copy alone (DDP855)
    --no-group   no process group at all: each rank trains its own copy alone (DDP855)
"""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

group = "--no-group" not in sys.argv[1:]
sync = group and "--no-sync" not in sys.argv[1:]
if group:
    dist.init_process_group("gloo")
world = int(os.environ["WORLD_SIZE"])
g = torch.Generator().manual_seed(0)
x = torch.randn(128, 4, generator=g)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True,
                    generator=torch.Generator().manual_seed(1))
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        if sync:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
os.write(1, f"rank {os.environ['RANK']} done\n".encode())
if group:
    dist.destroy_process_group()
