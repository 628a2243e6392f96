"""Each rank shards its own file list; rank 1 gets fewer batches, leaves the loop and destroys its
process group while rank 0 is in its next step's gradient all_reduce (uneven inputs)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
files = [f"part-{i}" for i in range(7)]
mine = files[rank::2] if rank == 0 else files[rank::2][:3]  # 4 batches on rank 0, 3 on rank 1
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _part in mine:
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
dist.destroy_process_group()
