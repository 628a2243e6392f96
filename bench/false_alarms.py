"""How often the timing findings fire on correct jobs (false alarms) and name a really slow rank
(detections), on a quiet host and on a busy one (a busy loop on every core, started by this
script), side by side in one invocation.

    python bench/false_alarms.py [--runs 20] [--slow-runs 10] [--quiet-runs N] [--modes quiet,busy] [--only CASE ...]

Cases (2 gloo ranks each):
- correct ones, where any warning is a false alarm:
  `preflight` (the whole default preflight), `run` (a small CPU-bound DDP loop under
  `ddp-doctor run`), each with a history (DDP_DOCTOR_HISTORY) that the quiet runs fill first;
- slow ones, where the rank must be named (any severity) by the finding given:
  `preflight-slow` (rank 1 gets half the CPU rank 0 gets: its compute takes about 2x; DDP405),
  `run-slow` (rank 1 does 2x the matmuls of rank 0 each step; DDP877), `run-data` (rank 1's
  dataset takes 40 ms a sample to read; DDP877).
A throttled link cannot be made on loopback here: DDP406 is measured by its tests, not here.

Prints, per mode and case, the runs, the runs with a warning (correct cases) or the runs naming
rank 1 (slow cases), and each timing finding's count at each severity.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(os.path.dirname(HERE), "tests", "run_scripts")
sys.path.insert(0, HERE)
from _common import clean_env  # noqa: E402

DDP = [sys.executable, "-m", "ddp_doctor"]
TIMING = ("DDP405", "DDP406", "DDP407", "DDP409", "DDP872", "DDP877", "DDP878")
BOUND_S = 300
HOG = "while True: pass"


def _report(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], env: dict[str, str], cwd: str) -> int:
    try:
        return subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=BOUND_S, start_new_session=True).returncode
    except subprocess.TimeoutExpired:
        return -1


def preflight(where: str, env: dict[str, str]) -> dict[str, Any]:
    _run([*DDP, "preflight", "--report", "r.json"], env, where)
    return _report(os.path.join(where, "r.json"))


def preflight_slow(where: str, env: dict[str, str]) -> dict[str, Any]:
    """Two ranks started by hand, each pinned to a CPU; rank 1's CPU also runs busy loops of its
    own session: one on a quiet host (rank 1 gets half its CPU, rank 0 all of its own), three on a
    busy one (a quarter, while rank 0 shares its CPU with that CPU's busy loop: half)."""
    cpus = sorted(os.sched_getaffinity(0))
    port = _free_port()
    procs = []
    hogs: list[subprocess.Popen] = []
    try:
        for r, cpu in ((0, cpus[0]), (1, cpus[-1])):
            e = {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            if r == 1:
                hogs = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", HOG],
                                         start_new_session=True) for _ in range(3 if Busy.on_now else 1)]
            procs.append(subprocess.Popen(["taskset", "-c", str(cpu), *DDP, "preflight", "--report", "r.json",
                                           "--select", "DDP405"], env=e, cwd=where, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        for p in procs:
            try:
                p.wait(timeout=BOUND_S)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    finally:
        for hog in hogs:
            os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()
    return _report(os.path.join(where, "r.json"))


def _run_script(where: str, env: dict[str, str], script: str, **extra: str) -> dict[str, Any]:
    _run([*DDP, "run", "--nproc-per-node", "2", "--report", "r.json", script], {**env, **extra}, where)
    return _report(os.path.join(where, "r.json"))


LOOP = os.path.join(HERE, "_slow_rank_loop.py")
CASES: dict[str, tuple[str, str | None, Any]] = {
    # name: (kind, the finding that must name rank 1, how one run goes)
    "preflight": ("correct", None, preflight),
    "run": ("correct", None, lambda w, e: _run_script(w, e, LOOP)),
    "preflight-slow": ("slow", "DDP405", preflight_slow),
    "run-slow": ("slow", "DDP877", lambda w, e: _run_script(w, e, LOOP, SLOW_RANKS="1", FACTOR="2")),
    "run-data": ("slow", "DDP877", lambda w, e: _run_script(w, e, os.path.join(SCRIPTS, "rank1_slow_data.py"))),
}


class Busy:
    """A busy loop pinned to every core, in sessions of their own, for the busy mode."""
    on_now = False

    def __init__(self, on: bool) -> None:
        self.on, self.procs = on, []

    def __enter__(self) -> Busy:
        if self.on:
            self.procs = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", HOG],
                                           start_new_session=True) for cpu in sorted(os.sched_getaffinity(0))]
        Busy.on_now = self.on
        return self

    def __exit__(self, *exc: Any) -> None:
        Busy.on_now = False
        for p in self.procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="runs of each correct case per mode")
    ap.add_argument("--slow-runs", type=int, default=10, help="runs of each slow case per mode")
    ap.add_argument("--quiet-runs", type=int, default=None,
                    help="runs of each correct case on the quiet host (they fill the history); default --runs")
    ap.add_argument("--modes", default="quiet,busy")
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="these cases only")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="ddp-doctor-false-alarms-")
    env = clean_env()
    env["DDP_DOCTOR_HISTORY"] = os.path.join(base, "history.sqlite")  # quiet runs first fill it
    rows = []
    for mode in [m for m in args.modes.split(",") if m]:
        with Busy(mode == "busy"):
            for name, (kind, wanted, go) in CASES.items():
                if args.only and name not in args.only:
                    continue
                quiet = args.quiet_runs if mode == "quiet" and args.quiet_runs is not None else args.runs
                n = quiet if kind == "correct" else args.slow_runs
                hits, seen = 0, Counter()
                for i in range(n):
                    where = os.path.join(base, mode, name, str(i))
                    os.makedirs(where)
                    rep = go(where, dict(env))
                    found = rep.get("findings") or []
                    for f in found:
                        if f.get("id") in TIMING:
                            seen[f"{f['id']} {f.get('severity')}"] += 1
                    if kind == "correct":
                        hits += any(f.get("severity") in ("warning", "error") for f in found) or not rep
                    else:
                        hits += any(f.get("id") == wanted and 1 in (f.get("ranks") or []) for f in found)
                label = "runs with a warning (false alarms)" if kind == "correct" else f"runs naming rank 1 ({wanted})"
                rows.append((mode, name, n, hits, label, dict(seen)))
                print(f"{mode:5} {name:15} {hits:3}/{n:<3} {label}; timing findings: "
                      f"{', '.join(f'{k} x{v}' for k, v in sorted(seen.items())) or 'none'}", flush=True)
    print(f"(scratch: {base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
