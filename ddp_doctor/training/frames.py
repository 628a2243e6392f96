"""Which stack frames are ddp-doctor's own: tracebacks and stacks shown to the user skip them."""
from __future__ import annotations

import os

# The installed ddp_doctor package: frames under it are ddp-doctor's own, not the user's.
TOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
