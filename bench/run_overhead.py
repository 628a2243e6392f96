"""What `ddp-doctor run` adds to a short two-rank gloo job, against the same job launched bare by
torchrun, side by side: wall time and CPU time (every process of the launch: the CLI, the launcher,
the ranks; from the kernel's accounting of the waited-for children, so the machine's load moves the
wall time, not the CPU).

    python bench/run_overhead.py [--repeat 5] [--script PATH]

Three launches alternate (torchrun, run, run --skip communication, torchrun, ...) so drift in the
machine's load hits them alike; the figures are medians, and "+" is the median of each turn's
difference to the torchrun launch of that turn. The job is tests/run_scripts/ok_allreduce.py unless
--script names another (it must end well: a failing launch is an error here).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _common import clean_env  # noqa: E402


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], cwd: str) -> tuple[float, float]:
    """(wall s, CPU s of the whole launch) of one launch that must end well."""
    cpu0, start = children_cpu(), time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, timeout=600)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr[-3000:]}")
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--script", default=os.path.join(ROOT, "tests", "run_scripts", "ok_allreduce.py"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cwd:
        report = os.path.join(cwd, "r.json")
        launches = {
            "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         args.script],
            "run": [sys.executable, "-m", "ddp_doctor", "run", "--nproc-per-node", "2", "--report", report,
                    args.script],
            "run --skip communication": [sys.executable, "-m", "ddp_doctor", "run", "--nproc-per-node", "2",
                                         "--skip", "communication", "--report", report, args.script],
        }
        timed(launches["torchrun"], cwd)  # warm the page cache for all
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in launches}
        for _ in range(args.repeat):
            for name, cmd in launches.items():
                got[name].append(timed(cmd, cwd))
    base = got["torchrun"]
    print(f"{'launch':<26} {'wall s':>7} {'+ wall s':>8} {'ratio':>6} {'CPU s':>6} {'+ CPU s':>7}")
    for name, runs in got.items():
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        more_wall = statistics.median(w - b for (w, _), (b, _) in zip(runs, base))
        more_cpu = statistics.median(c - b for (_, c), (_, b) in zip(runs, base))
        print(f"{name:<26} {wall:>7.2f} {more_wall:>+8.2f} {wall / statistics.median(w for w, _ in base):>6.2f} "
              f"{cpu:>6.2f} {more_cpu:>+7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
