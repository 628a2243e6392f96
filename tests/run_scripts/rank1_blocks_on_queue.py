"""Two ranks train; at step 3 rank 1 blocks on a queue nobody fills (a stuck data producer) before
its next all_reduce, while rank 0 waits in that all_reduce. The cause is rank 1 and its line."""
import queue

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
batches: queue.Queue = queue.Queue()
for step in range(6):
    if step == 3 and rank == 1:
        batches.get()  # the producer thread died: this never returns
    t = torch.ones(4)
    dist.all_reduce(t)
dist.destroy_process_group()
