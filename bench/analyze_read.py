"""Time and peak memory of `ddp-doctor analyze` over large logs, as a ratio to `grep -c` over the
same files (the floor: reading the bytes once), measured side by side.

    python bench/analyze_read.py [--ranks 256] [--mb-per-rank 100] [--dir /tmp/analyze-bench] [--repeat 3]

The job: `--ranks` ranks on nodes of 8, each rank's output in torchrun's --log-dir tree
(`<run>/attempt_0/<local rank>/stderr.log`, `--mb-per-rank` MB of training lines each), one rank's
ending a Python traceback in the middle of its log (a ValueError), the others' a lost-peer error
at their end, plus each node's console (`[defaultN]:` lines, 1/8 of a rank's size, with torchrun's
summary at its end). The files are written once and kept in --dir (delete it after: 256 x 100 MB
is 25 GB; use smaller sizes on small disks).

grep runs as `grep -c -e Traceback -e "Fatal Python error" FILES` (what one greps for after a
failure); analyze as `python -m ddp_doctor analyze DIR --json`. They alternate (grep, analyze, grep,
analyze, ...) so drift in load hits both; the figure is the ratio of the medians. Peak memory is
analyze's maximum resident set (getrusage of the child), printed with its verdict's root cause.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

LINE = "[rank{r}] step {i} loss 0.{i:07d} lr 0.00100 grad_norm 1.2345 throughput 812.4 samples/s\n"
PER_NODE = 8


def write_job(root: str, ranks: int, mb: float, cause: int) -> list[str]:
    """The tree and consoles of a failed job; returns the paths to analyze."""
    if os.path.exists(os.path.join(root, "done")):
        return [root]
    target = int(mb * (1 << 20))
    for node in range(max(1, ranks // PER_NODE)):
        run = os.path.join(root, f"node{node}", "run_abc123", "attempt_0")
        console_path = os.path.join(root, f"node{node}", "console.log")
        os.makedirs(os.path.dirname(console_path), exist_ok=True)
        with open(console_path, "w") as console:
            for local in range(PER_NODE):
                r = node * PER_NODE + local
                if r >= ranks:
                    break
                os.makedirs(os.path.join(run, str(local)), exist_ok=True)
                with open(os.path.join(run, str(local), "stderr.log"), "w") as f:
                    written, i = 0, 0
                    block = "".join(LINE.format(r=r, i=j) for j in range(1000))
                    while written < target:
                        f.write(block)
                        written += len(block)
                        i += 1000
                        if r == cause and i == 100_000:
                            f.write(f"[rank{r}]: Traceback (most recent call last):\n"
                                    f'[rank{r}]:   File "/job/train.py", line 88, in <module>\n'
                                    f"[rank{r}]:     batch = next(it)\n"
                                    f"[rank{r}]: ValueError: bad shard 17 on rank {r}\n")
                            break
                    if r != cause:
                        f.write(f"[rank{r}]: Traceback (most recent call last):\n"
                                f'[rank{r}]:   File "/job/train.py", line 91, in <module>\n'
                                f"[rank{r}]:     dist.all_reduce(loss)\n"
                                f"[rank{r}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                                f"Connection closed by peer [10.0.0.2]:29500\n")
                console.write("".join(f"[default{local}]:" + LINE.format(r=r, i=j)
                                      for j in range(int(target / len(LINE) / PER_NODE))))
            console.write("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
                          "====\ntrain.py FAILED\n----\nFailures:\n  <NO_OTHER_FAILURES>\n----\n"
                          "Root Cause (first observed failure):\n")
            first = cause if cause // PER_NODE == node else node * PER_NODE
            console.write(f"[0]:\n  time      : 2026-11-24_03:00:00\n  host      : algo-{node + 1}\n"
                          f"  rank      : {first} (local_rank: {first % PER_NODE})\n  exitcode  : 1 (pid: 4242)\n"
                          f"  error_file: <N/A>\n  traceback : To enable traceback see: https://pytorch.org/docs/\n"
                          "====\n")
    open(os.path.join(root, "done"), "w").close()
    return [root]


def files_under(root: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n != "done")


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - start, out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--mb-per-rank", type=float, default=100.0)
    ap.add_argument("--dir", default="/tmp/analyze-bench")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cause = args.ranks // 2 + 3
    write_job(args.dir, args.ranks, args.mb_per_rank, cause)
    files = files_under(args.dir)
    size = sum(os.path.getsize(p) for p in files)
    grep = ["grep", "-c", "-e", "Traceback", "-e", "Fatal Python error", *files]
    analyze = [sys.executable, "-m", "ddp_doctor", "analyze", args.dir, "--json"]
    g, a = [], []
    out = ""
    for _ in range(args.repeat):
        g.append(timed(grep)[0])
        t, out = timed(analyze)
        a.append(t)
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child: analyze
    rep = json.loads(out)
    cause_found = rep.get("root_cause") or {}
    print(f"{len(files)} files, {size / 1e9:.2f} GB, {args.ranks} ranks")
    print(f"grep -c   median {statistics.median(g):7.2f} s   runs {' '.join(f'{x:.2f}' for x in g)}")
    print(f"analyze   median {statistics.median(a):7.2f} s   runs {' '.join(f'{x:.2f}' for x in a)}")
    print(f"ratio analyze/grep {statistics.median(a) / statistics.median(g):.2f}   analyze peak RSS {peak_mb:.0f} MB")
    print(f"root cause: {cause_found.get('id')} ranks {cause_found.get('ranks')} (the job's cause: rank {cause})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
