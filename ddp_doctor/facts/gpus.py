"""GPU facts of one rank: one NVML read (Snapshot of GpuFacts per GPU).

What is inside: the seams to torch.cuda (torch_cuda_version, torch_device_uuid,
torch_current_device: tests replace them), which GPUs a rank answers for (target_indices),
matching a CUDA index to its NVML device (norm_uuid, _resolve), the per-GPU health read
(_read_gpu) and the snapshot (read_snapshot). The RankContext holds a rank's snapshot
(RankContext.gpu_snapshot), so that every gpu check sees one read.

A pure reader of plain values, like the rest of facts/: it knows nothing of the context, checks,
reports or the command line. What NVML cannot read stays an Unknown, never an exception.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ddp_doctor.facts import nvml
from ddp_doctor.facts.env_values import visible_devices
from ddp_doctor.facts.nvml import Unknown, is_unknown

# ---------------------------------------------------------------------------------------------
# Seams to torch.cuda (tests replace these; nothing here runs CUDA on a host without a GPU)

def torch_cuda_version() -> str | None:
    """The CUDA version torch was built for ("12.4"), None for a CPU build."""
    try:
        import torch
        return torch.version.cuda
    except Exception:  # noqa: BLE001 - torch missing or broken: unknown, never a crashed fact
        return None


def torch_nccl_version() -> tuple[int, ...] | None:
    """The NCCL version torch loads ((2, 21, 5)), None for a build without NCCL."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        v = torch.cuda.nccl.version()
        return tuple(int(x) for x in v) if isinstance(v, tuple) else None
    except Exception:  # noqa: BLE001 - torch missing, or a driver error: unknown, never a crashed fact
        return None


def torch_device_uuid(index: int) -> str | None:
    """The UUID of cuda:index as CUDA numbers devices (which may differ from NVML's order)."""
    try:
        import torch
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # noqa: BLE001 - torch missing, or a driver error: unknown, never a crashed fact
        return None


def torch_current_device() -> int | None:
    try:
        import torch
        return int(torch.cuda.current_device()) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - torch missing, or a driver error: unknown, never a crashed fact
        return None


# ---------------------------------------------------------------------------------------------
# One read of NVML per rank, shared by the gpu checks

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


def target_indices(visible: int, local_rank: int | None, local_world_size: int | None,
                   entries: list[str] | None) -> list[int]:
    """CUDA indices of the GPUs a rank answers for: `visible` GPUs torch sees, its local rank and
    local world size, `entries` its CUDA_VISIBLE_DEVICES (env_values.visible_devices)."""
    if local_rank is None:
        return list(range(visible))
    if visible == 1 and entries is not None and local_world_size is not None and local_world_size > 1:
        return [0]  # one GPU per rank through CUDA_VISIBLE_DEVICES
    return [local_rank] if 0 <= local_rank < visible else []


def norm_uuid(u: str) -> str:
    u = u.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def _resolve(entries: list[str] | None, cuda_index: int, uuids: list[str]) -> tuple[int | None, str | None]:
    """(NVML index, None) for cuda:index under CUDA_VISIBLE_DEVICES `entries`, or (None, why not)."""
    tu = torch_device_uuid(cuda_index)
    if tu:
        want = norm_uuid(tu)
        for i, u in enumerate(uuids):
            if norm_uuid(u) == want:
                return i, None
    if entries is None:
        return cuda_index, None  # CUDA and NVML agree when CUDA_DEVICE_ORDER=PCI_BUS_ID (usual on servers)
    if cuda_index >= len(entries):
        return None, f"CUDA_VISIBLE_DEVICES has no entry {cuda_index}"
    e = entries[cuda_index]
    if e.isdigit():
        return int(e), None
    if e.upper().startswith("MIG-"):
        return None, f"{e} is a MIG instance (NVML health fields are per physical GPU)"
    matches = [i for i, u in enumerate(uuids) if norm_uuid(u).startswith(norm_uuid(e))]
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


def read_snapshot(visible: int, local_rank: int | None, local_world_size: int | None,
                  cuda_visible_devices: str | None) -> Snapshot:
    """Read NVML once for the GPUs a rank answers for (target_indices); `cuda_visible_devices` is
    the variable's raw value (None: unset)."""
    entries = visible_devices(cuda_visible_devices)
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
        for ci in target_indices(visible, local_rank, local_world_size, entries):
            ni, why = _resolve(entries, ci, uuids)
            if ni is None:
                unresolved[ci] = why or "unknown"
            else:
                gpus.append(_read_gpu(s, ci, ni))
        return Snapshot(True, None, None, count, s.driver_version(), s.cuda_driver_version(), gpus,
                        unresolved, uuids)

