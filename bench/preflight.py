"""Wall time of a full `ddp-doctor preflight` on N local gloo ranks, as a ratio to a bare launch
of the same ranks that only initialise and destroy a process group, measured side by side.

    python bench/preflight.py [--ranks 2 4] [--repeat 3]

Runs alternate (bare, preflight, bare, preflight, ...) so drift in machine load hits both; the
figure is the ratio of medians. Aim (issue #2): at most 1.5x.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import clean_env  # noqa: E402


def timed(cmd: list[str], cwd: str) -> float:
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=clean_env(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'ranks':>5} {'bare launch s':>14} {'preflight s':>12} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as cwd:
        for n in args.ranks:
            bare_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(n), os.path.join(HERE, "bare_rank.py")]
            pf_cmd = [sys.executable, "-m", "ddp_doctor", "preflight", "--nproc-per-node", str(n),
                      "--report", os.path.join(cwd, "report.json")]
            timed(bare_cmd, cwd)  # warm the page cache for both
            bare, pf = [], []
            for _ in range(args.repeat):
                bare.append(timed(bare_cmd, cwd))
                pf.append(timed(pf_cmd, cwd))
            b, p = statistics.median(bare), statistics.median(pf)
            print(f"{n:>5} {b:>14.2f} {p:>12.2f} {p / b:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
