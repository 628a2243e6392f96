"""Run with 2 ranks: they exchange a tensor each step, and both send first, so each blocks in
dist.send to a peer that is itself sending; without ddp-doctor they wait until the process
group's timeout (30 minutes)."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
peer = 1 - rank
got = torch.zeros(4)
for _ in range(3):
    dist.send(torch.full((4,), float(rank)), dst=peer)
    dist.recv(got, src=peer)
dist.destroy_process_group()
