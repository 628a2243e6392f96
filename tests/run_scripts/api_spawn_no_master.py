"""The seed's mp.spawn recipe with MASTER_ADDR/MASTER_PORT never set: ddp_doctor.preflight(rank=,
world_size=) must stop each worker (exit 3, DDP110) before the script's own
init_process_group(rank=, world_size=) fails on "MASTER_ADDR expected, but not set"."""
import os

import torch.distributed as dist
import torch.multiprocessing as mp

import ddp_doctor


def worker(rank: int, world: int) -> None:
    ddp_doctor.preflight(rank=rank, world_size=world, timeout=20)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    os.write(1, f"spawn rank {rank} trained\n".encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    mp.spawn(worker, args=(2,), nprocs=2)
