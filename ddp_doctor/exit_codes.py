"""The exit codes of every ddp-doctor command, defined once (the README's exit codes).

    EXIT_OK        0    no errors found (warnings do not count)
    EXIT_INTERNAL  1    ddp-doctor itself failed (a bug, a missing dependency, an unreadable state)
    EXIT_USAGE     2    usage error: a bad option or value, as argparse reports it
    EXIT_FAILED    3    preflight (or sagemaker-check) found errors; for `run`: training was not started
    EXIT_HANG    124    `run`: the training hung and was stopped (as timeout(1) reports a timeout)

Otherwise `ddp-doctor run` exits with the training's own exit code. A stop signal N (SIGTERM,
SIGINT, SIGHUP) to `run` or a self-launched preflight ends it with 128 + N after the report is
written (status "interrupted"); a closed output pipe with 141 (128 + SIGPIPE), as the shell would.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
EXIT_HANG = 124
