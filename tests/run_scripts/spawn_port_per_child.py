"""Run as `ddp-doctor run spawn_port_per_child.py`: each child of torch.multiprocessing.spawn looks
for a free port itself and sets MASTER_PORT to it, so every child waits at its own rendezvous;
without ddp-doctor they wait inside init_process_group until torch's timeout (30 minutes)."""
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp


def find_free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(find_free_port())
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2)
