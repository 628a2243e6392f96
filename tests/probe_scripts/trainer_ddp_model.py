"""A Hugging Face Trainer on 2 gloo ranks with ddp-doctor's DoctorCallback; `--wrap` hands the
Trainer a model already wrapped in DistributedDataParallel (the recipe mistake DDP860 names)."""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import Trainer, TrainingArguments

from ddp_doctor.training import DoctorCallback


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 4)

    def forward(self, input_ids, labels=None):
        return {"loss": self.emb(input_ids).pow(2).mean()}


torch.manual_seed(0)
model = TinyLM()
if "--wrap" in sys.argv:
    dist.init_process_group("gloo")
    model = DDP(model)
data = [{"input_ids": torch.tensor([i % 16, (i + 1) % 16])} for i in range(32)]
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=4, per_device_train_batch_size=2, report_to=[],
                         use_cpu=True, save_strategy="no", disable_tqdm=True, ddp_backend="gloo")
Trainer(model=model, args=args, train_dataset=data, callbacks=[DoctorCallback()]).train()
if dist.is_initialized():
    dist.destroy_process_group()
os.write(1, f"rank {os.environ['RANK']} done\n".encode())
