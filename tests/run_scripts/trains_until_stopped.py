"""Two ranks train a small DDP model step after step until the test stops the job (bounded at
120 s, then both end well)."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
dist.destroy_process_group()
