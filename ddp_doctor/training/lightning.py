"""`DoctorLightningCallback`: the in-training probes for a PyTorch Lightning Trainer (DDPStrategy),
without `ddp-doctor run`.

    from ddp_doctor.training import DoctorLightningCallback
    trainer = Trainer(accelerator="gpu", devices=8, strategy="ddp", callbacks=[DoctorLightningCallback()])
    trainer.fit(model, datamodule=data)

It records what every rank trains on (sampler fingerprints of the first batches of each epoch),
check-sums the DDP model after the first optimizer step and at the end, times each rank's data
loading, and notes the global batch size (per-device batch x accumulate_grad_batches x world size)
and learning rate. At the end of training rank 0 collects every rank's record through the process
group's store and writes the report (`report_path`, else DDP_DOCTOR_REPORT, else
./ddp-doctor-report.json), printing it on stderr when it is not a pass. Under `ddp-doctor run`
the wrapper reports instead, with the callback's notes included.

Needs the `lightning` package, 2.2 or later (`pip install 'ddp-doctor[lightning]'`); with only
the older `pytorch_lightning` package installed the callback subclasses its Callback instead. Pass it
in the `callbacks` list to `lightning.pytorch.Trainer` or `pytorch_lightning.Trainer`.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.training.probes.session import ProbeSession

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - lightning is an optional extra
    try:
        from pytorch_lightning import Callback  # the package's name before Lightning 2.0
    except ImportError as e:
        raise ImportError("DoctorLightningCallback needs Lightning: pip install 'ddp-doctor[lightning]'") from e


def _batch_size(loaders: Any) -> int | None:
    """Per-device batch size of the (first) training DataLoader; Lightning allows a list or a dict
    of loaders."""
    if isinstance(loaders, dict):
        loaders = next(iter(loaders.values()), None)
    elif isinstance(loaders, (list, tuple)):
        loaders = loaders[0] if loaders else None
    if loaders is None:
        return None
    size = getattr(loaders, "batch_size", None)
    if size is None:
        size = getattr(getattr(loaders, "batch_sampler", None), "batch_size", None)
    return size


def _learning_rate(trainer: Any) -> Any:
    for opt in getattr(trainer, "optimizers", None) or []:
        groups = getattr(opt, "param_groups", None) or []
        if groups:
            return groups[0].get("lr")
    return None


class DoctorLightningCallback(Callback):
    """A Lightning Callback that runs ddp-doctor's in-training checks; see the module docstring."""

    def __init__(self, report_path: str | None = None, gather_timeout: float = 30.0) -> None:
        super().__init__()
        self.session = ProbeSession(report_path=report_path, gather_timeout=gather_timeout)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # After the process group exists, before DDP wraps the model and the DataLoaders are built.
        if str(getattr(stage, "value", stage)) == "fit":
            self.session.start()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.start()  # idempotent; covers a subclass whose setup() skips super()
        self.session.note("trainer_args", {
            "per_device_train_batch_size": _batch_size(trainer.train_dataloader),
            "gradient_accumulation_steps": trainer.accumulate_grad_batches,
            "world_size": trainer.world_size, "learning_rate": _learning_rate(trainer)})

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # Runs on every rank before the Trainer tears the strategy down: the group is still up.
        self.session.finish()
