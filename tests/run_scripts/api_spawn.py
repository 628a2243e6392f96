"""ddp_doctor.preflight(rank=, world_size=) inside torch.multiprocessing.spawn workers."""
import os
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

import ddp_doctor


def worker(rank: int, world: int) -> None:
    rep = ddp_doctor.preflight(rank=rank, world_size=world, timeout=20)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    os.write(1, f"spawn rank {rank} {rep['status']}\n".encode())  # one write: lines never interleave
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = sys.argv[1]
    mp.spawn(worker, args=(2,), nprocs=2)
