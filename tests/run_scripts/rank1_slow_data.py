"""Two ranks train a small DDP model over a DataLoader (DistributedSampler, no workers); rank 1's
dataset takes SLOW_S seconds (default 0.04) per sample to read (a slow storage path, a costly
rank-dependent transform), so rank 0 waits for it at every gradient all_reduce. Both end well."""
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank = dist.get_rank()
slow = float(os.environ.get("SLOW_S", "0.04"))


class Records(Dataset):
    def __len__(self):
        return 160

    def __getitem__(self, i):
        if rank == 1:
            time.sleep(slow)  # this rank's slow read
        return torch.ones(16) * i


loader = DataLoader(Records(), batch_size=2, sampler=DistributedSampler(Records()))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in loader:
    model(batch).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
