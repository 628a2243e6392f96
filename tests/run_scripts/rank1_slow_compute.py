"""Two ranks train a small DDP model for STEPS steps (default 80); rank 1 (the ranks SLOW_RANKS
names, default "1") spends SLOW_S seconds (default 0.05) more in its own compute each step (a
throttled GPU, a rank-dependent branch: here a sleep before its forward), so rank 0 waits for it
at every gradient all_reduce. Both end well. With SLOW_S=0 it is a correct run. Arguments are
ignored."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow = float(os.environ.get("SLOW_S", "0.05"))
slow_ranks = {int(r) for r in os.environ.get("SLOW_RANKS", "1").split(",")}
for _step in range(int(os.environ.get("STEPS", "80"))):
    if rank in slow_ranks and slow:
        time.sleep(slow)  # the slow rank's own work
    model(torch.ones(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
