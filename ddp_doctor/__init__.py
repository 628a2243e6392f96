"""ddp-doctor: diagnose PyTorch DistributedDataParallel jobs before, during and after they run.

Importing this package is cheap: torch is imported only by the parts that need it.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
