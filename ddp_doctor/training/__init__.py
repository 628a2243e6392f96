"""`ddp-doctor run`, the in-training probes and the framework callbacks.

`DoctorCallback` (Hugging Face Trainer) is imported lazily so that `ddp_doctor.training` does not
import transformers.

Layout: `run/` is the `ddp-doctor run` wrapper (parent and ranks), `probes/` the in-training
recorders, `records.py` the per-rank files both leave; `callback.py` and `lightning.py` are the
framework callbacks; `hf_trainer.py` and `plain_loop.py` are example entrypoints."""
import os
from typing import Any

# The installed ddp_doctor package: frames under it are ddp-doctor's own, not the user's.
TOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def __getattr__(name: str) -> Any:
    if name == "DoctorCallback":
        from ddp_doctor.training.callback import DoctorCallback
        return DoctorCallback
    if name == "DoctorLightningCallback":
        from ddp_doctor.training.lightning import DoctorLightningCallback
        return DoctorLightningCallback
    raise AttributeError(name)
