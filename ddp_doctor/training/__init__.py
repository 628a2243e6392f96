"""`ddp-doctor run`, the in-training probes and the framework callbacks.

`DoctorCallback` (Hugging Face Trainer) is imported lazily so that `ddp_doctor.training` does not
import transformers.

Layout: `run/` is the `ddp-doctor run` wrapper (parent and ranks), `probes/` the in-training
recorders, `records.py` the per-rank files both leave; `callback.py` and `lightning.py` are the
framework callbacks; `hf_trainer.py` and `plain_loop.py` are example entrypoints."""
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "DoctorCallback":
        from ddp_doctor.training.callback import DoctorCallback
        return DoctorCallback
    if name == "DoctorLightningCallback":
        from ddp_doctor.training.lightning import DoctorLightningCallback
        return DoctorLightningCallback
    raise AttributeError(name)
