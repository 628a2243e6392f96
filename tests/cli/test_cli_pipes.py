"""`ddp-doctor list-checks | head`: a reader that leaves early is no traceback,
for every subcommand (the CLI entry handles it); exit status 141 as a shell reports SIGPIPE."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddp_doctor.cli import EXIT_BROKEN_PIPE

pytestmark = pytest.mark.slow  # each test runs the CLI in a process of its own


@pytest.mark.parametrize("argv", [["list-checks"], ["list-checks", "--json"], ["explain", "DDP851"]])
def test_closed_stdout_is_not_a_traceback(argv):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write raises EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "ddp_doctor", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_BROKEN_PIPE


def test_head_of_list_checks():
    proc = subprocess.run(f"{sys.executable} -m ddp_doctor list-checks | head -n 1", shell=True,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("runs: local") and "Traceback" not in proc.stderr, proc.stderr
