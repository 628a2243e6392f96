"""transformers.Trainer: its __init__ wrapped once transformers.trainer is imported, so that a
Trainer given a model already wrapped in DDP is recorded (`note_trainer`, also called by
DoctorCallback)."""
from __future__ import annotations

from typing import Any, Callable

from ddp_doctor.training.probes.patching import record_quietly, wrap_in_place
from ddp_doctor.training.probes.recorder import current_recorder


def wrap_trainer(module: Any) -> None:
    """Post-import hook of transformers.trainer: wrap Trainer.__init__."""
    trainer = getattr(module, "Trainer", None)
    if trainer is None:
        return

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            rec = current_recorder()
            if rec is not None:
                record_quietly(rec, "Trainer", lambda: note_trainer(kwargs.get("model", args[0] if args else None)))
            return orig(self, *args, **kwargs)
        return __init__
    wrap_in_place(trainer, "__init__", make)


def note_trainer(model: Any) -> None:
    """Record a Trainer being built, and whether its model is already wrapped in DDP."""
    rec = current_recorder()
    if rec is None or any(e["kind"] == "trainer" for e in rec.events):
        return
    from torch.nn.parallel import DistributedDataParallel
    wrapped = isinstance(model, DistributedDataParallel)
    inner = model.module if wrapped else model
    rec.event("trainer", model_class=type(inner).__name__ if inner is not None else None, ddp_wrapped=wrapped)
