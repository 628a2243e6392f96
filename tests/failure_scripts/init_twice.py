"""DDP822: init_process_group called while the default group exists."""
import os
import tempfile

import torch.distributed as dist

path = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
