"""How long a failing 2-rank gloo job takes to end under `ddp-doctor run` (which then has its
report), as a ratio to the same failing script launched bare by torchrun, measured side by side;
and, from the report itself, the seconds from the failure to the report.

    python bench/failure_report.py [--cases collective_timeout peer_killed model_mismatch] [--repeat 3]

The scripts are tests/failure_scripts/<case>.py (tests/checks/test_signatures.py replays each one's
recorded evidence). Runs alternate (bare, run, bare, run, ...) so drift in machine load hits both; the figures
are medians. "failure -> report" is the report file's time less the earliest training finding's
time: measured here rather than bounded in a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(os.path.dirname(HERE), "tests", "failure_scripts")
sys.path.insert(0, HERE)
from _common import clean_env  # noqa: E402


def timed(cmd: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)  # the job fails: its exit status is the point, not an error here
    return time.perf_counter() - start


def failure_to_report(path: str) -> float:
    with open(path, encoding="utf-8") as f:
        rep = json.load(f)
    failed_at = min(f["time"] for f in rep["findings"] if f.get("phase") == "training")
    return os.path.getmtime(path) - failed_at


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["collective_timeout", "peer_killed", "model_mismatch"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'case':<20} {'torchrun s':>10} {'run s':>7} {'ratio':>6} {'failure -> report s':>20}")
    with tempfile.TemporaryDirectory() as cwd:
        for case in args.cases:
            script = os.path.join(SCRIPTS, f"{case}.py")
            report = os.path.join(cwd, f"{case}.json")
            bare_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        script]
            run_cmd = [sys.executable, "-m", "ddp_doctor", "run", "--nproc-per-node", "2", "--skip", "communication",
                       "--report", report, script]
            timed(bare_cmd, cwd)  # warm the page cache for both
            bare, run, latency = [], [], []
            for _ in range(args.repeat):
                bare.append(timed(bare_cmd, cwd))
                run.append(timed(run_cmd, cwd))
                latency.append(failure_to_report(report))
            b, r = statistics.median(bare), statistics.median(run)
            print(f"{case:<20} {b:>10.2f} {r:>7.2f} {r / b:>6.2f} {statistics.median(latency):>20.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
