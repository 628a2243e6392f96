"""Ranks train a small DDP model for STEPS steps (default 60); every rank of the host named
SLOW_HOST (default algo-2) spends SLOW_S seconds (default 0.05) more in its own compute each step
(a slower instance, throttled GPUs: here a sleep before its forward), so the other node's ranks
wait for it at every gradient all_reduce. Within that node no rank is slower than its neighbour.
All end well."""
import os
import socket
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow = float(os.environ.get("SLOW_S", "0.05")) if socket.gethostname() == os.environ.get("SLOW_HOST", "algo-2") else 0
for _step in range(int(os.environ.get("STEPS", "60"))):
    if slow:
        time.sleep(slow)  # this node's own work
    model(torch.ones(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
