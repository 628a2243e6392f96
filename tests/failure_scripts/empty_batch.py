"""DDP832: a model wrapped in DistributedDataParallel by hand, then given to Hugging Face Trainer.
Trainer keeps only the dataset columns named in model.forward's signature; DDP's forward is
(*inputs, **kwargs), so every column is dropped and the first batch is empty."""
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import Trainer, TrainingArguments

out = tempfile.mkdtemp()
dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, 'store')}", rank=0, world_size=1)


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 4)

    def forward(self, input_ids):
        return {"loss": self.emb(input_ids).pow(2).mean()}


data = [{"input_ids": torch.tensor([i % 16, (i + 1) % 16])} for i in range(8)]
args = TrainingArguments(output_dir=out, max_steps=1, per_device_train_batch_size=2, report_to=[],
                         use_cpu=True, save_strategy="no", disable_tqdm=True)
Trainer(model=DDP(TinyLM()), args=args, train_dataset=data).train()
