"""Host resources a DDP job needs: shared memory, RAM, CPUs, disk, open files, kernel, swap
(DDP600-DDP699). psutil and the standard library only; node-wide, so only local rank 0 (or a rank
with no local rank) reports.

Options read from RankContext.options (defaults in OPTION_DEFAULTS; `ddp-doctor preflight
--threshold KEY=VALUE` sets them):
- shm_min_mib: /dev/shm size below which DDP600 warns (1024 MiB).
- ram_min_mib_per_rank: available RAM per local rank below which DDP601 warns (1024 MiB).
- disk_min_free_gib: free space below which DDP603 warns for each output location (10 GiB).
- open_files_min: RLIMIT_NOFILE soft limit below which DDP604 warns (4096).
- output_dir: an extra directory checked by DDP603 (`--output-dir`).
"""
from __future__ import annotations

import os
import platform
import re
import resource
from typing import Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check

OPTION_DEFAULTS: dict[str, float] = {"shm_min_mib": 1024, "ram_min_mib_per_rank": 1024,
                                     "disk_min_free_gib": 10, "open_files_min": 4096}
SHM_PATH = "/dev/shm"
MIB, GIB = 1 << 20, 1 << 30
KERNEL_MIN = (5, 5)


def _opt(ctx: RankContext, key: str) -> float:
    try:
        return float(ctx.options.get(key, OPTION_DEFAULTS[key]))
    except (TypeError, ValueError):
        return float(OPTION_DEFAULTS[key])


def _leader(ctx: RankContext) -> bool:
    return ctx.local_rank in (None, 0)


def _ranks_here(ctx: RankContext) -> int:
    return max(ctx.local_world_size or 1, 1)


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


@check("DDP600", category="host", severity="warning", title="/dev/shm too small for DataLoader workers",
       cause_class="configuration")
def shm_size(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The shared-memory file system /dev/shm is smaller than `shm_min_mib` (default 1 GiB), or
    missing.
    Why: DataLoader workers hand batches to the training process through /dev/shm; Docker's
    default of 64 MiB fills at once and workers die with "bus error" / "DataLoader worker ... killed
    by signal: Bus error" (NCCL also keeps buffers there).
    Fix: Start the container with a larger /dev/shm: `docker run --shm-size=16g` or `--ipc=host`
    (Kubernetes: an emptyDir with medium Memory mounted at /dev/shm); SageMaker training containers
    already have a large one. As a stopgap use DataLoader(num_workers=0).
    """
    if not _leader(ctx):
        return
    limit = _opt(ctx, "shm_min_mib")
    try:
        st = os.statvfs(SHM_PATH)
    except OSError as e:
        yield Problem(message=f"{SHM_PATH} is not available ({e.strerror or e})", evidence={"path": SHM_PATH})
        return
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    if size < limit * MIB:
        yield Problem(message=f"{SHM_PATH} is {_size(size)} ({_size(free)} free); DataLoader workers need at "
                              f"least {limit:.0f} MiB",
                      evidence={"path": SHM_PATH, "size_bytes": size, "free_bytes": free, "min_mib": limit})


@check("DDP601", category="host", severity="warning", title="Little RAM available",
       cause_class="host", action="investigate")
def ram_available(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Available memory is below `ram_min_mib_per_rank` (default 1024 MiB) times the ranks on
    this node: the machine's, or what is left under the container's memory limit (its cgroup's
    memory.max: a Kubernetes pod's limits.memory, `docker run --memory`), whichever is less.
    Why: Each rank loads the model, the optimizer state and its DataLoader workers' copies in host
    memory first; when memory runs out the kernel's OOM killer ends a rank with SIGKILL and the
    others hang in their next collective until the timeout. In a container the limit comes first:
    the machine may have plenty left when the pod is killed (OOMKilled).
    Fix: Use fewer DataLoader workers or ranks per node, free the memory other processes hold, or
    use more memory (a larger instance; a container's limit, Kubernetes' resources.limits.memory).
    """
    if not _leader(ctx):
        return
    import psutil

    from ddp_doctor.facts.host import container_memory
    vm = psutil.virtual_memory()
    n = _ranks_here(ctx)
    need = _opt(ctx, "ram_min_mib_per_rank") * MIB * n
    limited = container_memory(ctx.env)
    available, total, where = vm.available, vm.total, "RAM"
    if limited is not None and limited[0] - limited[1] < available:
        available, total = max(0, limited[0] - limited[1]), limited[0]
        where = "memory under the container's limit (cgroup memory.max)"
    if available < need:
        yield Problem(message=f"{_size(available)} of {_size(total)} {where} available for {n} rank(s); "
                              f"expected at least {_size(need)}",
                      evidence={"available_bytes": available, "total_bytes": total, "ranks": n, "min_bytes": need,
                                "container_limit_bytes": limited[0] if limited else None})


def usable_cpus() -> int:
    """CPUs this process may run on (affinity, then the cgroup's CPU quota)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="utf-8") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


@check("DDP602", category="host", severity="warning", title="More threads than CPUs", severities=("info",),
       cause_class="configuration")
def cpu_oversubscription(ctx: RankContext) -> Iterator[Problem]:
    """
    What: OMP_NUM_THREADS x the ranks on this node exceeds the CPUs this process may use, or there
    are more ranks than CPUs; with OMP_NUM_THREADS unset and several ranks, information.
    Why: Each rank starts OMP_NUM_THREADS threads (all cores when unset); more runnable threads
    than cores make ranks wait for CPU time, the slowest rank sets the pace at every collective,
    and data loading stalls.
    Fix: Set OMP_NUM_THREADS to at most CPUs / ranks per node (torchrun sets 1 when unset), e.g.
    `OMP_NUM_THREADS=$(( $(nproc) / 8 ))` for 8 ranks.
    Severity: a warning when the threads (or the ranks) outnumber the CPUs; info when
    OMP_NUM_THREADS is unset with several ranks, which may but need not oversubscribe.
    """
    if not _leader(ctx):
        return
    cpus, n = usable_cpus(), _ranks_here(ctx)
    raw = ctx.env.get("OMP_NUM_THREADS")
    ev = {"cpus": cpus, "ranks": n, "OMP_NUM_THREADS": raw}
    if n > cpus:
        yield Problem(message=f"{n} ranks on this node but only {cpus} CPU(s) usable", evidence=ev)
        return
    if raw is None:
        if n > 1:
            yield Problem(message=f"OMP_NUM_THREADS is unset: each of {n} ranks may start {cpus} threads on "
                                  f"{cpus} CPU(s)", severity="info", evidence=ev)
        return
    try:
        threads = int(raw.split(",")[0])
    except ValueError:
        yield Problem(message=f"OMP_NUM_THREADS={raw!r} is not a whole number", evidence=ev)
        return
    if threads * n > cpus:
        yield Problem(message=f"OMP_NUM_THREADS={threads} x {n} rank(s) = {threads * n} threads on {cpus} CPU(s)",
                      hint=f"Set OMP_NUM_THREADS={max(1, cpus // n)} ({cpus} CPUs / {n} ranks).", evidence=ev)


def output_locations(ctx: RankContext) -> list[tuple[str, str]]:
    """(what, path) for every place the job writes models, checkpoints or caches."""
    env = ctx.env
    out: list[tuple[str, str]] = []
    if ctx.options.get("output_dir"):
        out.append(("--output-dir", str(ctx.options["output_dir"])))
    for var in ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR"):
        if env.get(var):
            out.append((var, env[var]))
    if env.get("HF_HOME"):
        out.append(("HF_HOME", env["HF_HOME"]))
    else:
        base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
        out.append(("Hugging Face cache", os.path.join(base, "huggingface")))
    return out


def _existing(path: str) -> str | None:
    """The path, or its nearest existing parent (where it will be created)."""
    p = os.path.abspath(path)
    while p and not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent
    return p or None


@check("DDP603", category="host", severity="warning", title="Little free disk where the job writes",
       cause_class="host", action="investigate")
def disk_free(ctx: RankContext) -> Iterator[Problem]:
    """
    What: A file system the job writes to (--output-dir, SM_MODEL_DIR, SM_OUTPUT_DATA_DIR, the
    Hugging Face cache in HF_HOME or ~/.cache/huggingface) has less than `disk_min_free_gib`
    (default 10 GiB) free.
    Why: A checkpoint write that runs out of space fails ("No space left on device") or leaves a
    truncated file, hours into training, often on one rank only while the others wait for it.
    Fix: Free space or point the output elsewhere (--output-dir, HF_HOME); on SageMaker raise
    `volume_size` in the estimator.
    """
    if not _leader(ctx):
        return
    limit = _opt(ctx, "disk_min_free_gib") * GIB
    seen: dict[int, list[str]] = {}
    low: dict[int, tuple[str, int, int, list[str]]] = {}
    for what, path in output_locations(ctx):
        where = _existing(path)
        if where is None:
            continue
        try:
            st = os.statvfs(where)
            dev = os.stat(where).st_dev
        except OSError:
            continue
        seen.setdefault(dev, []).append(f"{what} ({path})")
        free = st.f_bavail * st.f_frsize
        if free < limit:
            low[dev] = (where, free, st.f_blocks * st.f_frsize, seen[dev])
    for _dev, (where, free, total, names) in low.items():
        yield Problem(message=f"{_size(free)} free of {_size(total)} on the file system of {', '.join(names)}; "
                              f"expected at least {_size(limit)}",
                      evidence={"paths": names, "mount_probe": where, "free_bytes": free, "total_bytes": total,
                                "min_bytes": int(limit)})


@check("DDP604", category="host", severity="warning", title="Open-files limit too low", cause_class="configuration")
def open_files_limit(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The soft limit on open files (RLIMIT_NOFILE, `ulimit -n`) is below `open_files_min`
    (default 4096).
    Why: NCCL opens sockets and shared-memory segments per peer and channel, and DataLoader
    workers pass every batch as a file descriptor; at the common default of 1024 jobs fail with
    "Too many open files" or "received 0 items of ancdata".
    Fix: Raise it before starting: `ulimit -n 65536` in the launch script (up to the hard limit),
    `docker run --ulimit nofile=65536:65536`, or LimitNOFILE in the systemd unit.
    """
    if not _leader(ctx):
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = _opt(ctx, "open_files_min")
    if soft != resource.RLIM_INFINITY and soft < limit:
        hard_s = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        yield Problem(message=f"open-files limit is {soft} (hard limit {hard_s}); expected at least {limit:.0f}",
                      evidence={"soft": soft, "hard": None if hard == resource.RLIM_INFINITY else hard,
                                "min": limit})


def kernel_version(release: str) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else None


@check("DDP605", category="host", severity="warning", title="Linux kernel older than 5.5", cause_class="configuration")
def kernel_recent(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The Linux kernel is older than 5.5.
    Why: Distributed jobs have been reported to hang on such kernels; Hugging Face accelerate (and
    so Trainer) warns "Detected kernel version ..., which is below the recommended minimum of 5.5.0;
    this can cause the process to hang". The report is empirical: not every job on an old kernel
    hangs, but a hang on one is worth ruling out first.
    Fix: Use an image / AMI with a kernel of 5.5 or later (e.g. Amazon Linux 2023, Ubuntu 22.04).
    """
    if not _leader(ctx) or platform.system() != "Linux":
        return
    release = platform.release()
    v = kernel_version(release)
    if v is not None and v < KERNEL_MIN:
        yield Problem(message=f"kernel {release} is older than {KERNEL_MIN[0]}.{KERNEL_MIN[1]}",
                      evidence={"release": release})


@check("DDP606", category="host", severity="info", title="Swap in use", cause_class="host", action="investigate")
def swap_used(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The host has swapped memory out.
    Why: A rank whose memory is partly on swap runs its steps slower than the others, which then
    wait for it at every collective; heavy swapping precedes an out-of-memory kill.
    Fix: Reduce memory use (fewer DataLoader workers, smaller prefetch) or use a larger instance.
    """
    if not _leader(ctx):
        return
    import psutil
    sw = psutil.swap_memory()
    if sw.used > 0:
        yield Problem(message=f"{_size(sw.used)} of {_size(sw.total)} swap in use",
                      evidence={"used_bytes": sw.used, "total_bytes": sw.total})
