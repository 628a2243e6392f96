"""Both ranks train, then each waits for its own file, GO_FILE + its rank (the test creates them
one at a time, so it knows which rank has ended), bounded at 120 s; then both have ended well."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
dist.destroy_process_group()
go = os.environ["GO_FILE"] + os.environ["RANK"]
deadline = time.monotonic() + 120
while not os.path.exists(go):
    if time.monotonic() > deadline:
        raise TimeoutError("the test never said go")
    time.sleep(0.05)
print(f"rank {os.environ['RANK']} done", flush=True)
