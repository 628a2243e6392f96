"""A tiny Lightning fit on 2 CPU ranks (strategy="ddp", gloo) with DoctorLightningCallback.

    python lightning_train.py --report R.json                     correct: Lightning shards the data
    python lightning_train.py --report R.json --no-sampler        use_distributed_sampler=False and a
                                                                  plain shuffling DataLoader: same seed,
                                                                  every rank draws the same samples
    python lightning_train.py --report R.json --sync-dist         correct too: the loss logged with
                                                                  sync_dist=True on every rank, and a
                                                                  validation loop each epoch

Run as a plain script, Lightning's own launcher re-executes it for rank 1 (LOCAL_RANK set, no RANK);
under torchrun each rank runs it. Every rank prints "lightning_train: done rank=R" once fit returned.
"""
import argparse
import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ddp_doctor.training import DoctorLightningCallback

p = argparse.ArgumentParser()
p.add_argument("--report", required=True)
p.add_argument("--no-sampler", action="store_true")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--sync-dist", action="store_true")
args = p.parse_args()


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if args.sync_dist:
            self.log("train_loss", loss, sync_dist=True)  # every rank: one all_reduce each, in step
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(128, 8, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)

    def val_dataloader(self):
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(2))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


pl.seed_everything(0)  # the same seed on every rank
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                     use_distributed_sampler=not args.no_sampler,
                     callbacks=[DoctorLightningCallback(report_path=args.report)], logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     log_every_n_steps=1, limit_val_batches=None if args.sync_dist else 0,
                     num_sanity_val_steps=0)
trainer.fit(Tiny())
os.write(1, f"lightning_train: done rank={trainer.global_rank} pid={os.getpid()}\n".encode())  # one write
