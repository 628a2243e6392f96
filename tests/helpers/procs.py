"""Real processes for tests: launch ddp-doctor ranks, bound every wait, leave no survivors.

Each command runs in its own session (process group); when the test is done the group must be
empty, and a command that overruns is killed with its whole group and fails the test loudly.
"""
from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

# Variables a launcher or SageMaker sets; stripped so the test decides what a rank sees.
LAUNCHER_PREFIXES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_", "ROLE_",
                     "MASTER_", "TORCHELASTIC_", "OMPI_", "PMI_", "SLURM_", "SM_", "SMDATAPARALLEL_",
                     "DDP_DOCTOR_", "NCCL_", "GLOO_", "PET_")
DDP = [sys.executable, "-m", "ddp_doctor"]
# for a launch whose subject is not the preflight's communication checks: the all_reduce sweep and the
# straggler rounds (about 1.5 s of CPU a launch on 2 busy cores) are skipped
NO_SWEEP = ("--skip", "communication")


def ddp_with_bounds(module: str = "ddp_doctor.training.run.stall_watch", **bounds: float) -> list[str]:
    """DDP, with some of the command's own bounds (`module`'s constants, by name: the parent's, by
    default) shortened: a test of what happens at a bound waits seconds, not the minute a user gets."""
    sets = "; ".join(f"w.{name} = {value!r}" for name, value in bounds.items())
    return [sys.executable, "-c", f"import sys; import {module} as w; {sets}; "
            "from ddp_doctor.cli import main; sys.exit(main(sys.argv[1:]))"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    env["DDP_DOCTOR_HISTORY"] = "off"  # the tests' runs stay out of the user's history (a test that wants one names it)
    env.update(extra)
    return env


# The ports tests hand to launches (MASTER_PORT) come from outside the kernel's ephemeral range. A
# port that range gave (bound to port 0, then closed) may be given again before the launch binds
# it, to another launch's gloo listener or to another test: rank 0 then finds its port taken and
# its peers meet a stranger (a false DDP313 and DDP315, seen once in the suite). Each xdist worker
# takes its own slice of the range, and a process never hands out a port twice.
RESERVED_PORTS = range(29400, 29600)  # torch's defaults: the elastic rendezvous 29400, MASTER_PORT 29500
LOWEST_PORT = 20000  # above Ray's workers' default ports (10002-19999): `ray start --port` refuses one of those
_ports_lock = threading.Lock()
_ports: Iterator[int] | None = None


def _port_range() -> range:
    """The wider of the ranges below and above the kernel's ephemeral ports (Linux's default:
    32768-60999), unprivileged."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    return max(range(LOWEST_PORT, max(LOWEST_PORT, low)), range(high + 1, 65536), key=len)


def _port_sequence() -> Iterator[int]:
    ports = _port_range()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    width = len(ports) // workers
    first = ports.start + (int(worker) % workers if worker.isdigit() else 0) * width
    offset = random.Random(os.getpid()).randrange(width)
    for i in range(width):
        port = first + (offset + i) % width
        if port not in RESERVED_PORTS:
            yield port


def free_port() -> int:
    """A port nothing on this host listens on now, which no other call of the test session gives."""
    global _ports
    with _ports_lock:
        if _ports is None:
            _ports = _port_sequence()
        for port in _ports:
            with socket.socket() as s:
                try:  # where a rank's store will listen (every address), no SO_REUSEADDR: a port in
                    s.bind(("0.0.0.0", port))  # TIME_WAIT is passed over too
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port left in this test process's slice")


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def outputs(results: Sequence[Result] | Mapping[int, Result], tail: int = 6000) -> str:
    """What each process printed (its last `tail` characters), one after the other under its index:
    a failed assertion's message as a string, which pytest shows whole on CI (a list's repr it cuts
    in the middle, where the root cause is)."""
    items = results.items() if isinstance(results, Mapping) else enumerate(results)
    return "\n".join(f"--- process {i}: exit {r.rc}\n{r.output[-tail:]}" for i, r in items)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def wait_for(predicate: Callable[[], Any], bound: float, what: str | Callable[[], str],
             interval: float = 0.05) -> Any:
    """Wait until `predicate()` is truthy and return its value: the way a test waits for a state (a
    file appearing, a port listening, a process's children existing), never a sleep of a guessed
    length. Past `bound` seconds it fails the test with `what` it waited for (a callable: called
    then, to say what it saw). The bound only ends a wait that would never end: it is no verdict."""
    deadline = time.monotonic() + bound
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {bound:g} s for {what() if callable(what) else what}")
        time.sleep(interval)


def wait_for_line(stream: Any, pattern: str | re.Pattern[str], bound: float) -> str:
    """Read a process's pipe (Popen's stdout or stderr) until a line matches `pattern` (re.search),
    for at most `bound` seconds; returns everything read (the matching line included), which the
    stream no longer holds. Fails the test with what was read when the bound passes or the stream
    ends first."""
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    fd = stream.fileno()
    deadline = time.monotonic() + bound
    data = b""
    while True:
        text = data.decode("utf-8", errors="replace")
        if any(rx.search(line) for line in text.splitlines()):
            return text
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"waited {bound:g} s for a line matching {rx.pattern!r}; read:\n{text}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"the stream ended before a line matching {rx.pattern!r}; read:\n{text}")
            data += chunk


def _reap(pgid: int, bound: float = 15.0) -> bool:
    """Wait (bounded) for a process group to empty; kill what is left. True if it had survivors."""
    try:
        wait_for(lambda: not _group_alive(pgid), bound, f"process group {pgid} to empty")
    except AssertionError:
        os.killpg(pgid, signal.SIGKILL)
        return True
    return False


def start(cmd: Sequence[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen[str]:
    return subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def kill_tree(pid: int) -> None:
    """SIGKILL a process, its group and every descendant. Launchers such as torchrun start their
    workers in sessions of their own, so killing the group alone can leave a worker holding our
    pipes (and the test waiting forever)."""
    import psutil
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL) if p.pid == pid else p.kill()
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            pass


def finish(proc: subprocess.Popen[str], timeout: float, started: float | None = None) -> Result:
    started = started or time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = "", "(output lost: a process outside the tree kept the pipes open)"
        raise AssertionError(f"{proc.args} ran past {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    survivors = _reap(proc.pid)
    assert not survivors, f"{proc.args} left processes behind\nstderr:\n{err}"
    return Result(proc.returncode, out, err, time.monotonic() - started)


def run(cmd: Sequence[str], env: Mapping[str, str], cwd: str, timeout: float = 120.0) -> Result:
    t = time.monotonic()
    return finish(start(cmd, env, cwd), timeout, t)


@dataclass
class Launch:
    """One command for run_all: what to run, with which environment, where."""
    cmd: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    timeout: float = 180.0


def run_all(jobs: Mapping[str, Launch | Callable[[], Any]], at_once: int = 3) -> dict[str, Any]:
    """Independent launches, `at_once` at a time, for a module fixture whose tests each read one.
    A launch mostly waits (interpreters importing torch, rendezvous, bounds), so 2 cores take 3.
    A Launch is `run` in its own thread (both pipes read as it goes); a callable is a launch started
    by hand (ranks that pick a port as they start, several launchers). What one raised (an overrun,
    a survivor, a skip) is returned in its place, for the test that reads it to raise (`result_of`)."""
    from concurrent.futures import ThreadPoolExecutor

    def call(job: Launch | Callable[[], Any]) -> Any:
        return run(job.cmd, job.env, job.cwd, job.timeout) if isinstance(job, Launch) else job()

    with ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = {name: pool.submit(call, job) for name, job in jobs.items()}
        out: dict[str, Any] = {}
        for name, fut in futures.items():
            try:
                out[name] = fut.result()
            except BaseException as e:  # noqa: BLE001 - raised by the test that reads this launch
                out[name] = e
    return out


def result_of(results: Mapping[str, Any], name: str) -> Any:
    got = results[name]
    if isinstance(got, BaseException):
        raise got
    return got


def run_ranks(n: int, args: Sequence[str], env: Mapping[str, str], cwd: str, *, world_size: int | None = None,
              port: int | None = None, per_rank: Mapping[int, Mapping[str, str]] | None = None,
              ranks: Sequence[int] | None = None, timeout: float = 120.0,
              args_of: Mapping[int, Sequence[str]] | None = None) -> dict[int, Result]:
    """Start ranks by hand, as a launcher that sets RANK/WORLD_SIZE/MASTER_* would (`args_of`: a
    rank's own arguments after `args`)."""
    port = port or free_port()
    world_size = world_size or n
    procs = {}
    t = time.monotonic()
    for r in ranks if ranks is not None else range(n):
        e = dict(env)
        e.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world_size),
                 LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR=e.get("MASTER_ADDR", "127.0.0.1"),
                 MASTER_PORT=str(port))
        e.update((per_rank or {}).get(r, {}))
        procs[r] = start([*DDP, *args, *(args_of or {}).get(r, [])], e, cwd)
    return {r: finish(p, timeout, t) for r, p in procs.items()}


def load_json(path: str) -> dict:
    """A JSON file; a ddp-doctor report in it must follow the report's schema (tests/conftest.py
    also validates every report as it is written, where the writer's environment lets it)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict) and data.get("schema") == "ddp-doctor.report":
        from ddp_doctor.report.schema import validate_report
        errors = validate_report(data)
        assert not errors, f"{path} breaks the report schema:\n" + "\n".join(errors)
    return data


def ids(report: dict, severity: str | None = None) -> set[str]:
    return {f["id"] for f in report["findings"] if severity is None or f["severity"] == severity}


def assert_clean_output(result: Result) -> None:
    """No Python traceback reaches the user from a diagnosed failure."""
    assert "Traceback (most recent call last)" not in result.output, result.output


# Timing judgements (stragglers, slow links, clock skew) can warn on a loaded 2-core machine.
# load-dependent: a busy 2-core machine can make a rank slow to load data or to sweep
# (DDP877, the rank the others wait for, is judged quiet under this load by its own e2e,
# tests/training/test_arrivals_e2e.py; elsewhere it is a timing judgement like the others)
TIMING_WARNINGS = {"DDP405", "DDP406", "DDP407", "DDP872", "DDP877"}


def assert_healthy(report: dict) -> None:
    """A healthy preflight: no errors, and no warnings except load-dependent timing ones."""
    assert not ids(report, "error"), report["findings"]
    assert ids(report, "warning") <= TIMING_WARNINGS, report["findings"]
    assert report["status"] in ("pass", "warn")


def last_stall_lines(lines: list[str]) -> list[str]:
    """The --progress lines of the last stall. Each line is said at a fifth of the bound it names
    ("the job is ended at N s"), one line per fifth: a line whose fifth is not past the one before
    starts a new stall (a short stall at start-up has lines of its own, and its last wait may be
    shorter or longer than the first of the next stall, so the waits alone cannot tell them apart)."""
    import math
    import re
    fifths = []
    for ln in lines:
        wait = float(re.search(r"no progress for ([0-9.]+) s", ln).group(1))
        end = float(re.search(r"ended at ([0-9.]+) s", ln).group(1))
        fifths.append((end, math.floor(wait * 5 / end + 1e-6)))
    start = max((i for i in range(1, len(fifths))
                 if fifths[i][0] != fifths[i - 1][0] or fifths[i][1] <= fifths[i - 1][1]), default=0)
    return lines[start:]
