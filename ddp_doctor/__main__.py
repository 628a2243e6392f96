"""`python -m ddp_doctor` is the same as the `ddp-doctor` console script."""
from __future__ import annotations

import sys

from ddp_doctor.cli import main

if __name__ == "__main__":
    sys.exit(main())
