"""Correct DDP patterns that must stay clean: gradient accumulation with no_sync and by toggling
require_backward_grad_sync (nanoGPT), uneven inputs under Join, evaluation on rank 0 under no_grad
through the DDP wrapper and through model.module, barriers around a rank-0 checkpoint."""
import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
sampler = DistributedSampler(data, drop_last=True)
loader = DataLoader(data, batch_size=4, sampler=sampler)

for epoch in range(2):
    sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        if i % 2 == 0:
            with model.no_sync():  # accumulate: no all_reduce on this micro-batch
                torch.nn.functional.mse_loss(model(x), y).backward()
        else:
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()

# nanoGPT's accumulation: it toggles DDP's flag instead of using no_sync()
for micro in range(4):
    model.require_backward_grad_sync = micro == 3
    model(torch.randn(4, 4)).sum().backward()
opt.step()
opt.zero_grad()

# evaluation on rank 0 only through the DDP wrapper under no_grad (a model without buffers): no
# collective. (Not after Join below: a DDP model that once joined all_reduces in every forward.)
if rank == 0:
    with torch.no_grad():  # evaluation on rank 0 only through the DDP wrapper (no buffers): no collective
        model.eval()
        model(data.tensors[0])
        model.train()
dist.barrier()

# uneven inputs, handled: rank 1 has fewer batches, Join shadows its missing steps
batches = 5 if rank == 0 else 3
with Join([model]):
    for _ in range(batches):
        opt.zero_grad()
        model(torch.randn(4, 4)).sum().backward()
        opt.step()

dist.barrier()
if rank == 0:
    with torch.no_grad():  # evaluation on rank 0 only, through the plain module: no collective
        model.module.eval()
        print("eval loss", float(torch.nn.functional.mse_loss(model.module(data.tensors[0]), data.tensors[1])))
    with tempfile.TemporaryDirectory() as d:
        torch.save(model.module.state_dict(), os.path.join(d, "ckpt.pt"))
dist.barrier()
dist.destroy_process_group()
