"""A correct 2-rank job whose rank LEFTOVER_RANK (default 1) starts three servers and leaves them
running (leftover_servers.py: a plain child, one in its own session, a double-forked daemon), each
listening, with its pid file in $LEFTOVER_DIR; the rank waits (bounded) until all three listen.
Each lives at most LEFTOVER_LIFE seconds (default 300). With LEFTOVER_CLEAN set the rank ends its
plain server itself (terminate, wait) and leaves only a daemonic multiprocessing child
($LEFTOVER_DIR/mp.pid), which Python's exit ends: nothing is left over. With LEFTOVER_HANG set the
rank then blocks (a hang: ddp-doctor ends the rank, and its servers with it)."""
import multiprocessing
import os
import time

import leftover_servers
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(2)
dist.all_reduce(t)
d = os.environ["LEFTOVER_DIR"]
life = os.environ.get("LEFTOVER_LIFE", "300")
if rank == int(os.environ.get("LEFTOVER_RANK", "1")) and os.environ.get("LEFTOVER_CLEAN"):
    server = leftover_servers.start("plain", d, life)
    helper = multiprocessing.get_context("fork").Process(target=time.sleep, args=(float(life),), daemon=True)
    helper.start()
    with open(os.path.join(d, "mp.pid"), "w") as f:
        f.write(f"{helper.pid} 0")
    leftover_servers.wait_listening(d, ("plain",))
    server.terminate()
    server.wait(30)
elif rank == int(os.environ.get("LEFTOVER_RANK", "1")):
    for kind in leftover_servers.KINDS:
        leftover_servers.start(kind, d, life)
    leftover_servers.wait_listening(d)
    if os.environ.get("LEFTOVER_HANG"):  # then blocks outside any collective while the others wait: a hang
        time.sleep(float(life))
dist.barrier()
dist.destroy_process_group()
