"""DDP831: the current smdistributed API on a host without the library (not a SageMaker DLC)."""
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
import torch.distributed as dist

dist.init_process_group(backend="smddp")
