"""FAKE NVML for tests. No GPU exists on the machines these tests run on: FakeNVML stands in for the
`pynvml` module (nvidia-ml-py) behind ddp_doctor.facts.nvml's one seam (`nvml.provider`).

It mimics the part of pynvml's API that ddp_doctor.facts.nvml uses, with the same names, argument
orders and return shapes, and it raises pynvml's own NVMLError subclasses (NVMLError_NotSupported,
NVMLError_NoPermission, NVMLError_DriverNotLoaded, ...) so the wrapper is tested against the real
exception types. Everything is made up: a healthy p4d-like host by default (p4d_host()), with
faults injected per GPU through FakeGPU's fields, `unsupported` (field -> NVMLError_NotSupported)
and `errors` (field -> an exception instance).

    fake = p4d_host()
    fake.gpus[3].ecc_volatile = 2
    monkeypatch.setattr(nvml, "provider", lambda: fake)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

# The constants ddp_doctor.facts.nvml reads, with pynvml's values.
CONSTANTS = {name: getattr(pynvml, name) for name in dir(pynvml)
             if name.startswith(("NVML_MEMORY_ERROR_TYPE_", "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC",
                                 "NVML_PAGE_RETIREMENT_CAUSE_", "NVML_NVLINK_MAX_LINKS", "NVML_FEATURE_",
                                 "nvmlClocksEventReason", "nvmlClocksThrottleReason"))}
NotSupported = pynvml.NVMLError_NotSupported
NoPermission = pynvml.NVMLError_NoPermission


@dataclass
class FakeGPU:
    """One made-up GPU. Fields named in `unsupported` raise NVMLError_NotSupported; `errors` maps a
    field to the exception its query raises."""
    index: int
    uuid: str = ""
    name: str = "NVIDIA A100-SXM4-40GB"
    memory_total: int = 40 * 1024 ** 3
    memory_used: int = 512 * 1024 ** 2  # what an idle A100 reports (reserved by the driver)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    retired_dbe: list[int] = field(default_factory=list)
    retired_sbe: list[int] = field(default_factory=list)
    retired_pending: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    clock_reasons: int = 0x1  # GPU idle
    pcie_gen: int = 4
    pcie_max_gen: int = 4
    pcie_width: int = 16
    pcie_max_width: int = 16
    utilization: int = 0
    nvlinks: list[int] = field(default_factory=lambda: [1] * 12)  # A100: 12 links, active
    persistence: int = 1
    unsupported: set[str] = field(default_factory=set)
    errors: dict[str, BaseException] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-fa4e0000-0000-4000-8000-{self.index:012d}"

    def get(self, name: str) -> Any:
        if name in self.errors:
            raise self.errors[name]
        if name in self.unsupported:
            raise NotSupported()
        return getattr(self, name)


class FakeNVML:
    """A fake pynvml module (see the module docstring): no real GPU, no real driver."""

    def __init__(self, gpus: list[FakeGPU] | None = None, *, driver_version: str = "535.183.01",
                 cuda_driver_version: int = 12020, init_error: BaseException | None = None,
                 legacy_clock_names: bool = False) -> None:
        self.gpus = gpus if gpus is not None else []
        self.driver = driver_version
        self.cuda = cuda_driver_version
        self.init_error = init_error
        self.initialised = 0
        self.shutdowns = 0
        self.legacy_clock_names = legacy_clock_names
        for k, v in CONSTANTS.items():
            setattr(self, k, v)
        self.NVMLError = pynvml.NVMLError

    def __getattribute__(self, name: str) -> Any:
        # nvidia-ml-py before 12 had only the "throttle reasons" name.
        if name == "nvmlDeviceGetCurrentClocksEventReasons" and object.__getattribute__(self, "legacy_clock_names"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # -- library ------------------------------------------------------------------------------
    def _live(self) -> None:
        if self.initialised <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._live()
        self.initialised -= 1
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._live()
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._live()
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._live()
        return len(self.gpus)

    # -- handles ------------------------------------------------------------------------------
    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGPU:
        self._live()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        g = self.gpus[index]
        if "handle" in g.errors:
            raise g.errors["handle"]
        return g

    def nvmlDeviceGetUUID(self, h: FakeGPU) -> str:
        return h.get("uuid")

    def nvmlDeviceGetName(self, h: FakeGPU) -> str:
        return h.get("name")

    # -- health -------------------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, h: FakeGPU) -> Any:
        total, used = h.get("memory_total"), h.get("memory_used")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGPU) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.get("processes")]

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGPU, error_type: int, counter_type: int) -> int:
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return h.get("ecc_aggregate") if counter_type == pynvml.NVML_AGGREGATE_ECC else h.get("ecc_volatile")

    def nvmlDeviceGetRetiredPages(self, h: FakeGPU, cause: int) -> list[int]:
        dbe = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        return list(h.get("retired_dbe" if dbe else "retired_sbe"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGPU) -> int:
        return h.get("retired_pending")

    def nvmlDeviceGetRemappedRows(self, h: FakeGPU) -> tuple[int, int, int, int]:
        return h.get("remapped_rows")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGPU) -> int:
        return h.get("clock_reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGPU) -> int:
        return h.get("clock_reasons")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeGPU) -> int:
        return h.get("pcie_gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeGPU) -> int:
        return h.get("pcie_max_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeGPU) -> int:
        return h.get("pcie_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeGPU) -> int:
        return h.get("pcie_max_width")

    def nvmlDeviceGetUtilizationRates(self, h: FakeGPU) -> Any:
        return SimpleNamespace(gpu=h.get("utilization"), memory=0)

    def nvmlDeviceGetNvLinkState(self, h: FakeGPU, link: int) -> int:
        links = h.get("nvlinks")
        if link >= len(links):
            # Real NVML: links past the device's count are "not supported" / invalid.
            raise NotSupported() if not links else pynvml.NVMLError_InvalidArgument()
        return links[link]

    def nvmlDeviceGetPersistenceMode(self, h: FakeGPU) -> int:
        return h.get("persistence")


def p4d_host(n: int = 8, **kwargs: Any) -> FakeNVML:
    """A healthy, idle ml.p4d.24xlarge-like host: 8 A100-SXM4-40GB, 12 NVLinks each, PCIe gen4 x16,
    no ECC errors, row remapping (page retirement not supported, as on A100)."""
    return FakeNVML([FakeGPU(i, unsupported={"retired_dbe", "retired_sbe", "retired_pending"})
                     for i in range(n)], **kwargs)
