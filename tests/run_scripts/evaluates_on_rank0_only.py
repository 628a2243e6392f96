"""An evaluation helper reduces its accuracy across ranks, but the script calls it on rank 0 only
(`if local_rank == 0: evaluate(...)`): rank 0 waits in the helper's all_reduce, rank 1 in the
barrier after it. The cause is rank 0, at the call of the helper inside the rank-conditional block."""
import os

import torch
import torch.distributed as dist


def evaluate(model):
    correct = torch.tensor([float(model(torch.randn(4, 4)).argmax() >= 0)])
    dist.all_reduce(correct)  # every rank must get here
    return correct.item()


dist.init_process_group("gloo")
local_rank = int(os.environ["LOCAL_RANK"])
model = torch.nn.Linear(4, 2)
if local_rank == 0:
    print("accuracy", evaluate(model))
dist.barrier()
dist.destroy_process_group()
