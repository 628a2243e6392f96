import os

import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if rank == 1:
        raise KeyError("LOCAL_RANK")
    dist.destroy_process_group()

if __name__ == "__main__":
    os.environ["MASTER_PORT"] = os.environ.get("TEST_PORT", "29744")
    mp.spawn(worker, args=(2,), nprocs=2)
