"""How busy this host was while a rank measured something: the CPU time other processes took on
the rank's CPUs, the hypervisor's steal, and the load average, read from /proc (Linux) over a
window the caller opens and closes around its measurement.

A timing finding (a rank slower than the others) is only as good as the host it was measured on:
on a host whose cores other jobs keep busy, one rank can be slower for a while by the luck of the
scheduler. The judge of such a finding weighs it with these figures (checks/communication.py).

What a window gives, every figure over the window's wall time:
- `busy_mine`: CPUs' worth of time spent on this rank's CPUs (its affinity), by anyone;
- `own`: CPUs' worth this process used (all its threads);
- `busy_host`: CPUs' worth spent on the whole host;
- `steal`: the share of the host's CPU time the hypervisor gave to other guests (0..1);
- `load1`: the 1-minute load average at the window's end (it includes this job's ranks);
- `cores`: the host's CPUs; `cpus_key`: a number that is the same for two ranks with the same CPU set.

Nothing here raises: without /proc (not Linux) the figures are None and the judge says the load
could not be read.
"""
from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass
from typing import Any

# /proc/stat's columns after the cpu name: user nice system idle iowait irq softirq steal guest guest_nice
_IDLE_COLUMNS = (3, 4)   # idle, iowait
_STEAL_COLUMN = 7
_GUEST_COLUMNS = (8, 9)  # already counted in user and nice


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies per CPU, (busy, total), the host's steal, this process's CPU seconds, when."""
    per_cpu: dict[int, tuple[int, int]]
    steal: int
    total: int
    own_s: float
    wall: float


@dataclass(frozen=True)
class LoadWindow:
    busy_mine: float | None
    own: float
    busy_host: float | None
    steal: float | None
    load1: float | None
    cores: int
    cpus_key: float
    seconds: float

    def as_floats(self) -> list[float]:
        """The window as floats (None as -1), to be gathered across ranks."""
        return [_f(self.busy_mine), self.own, _f(self.busy_host), _f(self.steal), _f(self.load1),
                float(self.cores), self.cpus_key, self.seconds]

    def to_dict(self) -> dict[str, float | int | None]:
        return {"busy_mine": _r(self.busy_mine), "own": _r(self.own), "busy_host": _r(self.busy_host),
                "steal": _r(self.steal), "load1": _r(self.load1), "cores": self.cores, "cpus_key": self.cpus_key,
                "seconds": _r(self.seconds)}

    @staticmethod
    def from_dict(d: Any) -> LoadWindow | None:
        """The window a record kept (to_dict), None when it is not one."""
        try:
            def opt(k: str) -> float | None:
                return None if d.get(k) is None else float(d[k])
            return LoadWindow(opt("busy_mine"), float(d["own"]), opt("busy_host"), opt("steal"), opt("load1"),
                              int(d["cores"]), float(d["cpus_key"]), float(d["seconds"]))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None

    @staticmethod
    def from_floats(v: list[float]) -> LoadWindow:
        def back(x: float) -> float | None:
            return None if x < 0 else x
        return LoadWindow(back(v[0]), v[1], back(v[2]), back(v[3]), back(v[4]), int(v[5]), v[6], v[7])


FLOATS = 8  # len(LoadWindow.as_floats())


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def _f(x: float | None) -> float:
    return -1.0 if x is None else float(x)


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def read_cpu_times(path: str = "/proc/stat") -> CpuTimes:
    """This moment's CPU counters (empty per_cpu when /proc/stat cannot be read)."""
    per_cpu: dict[int, tuple[int, int]] = {}
    steal = total = 0
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if not line.startswith("cpu"):
                    break
                name, *cols = line.split()
                vals = [int(c) for c in cols[:10] if c.isdigit()]
                if len(vals) < 8:
                    continue
                whole = sum(v for i, v in enumerate(vals) if i not in _GUEST_COLUMNS)
                busy = whole - sum(vals[i] for i in _IDLE_COLUMNS)
                if name == "cpu":
                    steal, total = vals[_STEAL_COLUMN], whole
                elif name[3:].isdigit():
                    per_cpu[int(name[3:])] = (busy, whole)
    except (OSError, ValueError):
        per_cpu = {}
    return CpuTimes(per_cpu, steal, total, time.process_time(), time.monotonic())


def _load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _cpus_key(cpus: list[int]) -> float:
    return float(zlib.crc32(",".join(map(str, cpus)).encode()))


def window(start: CpuTimes, end: CpuTimes | None = None) -> LoadWindow:
    """The load between `start` and `end` (now when None)."""
    end = read_cpu_times() if end is None else end
    seconds = max(end.wall - start.wall, 1e-6)
    own = max(0.0, end.own_s - start.own_s) / seconds
    cpus = _affinity()
    cores = os.cpu_count() or len(cpus) or 1

    def cores_busy(which: list[int]) -> float | None:
        got = 0.0
        for c in which:
            a, b = start.per_cpu.get(c), end.per_cpu.get(c)
            if a is None or b is None:
                return None
            dt = b[1] - a[1]
            got += (b[0] - a[0]) / dt if dt > 0 else 0.0
        return got
    have = bool(start.per_cpu and end.per_cpu)
    busy_mine = cores_busy(cpus) if have else None
    busy_host = cores_busy(sorted(end.per_cpu)) if have else None
    dt = end.total - start.total
    steal = (end.steal - start.steal) / dt if have and dt > 0 else None
    return LoadWindow(busy_mine, own, busy_host, steal, _load1(), cores, _cpus_key(cpus), seconds)
