"""Both ranks train the same steps; then only rank 0 evaluates, and its evaluation reduces the
loss across ranks. Rank 1 ends normally. The cause is rank 0's all_reduce inside evaluate()."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()


def evaluate():
    with torch.no_grad():
        loss = model.module(torch.randn(8, 4)).pow(2).mean().reshape(1)
    dist.all_reduce(loss)  # every rank must be here, but only rank 0 evaluates
    return float(loss) / dist.get_world_size()


if rank == 0:
    print("eval loss", evaluate())
