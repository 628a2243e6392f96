"""The faults of "never a false pass" replayed on real processes: for each, the exit status, the
seconds from the start (or from the fault, for a stop sent from outside) to ddp-doctor's exit, by
which its report is written, and what the report says.

    python bench/fault_table.py [--only NAME ...]

Each case starts the real command (torchrun, `ddp-doctor run`, real signals, a real full tmpfs when
run as root) in a scratch directory; a stop is sent once the ranks are seen training (their
heartbeats), never after a guessed sleep. Prints one row per case; nothing is asserted here (the
tests do that): the table shows what a user sees for each fault.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(os.path.dirname(HERE), "tests", "run_scripts")
sys.path.insert(0, HERE)
from _common import clean_env  # noqa: E402

DDP = [sys.executable, "-m", "ddp_doctor"]
OPTS = ["--skip", "communication", "--timeout", "30", "--report", "r.json"]
OWN = [*DDP, "run", "--nproc-per-node", "2", *OPTS]
ALONE = [*DDP, "run", *OPTS]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "ddp_doctor", "run", *OPTS]
EXIT5 = """import sys
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    sys.exit(5)
dist.barrier()
"""


def script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


def report(where: str) -> dict[str, Any]:
    try:
        with open(os.path.join(where, "r.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def summary(rep: dict[str, Any]) -> str:
    if not rep:
        return "no report"
    cause = rep.get("root_cause") or {}
    ids = sorted({f["id"] for f in rep.get("findings", []) if f.get("severity") in ("error", "warning")})
    text = rep.get("status", "?")
    if cause:
        text += f", root cause {cause.get('id')} rank {cause.get('ranks')}"
    elif ids:
        text += f", {' '.join(ids[:4])}"
    return text


def wait(what: Callable[[], Any], bound: float) -> Any:
    end = time.monotonic() + bound
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    return None


def heartbeats(parent: str) -> dict[int, dict[str, Any]]:
    out = {}
    for p in glob.glob(os.path.join(parent, "*", "hb-*.json")):
        try:
            with open(p, encoding="utf-8") as f:
                hb = json.load(f)
            out[int(hb["rank"])] = hb
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def training(parent: str, ranks: int, name: str) -> bool:
    hbs = heartbeats(parent)
    return sum(1 for hb in hbs.values() if hb.get("phase") == "training" and name in (hb.get("where") or "")) == ranks


def agent_of(pid: int) -> int | None:
    import psutil
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "ddp_doctor.training.run.agent" in " ".join(p.cmdline()):
                return p.pid
        except psutil.Error:
            continue
    return None


def alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Case:
    def __init__(self, base: str, name: str) -> None:
        self.where = os.path.join(base, name)
        self.tmp = os.path.join(self.where, "tmp")
        os.makedirs(self.tmp)
        self.note = ""

    def start(self, cmd: list[str], shell_prefix: str = "", **env: str) -> subprocess.Popen[bytes]:
        e = clean_env()
        e.update({"TMPDIR": self.tmp, **env})
        if shell_prefix:  # e.g. closed stdio: `exec >&- 2>&-` before the command
            cmd = ["sh", "-c", f'{shell_prefix}; exec "$@"', "sh", *cmd]
        return subprocess.Popen(cmd, cwd=self.where, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def end(self, proc: subprocess.Popen[bytes], bound: float = 300) -> int:
        try:
            return proc.wait(bound)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.note += " (killed at the bench's bound)"
            return -9


def one(base: str, name: str, cmd: list[str], **env: str) -> tuple[int, float, str, str]:
    c = Case(base, name)
    t0 = time.monotonic()
    rc = c.end(c.start(cmd, **env))
    return rc, time.monotonic() - t0, summary(report(c.where)), c.note


def stopped(base: str, name: str, cmd: list[str], ranks: int, script_name: str,
            signals: list[int], to_agent: bool = False) -> tuple[int, float, str, str]:
    c = Case(base, name)
    run_parent = os.path.join(c.where, "runs")
    full = [*cmd[:-1], "--run-dir", run_parent, cmd[-1]] if not cmd[-1].endswith("alone_until_stopped.py") else cmd
    proc = c.start(full)
    watch = run_parent if full is not cmd else c.tmp
    if not wait(lambda: training(watch, ranks, script_name), 180):
        c.note = " (never seen training)"
    target = (agent_of(proc.pid) or proc.pid) if to_agent else proc.pid
    rank_pids = [int(hb["pid"]) for hb in heartbeats(watch).values() if "pid" in hb]
    t0 = time.monotonic()
    for s in signals:
        os.kill(target, s)
    rc = c.end(proc)
    took = time.monotonic() - t0
    left = [p for p in rank_pids if alive(p)]
    if left:
        c.note += f" ranks left running: {left}"
    return rc, took, summary(report(c.where)), c.note


def two_torchrun_jobs(base: str, name: str) -> tuple[int, float, str, str]:
    c = Case(base, name)
    shared = c.tmp  # both jobs' TMPDIR: torchrun's run id is "none" for both
    e = {"TMPDIR": shared}
    t0 = time.monotonic()
    a_dir, b_dir = os.path.join(c.where, "a"), os.path.join(c.where, "b")
    os.makedirs(a_dir)
    os.makedirs(b_dir)
    env = clean_env()
    env.update(e)
    a = subprocess.Popen([*TORCHRUN, script("ok_allreduce.py")], cwd=a_dir, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    b = subprocess.Popen([*TORCHRUN, script("rank1_raises.py")], cwd=b_dir, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    ra, rb = c.end(a), c.end(b)
    took = time.monotonic() - t0
    return ra, took, f"A: {summary(report(a_dir))}; B (exit {rb}): {summary(report(b_dir))}", c.note


def two_jobs_one_port(base: str, name: str) -> tuple[int, float, str, str]:
    import socket
    c = Case(base, name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    t0 = time.monotonic()
    for job in ("a", "b"):
        for rank in (0, 1):
            d = os.path.join(c.where, f"{job}{rank}")
            os.makedirs(d)
            env = clean_env()
            env.update(TMPDIR=c.tmp, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append((d, subprocess.Popen([*DDP, "run", *OPTS, script("ok_allreduce.py")], cwd=d, env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True)))
    codes = [c.end(p, 240) for _, p in procs]
    took = time.monotonic() - t0
    said = sorted({summary(report(d)) for d, _ in procs})
    return max(codes), took, f"exits {codes}; " + " | ".join(said), c.note


def full_tmpdir(base: str, name: str, cmd: list[str]) -> tuple[int, float, str, str]:
    c = Case(base, name)
    full = os.path.join(c.where, "full")
    os.makedirs(full)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", full], capture_output=True).returncode:
        return 0, 0.0, "skipped: cannot mount a tmpfs (needs root)", ""
    try:
        with open(os.path.join(full, "fill"), "wb") as f:
            f.write(b"\0" * 14 * 4096)
        t0 = time.monotonic()
        rc = c.end(c.start(cmd, TMPDIR=full))
        return rc, time.monotonic() - t0, summary(report(c.where)), c.note
    finally:
        if subprocess.run(["umount", full], capture_output=True).returncode:
            subprocess.run(["umount", "-l", full], capture_output=True)


def closed_stdio(base: str, name: str, cmd: list[str]) -> tuple[int, float, str, str]:
    c = Case(base, name)
    t0 = time.monotonic()
    rc = c.end(c.start(cmd, shell_prefix="exec >&- 2>&-"))
    return rc, time.monotonic() - t0, summary(report(c.where)), c.note


def exit5(base: str, name: str) -> tuple[int, float, str, str]:
    path = os.path.join(base, "exit5.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(EXIT5)
    return one(base, name, [*OWN, path])


CASES: dict[str, Callable[[str], tuple[int, float, str, str]]] = {
    "torchrun: rank 0 SIGKILLed (OOM)": lambda b: one(b, "oom", [*TORCHRUN, script("rank_oom_killed.py")],
                                                      OOM_RANK="0"),
    "torchrun: rank 1 fails after rank 0 ended, chdir": lambda b: one(
        b, "late", [*TORCHRUN, script("rank1_fails_after_rank0_ended.py")]),
    "run -n2: SIGTERM to the launcher": lambda b: stopped(
        b, "agent_term", [*OWN, script("trains_until_stopped.py")], 2, "trains_until_stopped", [signal.SIGTERM],
        to_agent=True),
    "run -n2: SIGKILL to the launcher": lambda b: stopped(
        b, "agent_kill", [*OWN, script("trains_until_stopped.py")], 2, "trains_until_stopped", [signal.SIGKILL],
        to_agent=True),
    "run -n2: two SIGINTs at once": lambda b: stopped(
        b, "two_sigint", [*OWN, script("trains_until_stopped.py")], 2, "trains_until_stopped",
        [signal.SIGINT, signal.SIGINT]),
    "run (one process): SIGTERM": lambda b: stopped(
        b, "alone_term", [*ALONE, script("alone_until_stopped.py")], 1, "alone_until_stopped", [signal.SIGTERM]),
    "two torchrun jobs, one host, run id none": lambda b: two_torchrun_jobs(b, "two_jobs"),
    "two hand-launched jobs, one MASTER_PORT": lambda b: two_jobs_one_port(b, "one_port"),
    "run -n2: TMPDIR on a full filesystem": lambda b: full_tmpdir(b, "full", [*OWN, script("ok_allreduce.py")]),
    "run -n2: stdout and stderr closed": lambda b: closed_stdio(b, "closed", [*OWN, script("ok_allreduce.py")]),
    "run -n2: rank 1 sys.exit(5)": lambda b: exit5(b, "exit5"),
    "run -n2: run dir deleted, then a hang": lambda b: one(
        b, "deleted", [*OWN, "--hang-timeout", "3", script("deletes_run_dir_then_hangs.py")]),
    "torchrun: run dir deleted, then a hang": lambda b: one(
        b, "deleted_tr", [*TORCHRUN, "--hang-timeout", "3", script("deletes_run_dir_then_hangs.py")]),
    "run -n2: a rank leaves 3 servers running": lambda b: one(
        b, "leftovers", [*OWN, script("leaves_children.py")], LEFTOVER_DIR=b, LEFTOVER_LIFE="120"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="substrings of the case names to run")
    args = ap.parse_args()
    print(f"| {'fault':<48} | exit | seconds | report |")
    print(f"|{'-' * 50}|------|---------|--------|")
    with tempfile.TemporaryDirectory() as base:
        for name, case in CASES.items():
            if args.only and not any(o in name for o in args.only):
                continue
            rc, took, said, note = case(base)
            print(f"| {name:<48} | {rc:>4} | {took:>7.1f} | {said}{note} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
