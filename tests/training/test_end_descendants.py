"""processes/tree.py end_descendants, its two ways, on real processes: with a grace (a stopped
one-process run: SIGTERM, then SIGKILL to what outlives the grace) and at once (grace=None: InitWatch
ending processes stuck inside init_process_group with SIGKILL, no wait). Each runs in a process of
its own, so that it ends that process's children and never the test session's."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

PARENT = r"""
import json, os, subprocess, sys
from ddp_doctor.processes.tree import end_descendants
grace = None if sys.argv[1] == "none" else float(sys.argv[1])
# each waits for the signal that ends it (signal.pause); the plain one says on stdout that SIGTERM came
plain = subprocess.Popen([sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: "
                          "(print('sigterm', flush=True), sys.exit(0))); print('ready', flush=True); signal.pause()"],
                         stdout=subprocess.PIPE, text=True)
stubborn = subprocess.Popen([sys.executable, "-c", "import signal; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); signal.pause()"], stdout=subprocess.PIPE)
for p in (plain, stubborn):
    p.stdout.readline()  # started, and the stubborn one ignores SIGTERM
ended = end_descendants(grace=grace)
# with a grace, end_descendants waited for them (reaped: no status left for Popen); without, Popen reaps
codes = [p.wait(10) for p in (plain, stubborn)] if grace is None else None
gone = [not os.path.exists(f"/proc/{p.pid}") for p in (plain, stubborn)]
said = plain.stdout.read().strip()  # "sigterm" when it was asked to end before any SIGKILL
print(json.dumps({"ended": sorted(ended), "pids": sorted([plain.pid, stubborn.pid]), "codes": codes, "gone": gone,
                  "said": said}))
"""


def _run(grace: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PARENT, grace], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_with_a_grace_what_ignores_sigterm_is_killed_after_it() -> None:
    got = _run("0.5")
    assert got["ended"] == got["pids"] and got["gone"] == [True, True]
    # SIGTERM first (the plain one ended on it), then SIGKILL for the one that ignores SIGTERM
    assert got["said"] == "sigterm"


def test_at_once_every_one_gets_sigkill() -> None:
    got = _run("none")
    assert got["ended"] == got["pids"]
    assert got["codes"] == [-signal.SIGKILL, -signal.SIGKILL]  # the plain one too: no SIGTERM first
    assert got["said"] == ""
