"""A small CPU-bound DDP loop for bench/false_alarms.py: every rank does WORK matmuls a step;
the ranks SLOW_RANKS names (none by default) do FACTOR times as many (a rank 2x slower in its own
compute, as a throttled device or a rank-dependent branch makes it). STEPS steps."""
import os

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
slow = {int(r) for r in os.environ.get("SLOW_RANKS", "").split(",") if r.strip()}
work = int(os.environ.get("WORK", "80")) * (float(os.environ.get("FACTOR", "2")) if rank in slow else 1)
a = torch.rand(192, 192)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(int(os.environ.get("STEPS", "60"))):
    c = a
    for _ in range(int(work)):
        c = torch.mm(a, c) / 192  # this rank's own compute
    model(torch.ones(8, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
