"""Rank 1 sees a NaN loss at step 4 and breaks out of its loop to the barrier before destroy; rank 0
goes on to step 5's gradient all_reduce. The cause is rank 1, which left the loop on its own data."""
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    opt.zero_grad()
    x = torch.randn(8, 4)
    if rank == 1 and step == 4:
        x[0, 0] = float("nan")  # a corrupt record in rank 1's shard
    loss = model(x).sum()
    if math.isnan(loss.item()):
        print(f"rank {rank}: NaN loss at step {step}, stopping", flush=True)
        break
    loss.backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
