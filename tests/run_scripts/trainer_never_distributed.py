"""A Hugging Face Trainer on 2 ranks of a machine without GPUs, built from code (no download):
without use_cpu=True the Trainer (through accelerate) takes the world to be one process, wraps no
model in DistributedDataParallel and lets every rank train on the whole data set; the process group
it forms carries no collective. With --use-cpu it sees the launcher: DDP over gloo, data sharded.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from transformers import Trainer, TrainingArguments


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 4)

    def forward(self, input_ids, labels=None):
        return {"loss": self.emb(input_ids).pow(2).mean()}


torch.manual_seed(0)
data = [{"input_ids": torch.tensor([i % 16, (i + 1) % 16])} for i in range(32)]
use_cpu = "--use-cpu" in sys.argv[1:]
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=4, per_device_train_batch_size=2, report_to=[],
                         use_cpu=use_cpu, ddp_backend="gloo" if use_cpu else None, save_strategy="no",
                         disable_tqdm=True)
trainer = Trainer(model=TinyLM(), args=args, train_dataset=data)
trainer.train()
wrapped = type(trainer.model_wrapped).__name__
if dist.is_initialized():
    dist.destroy_process_group()
os.write(1, f"rank {os.environ['RANK']} done world {args.world_size} model {wrapped}\n".encode())
