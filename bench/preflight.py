"""Wall time of a full `ddp-doctor preflight` on N local gloo ranks, as a ratio to a bare launch
of the same ranks that only initialise and destroy a process group, measured side by side.

    python bench/preflight.py [--ranks 2 4] [--repeat 3] [--against REV]

Runs alternate (bare, preflight, bare, preflight, ...) so drift in machine load hits both; the
figure is the ratio of medians. Aim: at most 1.5x. `--against REV` also runs the
preflight of another commit's package (`git archive REV ddp_doctor`, put first on PYTHONPATH for
the launcher and its ranks) in the same turns, this one and that one in alternating order, and
prints this one's time over that one's: whether a change made the preflight slower.
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
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _common import clean_env  # noqa: E402


def timed(cmd: list[str], cwd: str, pythonpath: str | None = None) -> float:
    env = clean_env()
    if pythonpath:  # another commit's package, ahead of whatever this environment imports
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return seconds


def unpack(rev: str, into: str) -> str:
    """The ddp_doctor package of commit `rev`, unpacked under `into` (a directory for PYTHONPATH)."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "ddp_doctor"], capture_output=True, timeout=120)
    if archive.returncode != 0:
        sys.exit(f"git archive {rev} failed: {archive.stderr.decode(errors='replace').strip()}")
    os.makedirs(into)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True, timeout=120)
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (into, env.get("PYTHONPATH")) if p)  # as timed() runs it
    found = subprocess.run([sys.executable, "-c", "import ddp_doctor; print(ddp_doctor.__file__)"], env=env,
                           cwd=os.path.dirname(into), capture_output=True, text=True, timeout=120)
    if not found.stdout.startswith(into):  # else the comparison would time this checkout twice
        sys.exit(f"{rev}'s package is not the one imported: {found.stdout.strip() or found.stderr[-500:]}")
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", metavar="REV", help="also time this commit's preflight, side by side")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cwd:
        other = unpack(args.against, os.path.join(cwd, "against")) if args.against else None
        print(f"{'ranks':>5} {'bare launch s':>14} {'preflight s':>12} {'ratio':>6}"
              + (f" {args.against + ' s':>14} {'ratio':>6} {'this/that':>9}" if other else ""))
        for n in args.ranks:
            bare_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(n), os.path.join(HERE, "bare_rank.py")]
            pf_cmd = [sys.executable, "-m", "ddp_doctor", "preflight", "--nproc-per-node", str(n),
                      "--report", os.path.join(cwd, "report.json")]
            timed(bare_cmd, cwd)  # warm the page cache for each
            timed(pf_cmd, cwd)
            if other:
                timed(pf_cmd, cwd, other)
            bare, pf, then = [], [], []
            for i in range(args.repeat):
                bare.append(timed(bare_cmd, cwd))
                if other and i % 2:  # the other commit first every other turn: no place favoured
                    then.append(timed(pf_cmd, cwd, other))
                pf.append(timed(pf_cmd, cwd))
                if other and not i % 2:
                    then.append(timed(pf_cmd, cwd, other))
            b, p = statistics.median(bare), statistics.median(pf)
            line = f"{n:>5} {b:>14.2f} {p:>12.2f} {p / b:>6.2f}"
            if other:
                t = statistics.median(then)
                line += f" {t:>14.2f} {t / b:>6.2f} {p / t:>9.3f}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
