"""Ranks started by the script itself with torch.multiprocessing.spawn (fresh interpreters), each
training on the whole data set (no DistributedSampler) unless --sharded is given."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def worker(rank: int, world: int, port: int, sharded: bool) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(data, shuffle=False) if sharded else None
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()
    os.write(1, f"spawned rank {rank} done\n".encode())  # one write: no interleaving


if __name__ == "__main__":
    mp.spawn(worker, args=(2, int(os.environ["PORT"]), "--sharded" in sys.argv), nprocs=2)
