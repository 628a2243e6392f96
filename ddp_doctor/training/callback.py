"""`DoctorCallback`: the in-training probes for a plain Hugging Face Trainer, without `ddp-doctor run`.

    from ddp_doctor.training import DoctorCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[DoctorCallback()])

It records what every rank trains on (sampler fingerprints of the first batches of each epoch),
check-sums the DDP model after the first optimizer step and at the end, times each rank's data
loading, notes the global batch size and learning rate, and checks the Trainer was given a plain
model (not one already wrapped in DDP). At the end of training rank 0 collects every rank's record
through the process group's store and writes the report. Under `ddp-doctor run` the wrapper
reports instead, with the callback's notes included.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.init_order import init_order
from ddp_doctor.training.probes.session import ProbeSession
from ddp_doctor.training.probes.trainer_wrapper import note_trainer

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - transformers is an optional extra
    raise ImportError("DoctorCallback needs transformers: pip install 'ddp-doctor[hf]'") from e


class DoctorCallback(TrainerCallback):
    """A TrainerCallback that runs ddp-doctor's in-training checks; see the module docstring."""

    def __init__(self, report_path: str | None = None, gather_timeout: float = 30.0) -> None:
        self.session = ProbeSession(report_path=report_path, gather_timeout=gather_timeout)

    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.session.start()
        note_trainer(model)
        rec = self.session.rec
        if rec is not None:
            self.session.alert(init_order(rec.rank or 0, rec.to_dict()))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.start()  # also when the callback was added after the Trainer was built
        self.session.note("trainer_args", {
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "world_size": args.world_size, "learning_rate": args.learning_rate})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.finish()
