"""A rank-0 checkpoint whose barrier was indented into the `if rank == 0:` block: rank 0 waits in
the barrier, rank 1 goes on to the next step's gradient all_reduce. The cause is rank 0's barrier."""
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt_dir = tempfile.mkdtemp()
for step in range(6):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    if step == 2 and rank == 0:
        torch.save(model.module.state_dict(), os.path.join(ckpt_dir, "ckpt.pt"))
        dist.barrier()  # meant for every rank, indented one level too far
dist.destroy_process_group()
