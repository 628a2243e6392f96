"""GPU checks through NVML (ddp_doctor.facts.nvml), torch.cuda where NVML has no answer (DDP500-DDP599).

Each rank checks its own GPU (cuda:LOCAL_RANK, or cuda:0 when the launcher gave every rank one GPU
through CUDA_VISIBLE_DEVICES; every visible GPU when there is no local rank), so the merged report
covers the node without repeating a GPU. Node-wide facts (counts, CUDA_VISIBLE_DEVICES, the driver)
are reported by local rank 0 only. What NVML cannot read is "unknown" (DDP513), never a crash.

Options read from RankContext.options (defaults in OPTION_DEFAULTS):
- gpu_busy_mib: memory in use on this rank's GPU, before training, above which DDP505 warns (1024).
- pcie_load_pct: GPU utilisation (%) above which a PCIe generation below the maximum is a warning
  rather than information: idle GPUs lower their link speed to save power (50).

Already covered elsewhere, not repeated here: a GPU backend with no GPU (DDP106), more local ranks
than visible GPUs (DDP109), SM_NUM_GPUS against the visible GPUs (DDP211), two ranks on one GPU
(DDP701, across ranks by device UUID).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.facts import nvml
from ddp_doctor.facts.nvml import Unknown, is_unknown
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check

GPU_BACKENDS = ("nccl", "smddp")
OPTION_DEFAULTS: dict[str, float] = {"gpu_busy_mib": 1024, "pcie_load_pct": 50}
MIB = 1 << 20

# GPUs per instance (DOMAIN.md section 1), with and without SageMaker's "ml." prefix.
INSTANCE_GPUS = {"p3.16xlarge": 8, "p3dn.24xlarge": 8, "p4d.24xlarge": 8, "p4de.24xlarge": 8,
                 "p5.48xlarge": 8, "g5.48xlarge": 8}
# Instances whose GPUs are joined by NVLink / NVSwitch: a device with every link down is broken.
NVLINK_INSTANCES = ("p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge")
# Clock event reasons that mean the GPU runs slower than it should.
SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
# nvmlInit failures meaning "no NVIDIA stack here" rather than "a broken one".
NO_NVML = ("LibraryNotFound", "ImportError")


# ---------------------------------------------------------------------------------------------
# Seams to torch.cuda (tests replace these; nothing here runs CUDA on a host without a GPU)

def torch_cuda_version() -> str | None:
    """The CUDA version torch was built for ("12.4"), None for a CPU build."""
    try:
        import torch
        return torch.version.cuda
    except Exception:  # noqa: BLE001
        return None


def torch_device_uuid(index: int) -> str | None:
    """The UUID of cuda:index as CUDA numbers devices (which may differ from NVML's order)."""
    try:
        import torch
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # noqa: BLE001
        return None


def torch_current_device() -> int | None:
    try:
        import torch
        return int(torch.cuda.current_device()) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------------------------------------
# One read of NVML per rank, shared by the checks

@dataclass
class GpuFacts:
    cuda_index: int
    nvml_index: int | None = None
    uuid: str | Unknown = Unknown("not read")
    name: str | Unknown = Unknown("not read")
    memory: nvml.MemoryInfo | Unknown = Unknown("not read")
    processes: list[nvml.ProcessInfo] | Unknown = Unknown("not read")
    ecc_volatile: int | Unknown = Unknown("not read")
    ecc_aggregate: int | Unknown = Unknown("not read")
    retired_dbe: int | Unknown = Unknown("not read")
    retired_sbe: int | Unknown = Unknown("not read")
    retired_pending: bool | Unknown = Unknown("not read")
    remapped: nvml.RemappedRows | Unknown = Unknown("not read")
    clock_mask: int | Unknown = Unknown("not read")
    clock_reasons: list[str] = field(default_factory=list)
    pcie: nvml.PcieLink | None = None
    utilization: int | Unknown = Unknown("not read")
    nvlink: list[bool] | Unknown = Unknown("not read")
    persistence: bool | Unknown = Unknown("not read")

    @property
    def label(self) -> str:
        parts = [f"cuda:{self.cuda_index}"]
        if self.nvml_index is not None and self.nvml_index != self.cuda_index:
            parts.append(f"NVML index {self.nvml_index}")
        if not is_unknown(self.name):
            parts.append(str(self.name))
        if not is_unknown(self.uuid):
            parts.append(str(self.uuid))
        return "GPU " + ", ".join(parts)


@dataclass
class Snapshot:
    ok: bool
    error: str | None
    error_kind: str | None
    count: int | Unknown
    driver_version: str | Unknown
    cuda_driver_version: int | Unknown
    gpus: list[GpuFacts]
    unresolved: dict[int, str]           # cuda index -> why no NVML device was found
    uuids: list[str]                     # every device's UUID, in NVML order


def cvd_entries(ctx: RankContext) -> list[str] | None:
    raw = ctx.env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [x.strip() for x in raw.split(",") if x.strip()]


def target_indices(ctx: RankContext) -> list[int]:
    """CUDA indices of the GPUs this rank answers for."""
    visible = ctx.host.visible_gpus
    lr, lws = ctx.local_rank, ctx.local_world_size
    if lr is None:
        return list(range(visible))
    if visible == 1 and cvd_entries(ctx) is not None and lws is not None and lws > 1:
        return [0]  # one GPU per rank through CUDA_VISIBLE_DEVICES
    return [lr] if 0 <= lr < visible else []


def _norm_uuid(u: str) -> str:
    u = u.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def _resolve(s: nvml.Session, ctx: RankContext, cuda_index: int, uuids: list[str]) -> tuple[int | None, str | None]:
    """(NVML index, None) for cuda:index, or (None, why not)."""
    tu = torch_device_uuid(cuda_index)
    if tu:
        want = _norm_uuid(tu)
        for i, u in enumerate(uuids):
            if _norm_uuid(u) == want:
                return i, None
    entries = cvd_entries(ctx)
    if entries is None:
        return cuda_index, None  # CUDA and NVML agree when CUDA_DEVICE_ORDER=PCI_BUS_ID (usual on servers)
    if cuda_index >= len(entries):
        return None, f"CUDA_VISIBLE_DEVICES has no entry {cuda_index}"
    e = entries[cuda_index]
    if e.isdigit():
        return int(e), None
    if e.upper().startswith("MIG-"):
        return None, f"{e} is a MIG instance (NVML health fields are per physical GPU)"
    matches = [i for i, u in enumerate(uuids) if _norm_uuid(u).startswith(_norm_uuid(e))]
    if len(matches) == 1:
        return matches[0], None
    return None, f"CUDA_VISIBLE_DEVICES entry {e!r} matches {len(matches)} NVML devices"


def _read_gpu(s: nvml.Session, cuda_index: int, nvml_index: int) -> GpuFacts:
    g = GpuFacts(cuda_index=cuda_index, nvml_index=nvml_index)
    h = s.handle(nvml_index)
    if is_unknown(h):
        for f in ("uuid", "name", "memory", "processes", "ecc_volatile", "ecc_aggregate", "retired_dbe",
                  "retired_sbe", "retired_pending", "remapped", "clock_mask", "utilization", "nvlink",
                  "persistence"):
            setattr(g, f, h)
        g.pcie = nvml.PcieLink(h, h, h, h)
        return g
    g.uuid, g.name, g.memory, g.processes = s.uuid(h), s.name(h), s.memory(h), s.processes(h)
    g.ecc_volatile, g.ecc_aggregate = s.ecc_uncorrected(h, aggregate=False), s.ecc_uncorrected(h, aggregate=True)
    g.retired_dbe, g.retired_sbe = s.retired_pages(h, double_bit=True), s.retired_pages(h, double_bit=False)
    g.retired_pending, g.remapped = s.retired_pages_pending(h), s.remapped_rows(h)
    g.clock_mask = s.clock_reasons(h)
    g.clock_reasons = [] if is_unknown(g.clock_mask) else s.clock_reason_names(int(g.clock_mask))
    g.pcie, g.utilization = s.pcie(h), s.utilization(h)
    g.nvlink, g.persistence = s.nvlink_states(h), s.persistence_mode(h)
    return g


def read_snapshot(ctx: RankContext) -> Snapshot:
    with nvml.session() as s:
        if not s.ok:
            err = Unknown(s.error or "no NVML")
            return Snapshot(False, s.error, s.error_kind, err, err, err, [], {}, [])
        count = s.device_count()
        uuids: list[str] = []
        for i in range(0 if is_unknown(count) else int(count)):
            h = s.handle(i)
            u = Unknown("no handle") if is_unknown(h) else s.uuid(h)
            uuids.append("" if is_unknown(u) else str(u))
        gpus, unresolved = [], {}
        for ci in target_indices(ctx):
            ni, why = _resolve(s, ctx, ci, uuids)
            if ni is None:
                unresolved[ci] = why or "unknown"
            else:
                gpus.append(_read_gpu(s, ci, ni))
        return Snapshot(True, None, None, count, s.driver_version(), s.cuda_driver_version(), gpus,
                        unresolved, uuids)


_CACHE: dict[int, tuple[RankContext, Any, Snapshot]] = {}


def snapshot(ctx: RankContext) -> Snapshot:
    """The NVML snapshot of this rank, read once per context (and per NVML provider)."""
    hit = _CACHE.get(id(ctx))
    if hit is not None and hit[0] is ctx and hit[1] is nvml.provider:
        return hit[2]
    snap = read_snapshot(ctx)
    if len(_CACHE) > 8:
        _CACHE.clear()
    _CACHE[id(ctx)] = (ctx, nvml.provider, snap)
    return snap


def _count(snap: Snapshot) -> int:
    return 0 if is_unknown(snap.count) else int(snap.count)


def _has_gpus(ctx: RankContext, snap: Snapshot) -> bool:
    return ctx.host.visible_gpus > 0 or _count(snap) > 0


def _node_leader(ctx: RankContext) -> bool:
    return ctx.local_rank in (None, 0)


def _opt(ctx: RankContext, key: str) -> float:
    try:
        return float(ctx.options.get(key, OPTION_DEFAULTS[key]))
    except (TypeError, ValueError):
        return float(OPTION_DEFAULTS[key])


def _instance(ctx: RankContext) -> str | None:
    sm = ctx.sagemaker
    it = sm.instance_type if sm is not None else None
    if not isinstance(it, str):
        return None
    return it[3:] if it.startswith("ml.") else it


def _unknown_text(v: Any) -> str:
    return v.reason if is_unknown(v) else str(v)


# ---------------------------------------------------------------------------------------------
# Checks

@check("DDP500", category="gpu", severity="info", title="GPU checks not applicable")
def gpu_not_applicable(ctx: RankContext) -> Iterator[Problem]:
    """
    What: This host has no GPU that torch can use and the job uses a CPU backend (gloo, mpi), so the
    GPU checks were skipped; a warning when NVML counts GPUs that torch cannot see.
    Why: On a CPU-only machine that is expected. GPUs that NVML counts but torch does not see mean
    a CPU-only torch build or a CUDA_VISIBLE_DEVICES that hides them: the job trains on the CPU.
    Fix: Nothing on a CPU-only host. On a GPU host install a CUDA build of torch
    (torch.version.cuda must not be None) and do not set CUDA_VISIBLE_DEVICES to "" or -1.
    """
    if ctx.backend in GPU_BACKENDS or ctx.host.visible_gpus > 0:
        return  # a GPU backend without a GPU is DDP106's error
    snap = snapshot(ctx)
    if not _node_leader(ctx):
        return
    n = _count(snap)
    ev = {"backend": ctx.backend, "visible_gpus": ctx.host.visible_gpus, "nvml_gpus": snap.count if snap.ok else None,
          "nvml_error": snap.error, "torch_cuda": torch_cuda_version(),
          "CUDA_VISIBLE_DEVICES": ctx.env.get("CUDA_VISIBLE_DEVICES")}
    if n > 0:
        cvd = ctx.env.get("CUDA_VISIBLE_DEVICES")
        why = (f"CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else
               f"torch.version.cuda={torch_cuda_version()!r}")
        yield Problem(message=f"NVML counts {n} GPU(s) but torch sees none ({why}); the job would run on "
                              f"the CPU with backend {ctx.backend}", severity="warning", evidence=ev)
        return
    nvml_said = f"NVML: {snap.error}" if not snap.ok else "NVML counts 0 GPUs"
    yield Problem(message=f"no GPU on this host ({nvml_said}; torch sees 0) and backend {ctx.backend}: "
                          "GPU checks not applicable", evidence=ev)


@check("DDP501", category="gpu", severity="error", title="NVML cannot be initialised")
def nvml_usable(ctx: RankContext) -> Iterator[Problem]:
    """
    What: nvmlInit failed on a host where GPUs are expected (torch sees GPUs, or the job asked for
    NCCL/smddp): the driver is not loaded, its kernel module and user library differ in version, or
    the NVML library is missing.
    Why: "Driver/library version mismatch" (a driver upgraded without a reboot) and an unloaded
    driver make every CUDA call fail; when torch still works, NVML's health checks (ECC, clocks,
    links) cannot run, so a failing GPU goes unnoticed.
    Fix: Run `nvidia-smi`. On a version mismatch reboot the host (or reload the nvidia kernel
    modules); if the driver is not loaded install it / start the container with
    `--gpus all` (NVIDIA container toolkit), which also mounts libnvidia-ml.so.
    """
    snap = snapshot(ctx)
    if snap.ok or not _node_leader(ctx):
        return
    ev = {"error": snap.error, "kind": snap.error_kind, "visible_gpus": ctx.host.visible_gpus,
          "backend": ctx.backend}
    if ctx.host.visible_gpus > 0:
        yield Problem(message=f"nvmlInit failed ({snap.error}) although torch sees {ctx.host.visible_gpus} "
                              "GPU(s): GPU health (ECC, clocks, PCIe, NVLink) is unknown",
                      severity="warning", evidence=ev)
    elif ctx.backend in GPU_BACKENDS and snap.error_kind not in NO_NVML:
        yield Problem(message=f"nvmlInit failed: {snap.error} ({snap.error_kind}); this is why no GPU is "
                              f"usable for backend {ctx.backend}", evidence=ev)


@check("DDP502", category="gpu", severity="error", title="GPU count differs from the instance type or the ranks")
def gpu_count_matches(ctx: RankContext) -> Iterator[Problem]:
    """
    What: NVML counts fewer (or more) GPUs than the instance type has (ml.p4d.24xlarge: 8,
    DOMAIN table), or, with a GPU backend, this node runs fewer ranks (LOCAL_WORLD_SIZE) than it
    has visible GPUs.
    Why: A GPU missing from an 8-GPU instance has fallen off the bus (SM_NUM_GPUS, read when the
    container started, then agrees with the wrong count, so nothing else notices); fewer ranks than
    GPUs leave GPUs idle.
    Fix: Replace the instance (stop the job and start it again) when a GPU is missing; start one
    rank per GPU (`torchrun --nproc-per-node <GPUs>`, or let SageMaker's distribution do it).
    """
    if not _node_leader(ctx):
        return
    snap = snapshot(ctx)
    it = _instance(ctx)
    expected = INSTANCE_GPUS.get(it or "")
    seen: int | None = _count(snap) if snap.ok and not is_unknown(snap.count) else None
    source = "NVML counts"
    if seen is None and "CUDA_VISIBLE_DEVICES" not in ctx.env and ctx.host.visible_gpus > 0:
        seen, source = ctx.host.visible_gpus, "torch sees"
    if expected is not None and seen is not None and seen != expected:
        yield Problem(
            message=f"{source} {seen} GPU(s) on this {it} host; the instance type has {expected}",
            severity=None if seen < expected else "warning",
            evidence={"instance_type": it, "expected": expected, "counted": seen, "source": source})
    lws, visible = ctx.local_world_size, ctx.host.visible_gpus
    if ctx.backend in GPU_BACKENDS and lws is not None and 0 < lws < visible:
        yield Problem(
            message=f"LOCAL_WORLD_SIZE={lws} rank(s) on this node but {visible} GPUs are visible: "
                    f"{visible - lws} GPU(s) idle",
            severity="info", hint=f"Start {visible} ranks per node (`torchrun --nproc-per-node {visible}`), "
                                  "or narrow CUDA_VISIBLE_DEVICES if the others are meant for something else.",
            evidence={"local_world_size": lws, "visible_gpus": visible})


@check("DDP503", category="gpu", severity="error", title="CUDA_VISIBLE_DEVICES names GPUs that do not exist")
def cuda_visible_devices_valid(ctx: RankContext) -> Iterator[Problem]:
    """
    What: CUDA_VISIBLE_DEVICES holds an entry that is neither a GPU index, a GPU UUID nor a MIG
    UUID, an index NVML does not have, a UUID no GPU has, or the same GPU twice.
    Why: CUDA ignores every entry from the first invalid one on, so the ranks see fewer GPUs than
    the list suggests (and land on "invalid device ordinal" or on one shared GPU); a GPU listed twice
    gives two ranks the same device.
    Fix: List each GPU once, by index (0..N-1 as `nvidia-smi -L` shows) or by full UUID, e.g.
    CUDA_VISIBLE_DEVICES=0,1,2,3; or leave it unset and let each rank use cuda:LOCAL_RANK.
    """
    entries = cvd_entries(ctx)
    if entries is None or not entries or entries[0] == "-1" or not _node_leader(ctx):
        return
    snap = snapshot(ctx)
    if not _has_gpus(ctx, snap):
        return
    raw = ctx.env.get("CUDA_VISIBLE_DEVICES")
    n = _count(snap) if snap.ok and not is_unknown(snap.count) else None
    ids: list[str] = []
    for e in entries:
        if e.lstrip("-").isdigit():
            i = int(e)
            if i < 0 or (n is not None and i >= n):
                yield Problem(message=f"CUDA_VISIBLE_DEVICES={raw!r}: GPU {e} does not exist "
                                      f"(NVML counts {n if n is not None else '?'}); CUDA ignores it and "
                                      "every entry after it", evidence={"CUDA_VISIBLE_DEVICES": raw, "entry": e})
                return
            ids.append(snap.uuids[i] if n is not None and i < len(snap.uuids) and snap.uuids[i] else e)
        elif e.upper().startswith(("GPU-", "MIG-")):
            if e.upper().startswith("GPU-") and snap.ok and snap.uuids and not any(
                    _norm_uuid(u).startswith(_norm_uuid(e)) for u in snap.uuids if u):
                yield Problem(message=f"CUDA_VISIBLE_DEVICES={raw!r}: no GPU on this host has UUID {e}",
                              evidence={"CUDA_VISIBLE_DEVICES": raw, "entry": e, "uuids": snap.uuids})
                return
            match = [u for u in snap.uuids if u and _norm_uuid(u).startswith(_norm_uuid(e))]
            ids.append(match[0] if len(match) == 1 else e)
        else:
            yield Problem(message=f"CUDA_VISIBLE_DEVICES={raw!r}: entry {e!r} is not a GPU index or UUID; CUDA "
                                  "ignores it and every entry after it",
                          evidence={"CUDA_VISIBLE_DEVICES": raw, "entry": e})
            return
    dupes = sorted({x for x in ids if ids.count(x) > 1})
    if dupes:
        yield Problem(message=f"CUDA_VISIBLE_DEVICES={raw!r} lists the same GPU more than once ({', '.join(dupes)})",
                      evidence={"CUDA_VISIBLE_DEVICES": raw, "duplicates": dupes})


def current_device_problem(expected: int, actual: int | None, local_rank: int | None) -> Problem | None:
    """The DDP504 finding for a rank whose current CUDA device is not the one it should use."""
    if actual is None or actual == expected:
        return None
    return Problem(message=f"torch.cuda.current_device() is {actual} but this rank (LOCAL_RANK={local_rank}) "
                           f"should use cuda:{expected}",
                   evidence={"current_device": actual, "expected": expected, "local_rank": local_rank})


@check("DDP504", category="gpu", severity="error", title="Current CUDA device is not the local rank's GPU",
       stage="group")
def current_device_matches(ctx: RankContext, group: Any) -> Iterator[Problem]:
    """
    What: Once the process group exists, torch.cuda.current_device() differs from the GPU this
    rank's local rank maps to (cuda:LOCAL_RANK, or cuda:0 with one GPU per rank).
    Why: NCCL and every tensor created with `.cuda()` use the current device; a rank left on cuda:0
    shares it with local rank 0 (out-of-memory, a fraction of the speed, or NCCL's "Duplicate GPU
    detected"). DDP701 compares the ranks' GPU UUIDs across ranks.
    Fix: Call torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) before init_process_group and
    wrap the model with DistributedDataParallel(model, device_ids=[local_rank]).
    """
    device = str(getattr(group, "device", "cpu"))
    if not device.startswith("cuda:"):
        return
    p = current_device_problem(int(device.split(":", 1)[1]), torch_current_device(), ctx.local_rank)
    if p is not None:
        yield p


@check("DDP505", category="gpu", severity="warning", title="GPU memory already in use")
def gpu_memory_free(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Before training starts, this rank's GPU already has more memory in use than
    `gpu_busy_mib` (default 1024 MiB), or other processes hold contexts on it.
    Why: A leftover process from an earlier run (or another job on a shared host) holds memory and
    compute: the training runs out of memory or runs slowly, and that process may be a zombie
    rank of a crashed job that still holds the GPU.
    Fix: Look at `nvidia-smi` and end the processes listed (`kill <pid>`); on a shared host pick
    free GPUs with CUDA_VISIBLE_DEVICES.
    """
    snap = snapshot(ctx)
    limit = _opt(ctx, "gpu_busy_mib")
    me = os.getpid()
    for g in snap.gpus:
        if is_unknown(g.memory):
            continue
        used_mib = g.memory.used / MIB
        others = [p for p in (g.processes if not is_unknown(g.processes) else []) if p.pid != me]
        if used_mib <= limit:
            continue
        procs = ", ".join(f"pid {p.pid} ({p.used_bytes // MIB} MiB)" if p.used_bytes is not None else f"pid {p.pid}"
                          for p in others[:8]) or "NVML lists no process (it may run in another container)"
        yield Problem(
            message=f"{g.label}: {used_mib:.0f} MiB of {g.memory.total / MIB:.0f} MiB already in use "
                    f"(limit {limit:.0f} MiB): {procs}",
            evidence={"gpu": g.label, "used_mib": round(used_mib), "total_mib": round(g.memory.total / MIB),
                      "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in others]})


@check("DDP506", category="gpu", severity="error", title="Uncorrectable ECC errors on a GPU")
def ecc_errors(ctx: RankContext) -> Iterator[Problem]:
    """
    What: NVML counts uncorrectable (double-bit) ECC memory errors on this rank's GPU: since the
    last driver load (volatile: an error), or over the GPU's life (aggregate: a warning).
    Why: An uncorrectable error corrupts data or kills the process ("uncorrectable ECC error
    encountered"), and the job crashes or hangs in a collective on that rank; past errors mean the
    memory is failing.
    Fix: Stop using the GPU: replace the instance (on SageMaker stop and restart the job), or have
    the host's administrator reset the GPU (`nvidia-smi -r`) and check it with `nvidia-smi -q -d ECC`.
    """
    for g in snapshot(ctx).gpus:
        ev = {"gpu": g.label, "volatile": _unknown_text(g.ecc_volatile), "aggregate": _unknown_text(g.ecc_aggregate)}
        if not is_unknown(g.ecc_volatile) and g.ecc_volatile > 0:
            yield Problem(message=f"{g.label}: {g.ecc_volatile} uncorrectable ECC error(s) since the driver "
                                  f"loaded (aggregate {_unknown_text(g.ecc_aggregate)})", evidence=ev)
        elif not is_unknown(g.ecc_aggregate) and g.ecc_aggregate > 0:
            yield Problem(message=f"{g.label}: {g.ecc_aggregate} uncorrectable ECC error(s) over the GPU's "
                                  "life (none since the driver loaded)", severity="warning", evidence=ev)


@check("DDP507", category="gpu", severity="error", title="GPU memory retirement or row remapping pending")
def memory_retirement(ctx: RankContext) -> Iterator[Problem]:
    """
    What: This rank's GPU has a page retirement or a row remapping pending (it takes effect only
    after a GPU reset), or row remapping failed; rows or pages already retired are reported as
    information.
    Why: Until the reset, the bad memory is still in use and uncorrectable errors recur; a failed
    remapping means the GPU has no spare rows left and must be replaced.
    Fix: Reset the GPU (`nvidia-smi -r` with no process on it, or reboot / replace the instance);
    if remapping failed, replace the GPU. `nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT` shows the
    state.
    """
    for g in snapshot(ctx).gpus:
        rr = g.remapped
        ev = {"gpu": g.label, "retired_double_bit": _unknown_text(g.retired_dbe),
              "retired_single_bit": _unknown_text(g.retired_sbe),
              "retired_pending": _unknown_text(g.retired_pending),
              "remapped_rows": None if is_unknown(rr) else rr.__dict__}
        if not is_unknown(rr) and rr.failure:
            yield Problem(message=f"{g.label}: row remapping failed (uncorrectable rows {rr.uncorrectable})", evidence=ev)
        elif (not is_unknown(rr) and rr.pending) or g.retired_pending is True:
            what = "row remapping" if not is_unknown(rr) and rr.pending else "page retirement"
            yield Problem(message=f"{g.label}: {what} pending until the GPU is reset", evidence=ev)
        else:
            counts = []
            if not is_unknown(rr) and rr.uncorrectable:
                counts.append(f"{rr.uncorrectable} row(s) remapped for uncorrectable errors")
            if not is_unknown(g.retired_dbe) and g.retired_dbe:
                counts.append(f"{g.retired_dbe} page(s) retired for double-bit errors")
            if counts:
                yield Problem(message=f"{g.label}: " + ", ".join(counts) + " (nothing pending)",
                              severity="info", evidence=ev)


@check("DDP508", category="gpu", severity="warning", title="GPU clocks slowed down")
def clocks_throttled(ctx: RankContext) -> Iterator[Problem]:
    """
    What: NVML's current clock event reasons ("throttle reasons" before nvidia-ml-py 12) for this
    rank's GPU include a hardware slowdown, thermal slowdown (hardware or software) or power
    brake; the software power cap alone is information.
    Why: One slowed GPU makes every rank wait for it at each all_reduce: the whole job runs at the
    speed of the slowest GPU. Thermal slowdown points to cooling, HW slowdown and power brake to
    the power supply or the board.
    Fix: Check `nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`; on a cloud instance replace it; on
    your own hardware check airflow, fans and power cabling.
    """
    for g in snapshot(ctx).gpus:
        if is_unknown(g.clock_mask):
            continue
        bad = [r for r in g.clock_reasons if r in SLOWDOWN_REASONS]
        ev = {"gpu": g.label, "mask": g.clock_mask, "reasons": g.clock_reasons}
        if bad:
            yield Problem(message=f"{g.label}: clocks slowed by {', '.join(bad)} (reasons mask {g.clock_mask:#x})",
                          evidence=ev)
        elif "sw_power_cap" in g.clock_reasons:
            yield Problem(message=f"{g.label}: clocks held at the software power cap", severity="info",
                          hint="Normal under full load; if it shows on an idle GPU, check the power limit "
                               "(`nvidia-smi -q -d POWER`).", evidence=ev)


@check("DDP509", category="gpu", severity="warning", title="PCIe link below the device's maximum")
def pcie_link(ctx: RankContext) -> Iterator[Problem]:
    """
    What: This rank's GPU runs its PCIe link narrower than its maximum width (a warning), or at a
    lower generation than its maximum (information on an idle GPU, which lowers the link speed to
    save power; a warning when the GPU is busier than `pcie_load_pct`, default 50%).
    Why: A link trained at x8 instead of x16 halves host-to-GPU bandwidth (data loading, and NCCL
    traffic that crosses PCIe): the job runs slower on that rank and all others wait for it. It
    usually means a badly seated card or riser.
    Fix: Compare `nvidia-smi -q -d PCIE` (current vs max) under load; replace the instance, or on
    your own hardware reseat the GPU or riser.
    """
    load_limit = _opt(ctx, "pcie_load_pct")
    for g in snapshot(ctx).gpus:
        link = g.pcie
        if link is None:
            continue
        ev = {"gpu": g.label, "gen": _unknown_text(link.gen), "max_gen": _unknown_text(link.max_gen),
              "width": _unknown_text(link.width), "max_width": _unknown_text(link.max_width),
              "utilization_pct": _unknown_text(g.utilization)}
        if nvml.known(link.width, link.max_width) and link.width < link.max_width:
            yield Problem(message=f"{g.label}: PCIe link width x{link.width}, the device supports x{link.max_width}",
                          evidence=ev)
        if nvml.known(link.gen, link.max_gen) and link.gen < link.max_gen:
            busy = not is_unknown(g.utilization) and g.utilization >= load_limit
            load = f"{g.utilization}%" if not is_unknown(g.utilization) else "unknown"
            yield Problem(
                message=f"{g.label}: PCIe gen {link.gen}, the link supports gen {link.max_gen} (GPU load {load})",
                severity="warning" if busy else "info",
                hint=None if busy else "Idle GPUs lower their PCIe generation to save power; check again under "
                                       "load (`nvidia-smi -q -d PCIE` while training).",
                evidence=ev)


@check("DDP510", category="gpu", severity="warning", title="NVLink links down")
def nvlink_down(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Some NVLink links of this rank's GPU are inactive while others are active, or every link
    is down on an instance type whose GPUs are joined by NVLink/NVSwitch (p3, p4d, p4de, p5: an
    error). A device with no NVLink at all is not reported.
    Why: NCCL routes traffic over the remaining links or falls back to PCIe: all_reduce within the
    node runs several times slower, and on NVSwitch systems a GPU without links cannot reach peers
    at full speed.
    Fix: Check `nvidia-smi nvlink --status` and `nvidia-smi topo -m`; on NVSwitch systems make sure
    nvidia-fabricmanager runs; otherwise replace the instance.
    """
    nvlink_instance = _instance(ctx) in NVLINK_INSTANCES
    for g in snapshot(ctx).gpus:
        states = g.nvlink
        if is_unknown(states) or not states:
            continue
        down = [i for i, a in enumerate(states) if not a]
        ev = {"gpu": g.label, "links": len(states), "down": down, "instance_type": _instance(ctx)}
        if not down:
            continue
        if len(down) < len(states):
            yield Problem(message=f"{g.label}: NVLink link(s) {', '.join(map(str, down))} down, "
                                  f"{len(states) - len(down)} of {len(states)} active", evidence=ev)
        elif nvlink_instance:
            yield Problem(message=f"{g.label}: all {len(states)} NVLink links down on a {_instance(ctx)}",
                          severity="error", evidence=ev)
        else:
            yield Problem(message=f"{g.label}: none of its {len(states)} NVLink links is active (no NVLink "
                                  "bridge fitted?)", severity="info", evidence=ev)


@check("DDP511", category="gpu", severity="error", title="Driver too old for torch's CUDA")
def driver_supports_cuda(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The CUDA version the driver supports (NVML nvmlSystemGetCudaDriverVersion) is older than
    the CUDA version torch was built for (torch.version.cuda): an older major version is an error,
    the same major with an older minor a warning.
    Why: With an older major version CUDA fails to initialise ("The NVIDIA driver on your system is
    too old"); within one major version CUDA's minor-version compatibility runs most code, but
    kernels needing JIT compilation of newer PTX fail at run time.
    Fix: Upgrade the driver to one that supports torch's CUDA (see NVIDIA's CUDA compatibility
    table), or install the torch wheel for the driver's CUDA (e.g. `pip install torch --index-url
    https://download.pytorch.org/whl/cu121`).
    """
    if not _node_leader(ctx):
        return
    tc = torch_cuda_version()
    snap = snapshot(ctx)
    if not tc or not snap.ok or is_unknown(snap.cuda_driver_version):
        return
    try:
        want = tuple(int(x) for x in tc.split(".")[:2])
    except ValueError:
        return
    have = nvml.cuda_version_tuple(int(snap.cuda_driver_version))
    ev = {"torch_cuda": tc, "driver_cuda": f"{have[0]}.{have[1]}", "driver": _unknown_text(snap.driver_version)}
    if have[0] < want[0]:
        yield Problem(message=f"driver {_unknown_text(snap.driver_version)} supports CUDA {have[0]}.{have[1]}, "
                              f"torch was built for CUDA {tc}", evidence=ev)
    elif have[0] == want[0] and have < want:
        yield Problem(message=f"driver {_unknown_text(snap.driver_version)} supports CUDA {have[0]}.{have[1]}, "
                              f"torch was built for CUDA {tc} (minor-version compatibility: most code runs, "
                              "PTX JIT does not)", severity="warning", evidence=ev)


@check("DDP512", category="gpu", severity="info", title="GPU persistence mode off")
def persistence_mode(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Persistence mode is off on this rank's GPU.
    Why: Without it the driver tears the GPU state down when no process uses it and rebuilds it on
    the next start, adding seconds to each process start; harmless for one long job.
    Fix: `sudo nvidia-smi -pm 1` (or run nvidia-persistenced) on hosts you administer.
    """
    for g in snapshot(ctx).gpus:
        if g.persistence is False:
            yield Problem(message=f"{g.label}: persistence mode is off", evidence={"gpu": g.label})


@check("DDP513", category="gpu", severity="info", title="GPU health fields NVML could not read")
def unknown_fields(ctx: RankContext) -> Iterator[Problem]:
    """
    What: NVML answered "not supported", "no permission" or an error for some health fields of this
    rank's GPU (ECC, memory retirement, clocks, PCIe, NVLink, memory), or this rank's GPU could not
    be matched to an NVML device; those checks treated the field as unknown.
    Why: Consumer GPUs have no ECC, MIG slices and some containers hide fields: nothing is wrong,
    but the corresponding problems cannot be ruled out.
    Fix: Nothing to fix; for full coverage run on the host (or a container started with the NVIDIA
    container toolkit) with a data-center GPU.
    """
    snap = snapshot(ctx)
    for ci, why in sorted(snap.unresolved.items()):
        yield Problem(message=f"cuda:{ci}: no NVML device found ({why}); its health is unknown",
                      evidence={"cuda_index": ci, "why": why})
    for g in snap.gpus:
        fields: dict[str, str] = {}
        for name, value in (("memory", g.memory), ("ECC (volatile)", g.ecc_volatile),
                            ("ECC (aggregate)", g.ecc_aggregate), ("clock reasons", g.clock_mask),
                            ("NVLink", g.nvlink), ("persistence mode", g.persistence),
                            ("utilisation", g.utilization)):
            if is_unknown(value):
                fields[name] = value.reason
        if is_unknown(g.retired_dbe) and is_unknown(g.remapped):  # one of the two is normal
            fields["memory retirement / row remapping"] = g.remapped.reason
        if g.pcie is not None:
            for name in ("gen", "max_gen", "width", "max_width"):
                v = getattr(g.pcie, name)
                if is_unknown(v):
                    fields[f"PCIe {name}"] = v.reason
        if fields:
            yield Problem(message=f"{g.label}: unknown " + ", ".join(f"{k} ({v})" for k, v in fields.items()),
                          evidence={"gpu": g.label, "unknown": fields})
