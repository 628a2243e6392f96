"""Both ranks train; rank 1 then waits for a file named by GO_FILE (the test creates it once it
has read the report written while the job runs), bounded at 120 s; then both have ended well."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
dist.destroy_process_group()
if dist.is_available() and int(os.environ["RANK"]) == 1:
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["GO_FILE"]):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.05)
print(f"rank {os.environ['RANK']} done", flush=True)
