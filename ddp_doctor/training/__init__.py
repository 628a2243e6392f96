"""`ddp-doctor run`, the in-training probes and the framework callbacks.

`DoctorCallback` (Hugging Face Trainer) is imported lazily so that `ddp_doctor.training` does not
import transformers."""
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "DoctorCallback":
        from ddp_doctor.training.callback import DoctorCallback
        return DoctorCallback
    if name == "DoctorLightningCallback":
        from ddp_doctor.training.lightning import DoctorLightningCallback
        return DoctorLightningCallback
    raise AttributeError(name)
