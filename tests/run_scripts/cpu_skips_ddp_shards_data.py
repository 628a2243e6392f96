"""The shape of pytorch/examples' imagenet main.py --dummy on a host without GPUs: the DDP branch
(init_process_group, DistributedDataParallel) is taken only with GPUs, so on CPU every launched rank
builds a plain model; yet the data are split by rank from the launcher's variables
(DistributedSampler(num_replicas=WORLD_SIZE, rank=RANK), which needs no process group). Each rank
trains its own model on its own shard: no gradient is synchronised, and the job ends well."""
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
if torch.cuda.is_available():  # the only branch that forms a process group and wraps the model
    raise SystemExit("this shape is about a host without GPUs")
print("using CPU, this will be slow")
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))  # --dummy: synthetic images
sampler = DistributedSampler(data, num_replicas=world, rank=rank)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
os.write(1, f"rank {rank} done\n".encode())
