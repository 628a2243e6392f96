"""GPU checks through NVML (facts in ddp_doctor.facts.gpus), torch.cuda where NVML has no answer (DDP500-DDP599).

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
from typing import Any, Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.facts import gpus as gpu_facts
from ddp_doctor.facts import nvml
from ddp_doctor.facts.env_values import visible_devices
from ddp_doctor.facts.gpus import Snapshot
from ddp_doctor.facts.instances import BY_NAME, InstanceType
from ddp_doctor.facts.nvml import is_unknown
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check

GPU_BACKENDS = ("nccl", "smddp")
OPTION_DEFAULTS: dict[str, float] = {"gpu_busy_mib": 1024, "pcie_load_pct": 50}
MIB = 1 << 20

# Clock event reasons that mean the GPU runs slower than it should.
SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
# nvmlInit failures meaning "no NVIDIA stack here" rather than "a broken one".
NO_NVML = ("LibraryNotFound", "ImportError")


# ---------------------------------------------------------------------------------------------
# Helpers on the rank's GPU facts (ddp_doctor.facts.gpus, read once per context: ctx.gpu_snapshot())

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


def _instance_type(ctx: RankContext) -> InstanceType | None:
    """This host's row of the instance table (SageMaker's type, with or without "ml.")."""
    return BY_NAME.get(_instance(ctx) or "")


def _unknown_text(v: Any) -> str:
    return v.reason if is_unknown(v) else str(v)


# ---------------------------------------------------------------------------------------------
# Checks

def _cpu_job(ctx: RankContext) -> tuple[Snapshot, int, dict[str, Any]] | None:
    """(snapshot, NVML GPU count, evidence) on the node leader of a job torch runs on the CPU
    (no GPU visible to torch, CPU backend); None otherwise."""
    if ctx.backend in GPU_BACKENDS or ctx.host.visible_gpus > 0:
        return None  # a GPU backend without a GPU is DDP106's error
    snap = ctx.gpu_snapshot()
    if not _node_leader(ctx):
        return None
    ev = {"backend": ctx.backend, "visible_gpus": ctx.host.visible_gpus, "nvml_gpus": snap.count if snap.ok else None,
          "nvml_error": snap.error, "torch_cuda": gpu_facts.torch_cuda_version(),
          "CUDA_VISIBLE_DEVICES": ctx.env.get("CUDA_VISIBLE_DEVICES")}
    return snap, _count(snap), ev


@check("DDP500", category="gpu", severity="info", title="GPU checks not applicable", cause_class="configuration")
def gpu_not_applicable(ctx: RankContext) -> Iterator[Problem]:
    """
    What: This host has no GPU (NVML counts none, torch sees none) and the job uses a CPU backend
    (gloo, mpi), so the GPU checks were skipped. (GPUs that NVML counts but torch does not see are
    DDP515.)
    Why: On a CPU-only machine that is expected; the finding records why no GPU check ran.
    Fix: Nothing on a CPU-only host.
    """
    found = _cpu_job(ctx)
    if found is None or found[1] > 0:
        return
    snap, _, ev = found
    nvml_said = f"NVML: {snap.error}" if not snap.ok else "NVML counts 0 GPUs"
    yield Problem(message=f"no GPU on this host ({nvml_said}; torch sees 0) and backend {ctx.backend}: "
                          "GPU checks not applicable", evidence=ev)


@check("DDP515", category="gpu", severity="warning", title="GPUs present but torch sees none",
       cause_class="configuration")
def gpus_hidden_from_torch(ctx: RankContext) -> Iterator[Problem]:
    """
    What: NVML counts GPUs on this host but torch sees none, and the job uses a CPU backend (gloo,
    mpi). (Reported as DDP500 at severity warning before it had an ID of its own.)
    Why: A CPU-only torch build (torch.version.cuda is None) or a CUDA_VISIBLE_DEVICES that hides
    every GPU ("" or -1): the job trains on the CPU, many times slower, without failing.
    Fix: Install a CUDA build of torch (torch.version.cuda must not be None) and do not set
    CUDA_VISIBLE_DEVICES to "" or -1; then use backend nccl.
    """
    found = _cpu_job(ctx)
    if found is None or found[1] == 0:
        return
    _, n, ev = found
    cvd = ctx.env.get("CUDA_VISIBLE_DEVICES")
    why = (f"CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else
           f"torch.version.cuda={gpu_facts.torch_cuda_version()!r}")
    yield Problem(message=f"NVML counts {n} GPU(s) but torch sees none ({why}); the job would run on "
                          f"the CPU with backend {ctx.backend}", evidence=ev)


@check("DDP501", category="gpu", severity="error", title="NVML cannot be initialised", severities=("warning",))
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
    Severity: error when NVML fails where no GPU is usable for a GPU backend; a warning when torch
    still sees GPUs and only the health checks are lost.
    """
    snap = ctx.gpu_snapshot()
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


@check("DDP502", category="gpu", severity="error", title="GPU count differs from the instance type",
       severities=("warning",))
def gpu_count_matches(ctx: RankContext) -> Iterator[Problem]:
    """
    What: NVML counts fewer (or more) GPUs than the instance type has (ml.p4d.24xlarge: 8,
    the instance table in facts/instances.py). (Fewer ranks than GPUs, once part of this ID, is DDP514.)
    Why: A GPU missing from an 8-GPU instance has fallen off the bus (SM_NUM_GPUS, read when the
    container started, then agrees with the wrong count, so nothing else notices).
    Fix: Replace the instance (stop the job and start it again) when a GPU is missing.
    Severity: error when fewer GPUs are counted than the instance type has; a warning when more are
    counted (the instance table may be out of date, nothing is missing).
    """
    if not _node_leader(ctx):
        return
    snap = ctx.gpu_snapshot()
    it = _instance(ctx)
    row = _instance_type(ctx)
    # Only the p3/p4d/p4de/p5 types of docs/facts.md (those with a known GPU model) are compared.
    expected = row.gpus if row is not None and row.gpu_model else None
    seen: int | None = _count(snap) if snap.ok and not is_unknown(snap.count) else None
    source = "NVML counts"
    if seen is None and "CUDA_VISIBLE_DEVICES" not in ctx.env and ctx.host.visible_gpus > 0:
        seen, source = ctx.host.visible_gpus, "torch sees"
    if expected is not None and seen is not None and seen != expected:
        yield Problem(
            message=f"{source} {seen} GPU(s) on this {it} host; the instance type has {expected}",
            severity=None if seen < expected else "warning",
            evidence={"instance_type": it, "expected": expected, "counted": seen, "source": source})


@check("DDP514", category="gpu", severity="info", title="Fewer ranks than GPUs on a node", cause_class="configuration")
def gpus_idle(ctx: RankContext) -> Iterator[Problem]:
    """
    What: With a GPU backend, this node runs fewer ranks (LOCAL_WORLD_SIZE) than it has visible
    GPUs. (Reported as DDP502 at severity info before it had an ID of its own.)
    Why: The GPUs without a rank stay idle: the job trains slower than the instance allows, which
    may be intended (a GPU kept for evaluation) or a launcher left at one process per node.
    Fix: Start one rank per GPU (`torchrun --nproc-per-node <GPUs>`, or let SageMaker's distribution
    do it), or narrow CUDA_VISIBLE_DEVICES to the GPUs the job should use.
    """
    if not _node_leader(ctx):
        return
    lws, visible = ctx.local_world_size, ctx.host.visible_gpus
    if ctx.backend in GPU_BACKENDS and lws is not None and 0 < lws < visible:
        yield Problem(
            message=f"LOCAL_WORLD_SIZE={lws} rank(s) on this node but {visible} GPUs are visible: "
                    f"{visible - lws} GPU(s) idle",
            hint=f"Start {visible} ranks per node (`torchrun --nproc-per-node {visible}`), "
                 "or narrow CUDA_VISIBLE_DEVICES if the others are meant for something else.",
            evidence={"local_world_size": lws, "visible_gpus": visible})


@check("DDP503", category="gpu", severity="error", title="CUDA_VISIBLE_DEVICES names GPUs that do not exist",
       cause_class="configuration")
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
    entries = visible_devices(ctx.env.get("CUDA_VISIBLE_DEVICES"))
    if entries is None or not entries or entries[0] == "-1" or not _node_leader(ctx):
        return
    snap = ctx.gpu_snapshot()
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
                    gpu_facts.norm_uuid(u).startswith(gpu_facts.norm_uuid(e)) for u in snap.uuids if u):
                yield Problem(message=f"CUDA_VISIBLE_DEVICES={raw!r}: no GPU on this host has UUID {e}",
                              evidence={"CUDA_VISIBLE_DEVICES": raw, "entry": e, "uuids": snap.uuids})
                return
            match = [u for u in snap.uuids if u and gpu_facts.norm_uuid(u).startswith(gpu_facts.norm_uuid(e))]
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
       stage="group", cause_class="code")
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
    p = current_device_problem(int(device.split(":", 1)[1]), gpu_facts.torch_current_device(), ctx.local_rank)
    if p is not None:
        yield p


@check("DDP505", category="gpu", severity="warning", title="GPU memory already in use",
       cause_class="host", action="investigate")
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
    snap = ctx.gpu_snapshot()
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


@check("DDP506", category="gpu", severity="error", title="Uncorrectable ECC errors on a GPU", severities=("warning",))
def ecc_errors(ctx: RankContext) -> Iterator[Problem]:
    """
    What: NVML counts uncorrectable (double-bit) ECC memory errors on this rank's GPU: since the
    last driver load (volatile: an error), or over the GPU's life (aggregate: a warning).
    Why: An uncorrectable error corrupts data or kills the process ("uncorrectable ECC error
    encountered"), and the job crashes or hangs in a collective on that rank; past errors mean the
    memory is failing.
    Fix: Stop using the GPU: replace the instance (on SageMaker stop and restart the job), or have
    the host's administrator reset the GPU (`nvidia-smi -r`) and check it with `nvidia-smi -q -d ECC`.
    Severity: error for uncorrectable errors since the driver loaded; a warning for errors only in
    the GPU's lifetime count.
    """
    for g in ctx.gpu_snapshot().gpus:
        ev = {"gpu": g.label, "volatile": _unknown_text(g.ecc_volatile), "aggregate": _unknown_text(g.ecc_aggregate)}
        if not is_unknown(g.ecc_volatile) and g.ecc_volatile > 0:
            yield Problem(message=f"{g.label}: {g.ecc_volatile} uncorrectable ECC error(s) since the driver "
                                  f"loaded (aggregate {_unknown_text(g.ecc_aggregate)})", evidence=ev)
        elif not is_unknown(g.ecc_aggregate) and g.ecc_aggregate > 0:
            yield Problem(message=f"{g.label}: {g.ecc_aggregate} uncorrectable ECC error(s) over the GPU's "
                                  "life (none since the driver loaded)", severity="warning", evidence=ev)


@check("DDP507", category="gpu", severity="error", title="GPU memory retirement or row remapping pending",
       severities=("info",))
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
    Severity: error for a pending retirement or remapping, or a failed remapping; info for rows or
    pages already retired with nothing pending.
    """
    for g in ctx.gpu_snapshot().gpus:
        rr = g.remapped
        ev = {"gpu": g.label, "retired_double_bit": _unknown_text(g.retired_dbe),
              "retired_single_bit": _unknown_text(g.retired_sbe),
              "retired_pending": _unknown_text(g.retired_pending),
              "remapped_rows": None if is_unknown(rr) else rr.__dict__}
        if not is_unknown(rr) and rr.failure:
            yield Problem(message=f"{g.label}: row remapping failed (uncorrectable rows {rr.uncorrectable})",
                          evidence=ev)
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


@check("DDP508", category="gpu", severity="warning", title="GPU clocks slowed down", severities=("info",))
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
    Severity: a warning for thermal, power-brake or other slowdowns; info for the software power
    cap, normal under full load.
    """
    for g in ctx.gpu_snapshot().gpus:
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


@check("DDP509", category="gpu", severity="warning", title="PCIe link below the device's maximum",
       severities=("info",))
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
    Severity: a warning for a narrower link, and for a lower generation on a busy GPU (load at or
    above pcie_load_pct); info for a lower generation on an idle GPU.
    """
    load_limit = _opt(ctx, "pcie_load_pct")
    for g in ctx.gpu_snapshot().gpus:
        link = g.pcie
        if link is None:
            continue
        ev = {"gpu": g.label, "gen": _unknown_text(link.gen), "max_gen": _unknown_text(link.max_gen),
              "width": _unknown_text(link.width), "max_width": _unknown_text(link.max_width),
              "utilization_pct": _unknown_text(g.utilization)}
        if not is_unknown(link.width) and not is_unknown(link.max_width) and link.width < link.max_width:
            yield Problem(message=f"{g.label}: PCIe link width x{link.width}, the device supports x{link.max_width}",
                          evidence=ev)
        if not is_unknown(link.gen) and not is_unknown(link.max_gen) and link.gen < link.max_gen:
            busy = not is_unknown(g.utilization) and g.utilization >= load_limit
            load = f"{g.utilization}%" if not is_unknown(g.utilization) else "unknown"
            yield Problem(
                message=f"{g.label}: PCIe gen {link.gen}, the link supports gen {link.max_gen} (GPU load {load})",
                severity="warning" if busy else "info",
                hint=None if busy else "Idle GPUs lower their PCIe generation to save power; check again under "
                                       "load (`nvidia-smi -q -d PCIE` while training).",
                evidence=ev)


@check("DDP510", category="gpu", severity="warning", title="NVLink links down", severities=("error", "info"))
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
    Severity: a warning when some links are down; error when all are down on an NVLink/NVSwitch
    instance type (p3, p4d, p4de, p5); info when none is active elsewhere (no bridge fitted).
    """
    row = _instance_type(ctx)
    # Instances whose GPUs are joined by NVLink / NVSwitch: a device with every link down is broken.
    nvlink_instance = row is not None and row.nvlink is True
    for g in ctx.gpu_snapshot().gpus:
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


@check("DDP511", category="gpu", severity="error", title="Driver too old for torch's CUDA", severities=("warning",),
       cause_class="configuration")
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
    Severity: error when the driver's CUDA major version is older than torch's; a warning for an
    older minor version of the same major (minor-version compatibility).
    """
    if not _node_leader(ctx):
        return
    tc = gpu_facts.torch_cuda_version()
    snap = ctx.gpu_snapshot()
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


@check("DDP512", category="gpu", severity="info", title="GPU persistence mode off", cause_class="configuration")
def persistence_mode(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Persistence mode is off on this rank's GPU.
    Why: Without it the driver tears the GPU state down when no process uses it and rebuilds it on
    the next start, adding seconds to each process start; harmless for one long job.
    Fix: `sudo nvidia-smi -pm 1` (or run nvidia-persistenced) on hosts you administer.
    """
    for g in ctx.gpu_snapshot().gpus:
        if g.persistence is False:
            yield Problem(message=f"{g.label}: persistence mode is off", evidence={"gpu": g.label})


@check("DDP513", category="gpu", severity="info", title="GPU health fields NVML could not read", cause_class="unknown")
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
    snap = ctx.gpu_snapshot()
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
