"""Each rank builds its own DataLoader over its own shard, and rank 1's shard is smaller: rank 1
leaves its loop one batch early and waits in the barrier after it, while rank 0's next forward
(its DDP model has buffers: a BatchNorm) issues DDP's buffer broadcast. The cause: rank 1 ran out
of batches first (uneven inputs), not a barrier "of its own"."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
shard = TensorDataset(torch.randn(40 - 8 * rank, 4))  # rank 1's shard: one batch fewer
for (x,) in DataLoader(shard, batch_size=8):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
