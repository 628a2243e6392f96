"""Every step each rank reduces its loss for logging, except when a rank's own data says to skip it
(`step % 2 == 0 or rank == 1`: rank 0 skips it on odd steps). Rank 0's next backward then pairs
with rank 1's logging all_reduce, and gloo aborts rank 1 inside it. The rank whose path diverged
is rank 0 (its gradient all_reduce came out of the order every rank had kept)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(8, 4)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 2 == 0 or rank == 1:
        logged = torch.tensor([loss.item()])
        dist.all_reduce(logged)
dist.destroy_process_group()
