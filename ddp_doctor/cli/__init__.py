"""The `ddp-doctor` command line: one module per subcommand, the argument validators, exit codes."""
from __future__ import annotations

from ddp_doctor.cli.app import main

__all__ = ["main"]
