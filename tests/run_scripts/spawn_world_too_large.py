"""Run as `ddp-doctor run spawn_world_too_large.py`: torch.multiprocessing.spawn starts 2 processes
that ask for a world of 4 on a loopback rendezvous; without ddp-doctor they wait inside
init_process_group until torch's timeout (30 minutes)."""
import os

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 4


def main(r, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=WORLD_SIZE)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(os.environ.get("TEST_PORT", "29762"),), nprocs=2)
