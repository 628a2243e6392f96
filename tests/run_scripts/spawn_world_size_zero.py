"""Run as `ddp-doctor run spawn_world_size_zero.py` (one process, no launcher): the script starts
its own ranks with torch.multiprocessing.spawn and passes a world size read from an attribute
that is 0 on a host without GPUs (Trainer's n_gpu): torch says only "TCPStore world size cannot
be 0"."""
import os

import torch.distributed as dist
import torch.multiprocessing as mp


class TrainingArguments:
    n_gpu = 0  # what Trainer's arguments say on a CPU host


training_args = TrainingArguments()


def main(r, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r,
                            world_size=training_args.n_gpu)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(os.environ.get("TEST_PORT", "29761"),), nprocs=2)
