"""DDP830: the deprecated smdistributed API (removed; not installed off SageMaker either)."""
import smdistributed.dataparallel.torch.distributed as dist

dist.init_process_group()
