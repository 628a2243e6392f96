"""busbw that ddp-doctor's sweep measures (`ddp-doctor bench-comm`) against an independent minimal
timed loop of dist.all_reduce (bench/allreduce_loop.py), same sizes, iterations and warm-up, both
on N local gloo ranks started by torchrun, measured side by side.

    python bench/comm.py [--ranks 2] [--iters 20] [--warmup 5] [--repeat 3]

Runs alternate (loop, ddp-doctor, loop, ...) so drift in machine load hits both; the figure per
size is the ratio of median busbw. Aim: within 10% at 16 and 64 MiB.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import clean_env  # noqa: E402

SIZES = (16 << 20, 64 << 20)


def run(cmd: list[str], cwd: str) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def minimal(n: int, iters: int, warmup: int, cwd: str) -> dict[int, float]:
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
               os.path.join(HERE, "allreduce_loop.py"), "--sizes", *map(str, SIZES),
               "--iters", str(iters), "--warmup", str(warmup)], cwd)
    line = [x for x in out.splitlines() if x.startswith("{")][-1]
    return {int(k): float(v) for k, v in json.loads(line).items()}


def doctor(n: int, iters: int, warmup: int, cwd: str) -> dict[int, float]:
    report = os.path.join(cwd, "bench-comm.json")
    run([sys.executable, "-m", "ddp_doctor", "bench-comm", "--nproc-per-node", str(n),
         "--min-bytes", str(SIZES[0]), "--max-bytes", str(SIZES[-1]), "--iters", str(iters),
         "--warmup", str(warmup), "--report", report], cwd)
    with open(report, encoding="utf-8") as f:
        entries = json.load(f)["measurements"]["all_reduce"]
    return {e["bytes"]: e["busbw_gbps"] for e in entries if e["bytes"] in SIZES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base: dict[int, list[float]] = {s: [] for s in SIZES}
    ours: dict[int, list[float]] = {s: [] for s in SIZES}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(args.repeat):
            for s, v in minimal(args.ranks, args.iters, args.warmup, cwd).items():
                base[s].append(v)
            for s, v in doctor(args.ranks, args.iters, args.warmup, cwd).items():
                ours[s].append(v)
    print(f"{args.ranks} gloo ranks, {args.iters} timed + {args.warmup} warm-up iterations, "
          f"median of {args.repeat} runs each")
    print(f"{'size':>8} {'minimal loop busbw GB/s':>24} {'ddp-doctor busbw GB/s':>22} {'ratio':>6}")
    for s in SIZES:
        b, o = statistics.median(base[s]), statistics.median(ours[s])
        print(f"{s >> 20:>5} MiB {b:>24.3f} {o:>22.3f} {o / b:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
