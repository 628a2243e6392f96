"""DDP820: init_process_group(env://) in a process started without a launcher."""
import torch.distributed as dist

dist.init_process_group("gloo")
