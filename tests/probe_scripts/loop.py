"""A small DDP training loop on gloo with switches that each introduce one of the mistakes the
in-training probes look for; without switches it is the correct recipe.

    --no-sampler     DataLoader(shuffle=True) without DistributedSampler: every rank, same seed, same data
    --no-set-epoch   DistributedSampler(shuffle=True) without sampler.set_epoch(epoch)
    --bypass-ddp     forward through model.module: gradients are never all-reduced, replicas drift
    --no-destroy     end without destroy_process_group
    --slow-rank R    rank R sleeps in __getitem__ (a data-loading straggler)
    --ddp-first      wrap in DDP before init_process_group
    --init-twice     call init_process_group a second time
    --own-shard      each rank reads its own data set (rank-dependent contents), plain sampler
    --rank-seed      with --no-sampler: each rank shuffles with its own seed (no overlap seen early)
    --local-buffer   a buffer updated from each rank's own batches, DDP(broadcast_buffers=False)
    --max-batches N  batches per epoch at most
    --thread-fails   after training, rank 0's metrics thread all_reduces the loss alone (no other rank
                     joins it): it fails as rank 1 leaves the group, the thread dies, and the script
                     ends with exit status 0
"""
import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
for flag in ("--no-sampler", "--no-set-epoch", "--bypass-ddp", "--no-destroy", "--ddp-first", "--init-twice",
             "--own-shard", "--rank-seed", "--local-buffer", "--thread-fails"):
    p.add_argument(flag, action="store_true")
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--samples", type=int, default=128)
p.add_argument("--max-batches", type=int, default=0)
args = p.parse_args()
rank = int(os.environ["RANK"])


class Data(Dataset):
    def __init__(self, n, offset=0):
        g = torch.Generator().manual_seed(1 + offset)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if rank == args.slow_rank:
            time.sleep(0.01)
        return self.x[i], self.y[i]


class Net(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.register_buffer("input_sum", torch.zeros(()))

    def forward(self, x):
        if args.local_buffer:
            with torch.no_grad():
                self.input_sum += x.sum()  # rank-local statistics, never synchronised
        return super().forward(x)


torch.manual_seed(0)
model = Net()
if args.ddp_first:
    model = DDP(model)
dist.init_process_group("gloo")
if args.init_twice:
    dist.init_process_group("gloo")
ddp = DDP(model, broadcast_buffers=not args.local_buffer)
data = Data(args.samples, offset=rank if args.own_shard else 0)
if args.no_sampler or args.own_shard:
    sampler = None
    gen = torch.Generator().manual_seed(100 + rank) if args.rank_seed else None
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=gen)
else:
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
for epoch in range(args.epochs):
    if sampler is not None and not args.no_set_epoch:
        sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        if args.max_batches and i >= args.max_batches:
            break
        out = ddp.module(x) if args.bypass_ddp else ddp(x)
        loss = nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
os.write(1, f"rank {rank} done loss={loss.item():.4f}\n".encode())  # one write: no interleaving
if args.thread_fails and rank == 0:
    def report_metrics(value):
        dist.all_reduce(torch.tensor([value]))
    metrics = threading.Thread(target=report_metrics, args=(loss.item(),), name="metrics")
    metrics.start()
    metrics.join()
if not args.no_destroy:
    dist.destroy_process_group()
