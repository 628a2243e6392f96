"""A thin, total wrapper over NVML (the `pynvml` module of nvidia-ml-py).

Every query returns a value or an :class:`Unknown` marker that says why there is no value
(NVMLError_NotSupported on a consumer card, NoPermission in a locked-down container, a function
this driver lacks, ...). Nothing here raises: the GPU checks read what NVML can tell and say
"unknown" for the rest.

The one seam: :data:`provider` returns the pynvml module. Tests replace it (monkeypatch) with
`helpers.fake_nvml.FakeNVML`, which mimics the same API surface; production code has no test branch.

    with nvml.session() as s:
        if s.ok:
            h = s.handle(0)
            used = s.memory(h)       # MemoryInfo or Unknown
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing's own from Python 3.13

__all__ = ["Unknown", "is_unknown", "known", "provider", "session", "Session", "MemoryInfo", "PcieLink",
           "ProcessInfo", "RemappedRows", "CLOCK_REASONS", "cuda_version_tuple"]


@dataclass(frozen=True)
class Unknown:
    """No value: `reason` says why ("Not Supported", "no NVML", ...)."""
    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"unknown ({self.reason})"


def is_unknown(value: object) -> TypeIs[Unknown]:
    return isinstance(value, Unknown)


def known(*values: Any) -> bool:
    return not any(isinstance(v, Unknown) for v in values)


def _load_pynvml() -> Any:
    return importlib.import_module("pynvml")


# The seam: a callable returning the NVML module (pynvml, or a fake in tests).
provider: Callable[[], Any] = _load_pynvml


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_bytes: int | None   # None: NVML does not report it (e.g. some containers, MIG)


@dataclass(frozen=True)
class PcieLink:
    gen: int | Unknown
    max_gen: int | Unknown
    width: int | Unknown
    max_width: int | Unknown


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


# Clock event ("throttle" before nvidia-ml-py 12) reason bits, as NVML defines them; read from the
# module when it has them, these values otherwise.
CLOCK_REASONS: dict[str, tuple[tuple[str, ...], int]] = {
    "gpu_idle": (("nvmlClocksEventReasonGpuIdle", "nvmlClocksThrottleReasonGpuIdle"), 0x1),
    "applications_clocks_setting": (("nvmlClocksEventReasonApplicationsClocksSetting",
                                     "nvmlClocksThrottleReasonApplicationsClocksSetting"), 0x2),
    "sw_power_cap": (("nvmlClocksEventReasonSwPowerCap", "nvmlClocksThrottleReasonSwPowerCap"), 0x4),
    "hw_slowdown": (("nvmlClocksEventReasonHwSlowdown", "nvmlClocksThrottleReasonHwSlowdown"), 0x8),
    "sync_boost": (("nvmlClocksEventReasonSyncBoost", "nvmlClocksThrottleReasonSyncBoost"), 0x10),
    "sw_thermal_slowdown": (("nvmlClocksEventReasonSwThermalSlowdown",
                             "nvmlClocksThrottleReasonSwThermalSlowdown"), 0x20),
    "hw_thermal_slowdown": (("nvmlClocksEventReasonHwThermalSlowdown",
                             "nvmlClocksThrottleReasonHwThermalSlowdown"), 0x40),
    "hw_power_brake_slowdown": (("nvmlClocksEventReasonHwPowerBrakeSlowdown",
                                 "nvmlClocksThrottleReasonHwPowerBrakeSlowdown"), 0x80),
    "display_clock_setting": (("nvmlClocksEventReasonDisplayClockSetting",
                               "nvmlClocksThrottleReasonDisplayClockSetting"), 0x100),
}


def _reason(e: BaseException) -> str:
    name = type(e).__name__
    if name.startswith("NVMLError_"):
        text = str(e) if str(e) else name[len("NVMLError_"):]
        return text
    return f"{name}: {e}" if str(e) else name


def cuda_version_tuple(v: int) -> tuple[int, int]:
    """NVML's CUDA driver version integer (12040) -> (12, 4)."""
    return v // 1000, (v % 1000) // 10


class Session:
    """An initialised NVML. `ok` is False when nvmlInit failed; `error` / `error_kind` say why
    (error_kind is the NVMLError subclass name without its prefix, e.g. "LibraryNotFound",
    "DriverNotLoaded", "LibRmVersionMismatch", or "ImportError")."""

    def __init__(self, module: Any, error: str | None = None, error_kind: str | None = None) -> None:
        self.m = module
        self.error = error
        self.error_kind = error_kind

    @property
    def ok(self) -> bool:
        return self.m is not None and self.error is None

    # -- the one place that calls NVML -------------------------------------------------------
    def call(self, name: str, *args: Any) -> Any:
        """m.name(*args), or Unknown(why) for any failure (never raises)."""
        if not self.ok:
            return Unknown(self.error or "no NVML")
        fn = getattr(self.m, name, None)
        if fn is None:
            return Unknown(f"{name} not in this nvidia-ml-py")
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - NVMLError_* and anything else degrade to unknown
            return Unknown(_reason(e))

    def const(self, names: tuple[str, ...], default: int) -> int:
        for n in names:
            v = getattr(self.m, n, None)
            if isinstance(v, int):
                return v
        return default

    # -- system ------------------------------------------------------------------------------
    def device_count(self) -> int | Unknown:
        v = self.call("nvmlDeviceGetCount")
        return v if is_unknown(v) else int(v)

    def driver_version(self) -> str | Unknown:
        v = self.call("nvmlSystemGetDriverVersion")
        return v if is_unknown(v) else _text(v)

    def cuda_driver_version(self) -> int | Unknown:
        """The CUDA version the driver supports, as NVML encodes it (12040 = 12.4)."""
        v = self.call("nvmlSystemGetCudaDriverVersion")
        if is_unknown(v):
            v2 = self.call("nvmlSystemGetCudaDriverVersion_v2")
            return v if is_unknown(v2) else int(v2)
        return int(v)

    # -- devices -----------------------------------------------------------------------------
    def handle(self, index: int) -> Any:
        return self.call("nvmlDeviceGetHandleByIndex", index)

    def uuid(self, h: Any) -> str | Unknown:
        v = self.call("nvmlDeviceGetUUID", h)
        return v if is_unknown(v) else _text(v)

    def name(self, h: Any) -> str | Unknown:
        v = self.call("nvmlDeviceGetName", h)
        return v if is_unknown(v) else _text(v)

    def memory(self, h: Any) -> MemoryInfo | Unknown:
        v = self.call("nvmlDeviceGetMemoryInfo", h)
        if is_unknown(v):
            return v
        try:
            return MemoryInfo(total=int(v.total), used=int(v.used), free=int(v.free))
        except Exception as e:  # noqa: BLE001 - a binding's odd answer degrades to unknown
            return Unknown(_reason(e))

    def processes(self, h: Any) -> list[ProcessInfo] | Unknown:
        v = self.call("nvmlDeviceGetComputeRunningProcesses", h)
        if is_unknown(v):
            return v
        out = []
        try:
            for p in v:
                used = getattr(p, "usedGpuMemory", None)
                # NVML reports "not available" as None (pynvml) or as ULL max.
                used = int(used) if isinstance(used, int) and 0 <= used < (1 << 63) else None
                out.append(ProcessInfo(pid=int(p.pid), used_bytes=used))
        except Exception as e:  # noqa: BLE001 - a binding's odd answer degrades to unknown
            return Unknown(_reason(e))
        return out

    def ecc_uncorrected(self, h: Any, aggregate: bool) -> int | Unknown:
        err = self.const(("NVML_MEMORY_ERROR_TYPE_UNCORRECTED",), 1)
        counter = self.const(("NVML_AGGREGATE_ECC",), 1) if aggregate else self.const(("NVML_VOLATILE_ECC",), 0)
        v = self.call("nvmlDeviceGetTotalEccErrors", h, err, counter)
        return v if is_unknown(v) else int(v)

    def retired_pages(self, h: Any, double_bit: bool) -> int | Unknown:
        """How many pages were retired for double-bit (True) or repeated single-bit ECC errors."""
        cause = (self.const(("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",), 1) if double_bit
                 else self.const(("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",), 0))
        v = self.call("nvmlDeviceGetRetiredPages", h, cause)
        return v if is_unknown(v) else len(v)

    def retired_pages_pending(self, h: Any) -> bool | Unknown:
        v = self.call("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return v if is_unknown(v) else bool(v)

    def remapped_rows(self, h: Any) -> RemappedRows | Unknown:
        v = self.call("nvmlDeviceGetRemappedRows", h)
        if is_unknown(v):
            return v
        try:
            corr, unc, pending, failure = v
            return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))
        except Exception as e:  # noqa: BLE001 - a binding's odd answer degrades to unknown
            return Unknown(_reason(e))

    def clock_reasons(self, h: Any) -> int | Unknown:
        """The current clock event reasons bit mask (nvidia-ml-py 12+ name first, then the
        older "throttle reasons" name)."""
        v = self.call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if is_unknown(v) and "not in this" in v.reason:
            v = self.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return v if is_unknown(v) else int(v)

    def clock_reason_names(self, mask: int) -> list[str]:
        return [name for name, (consts, default) in CLOCK_REASONS.items() if mask & self.const(consts, default)]

    def pcie(self, h: Any) -> PcieLink:
        def num(name: str) -> int | Unknown:
            v = self.call(name, h)
            return v if is_unknown(v) else int(v)
        return PcieLink(gen=num("nvmlDeviceGetCurrPcieLinkGeneration"),
                        max_gen=num("nvmlDeviceGetMaxPcieLinkGeneration"),
                        width=num("nvmlDeviceGetCurrPcieLinkWidth"),
                        max_width=num("nvmlDeviceGetMaxPcieLinkWidth"))

    def utilization(self, h: Any) -> int | Unknown:
        """GPU utilisation in percent over the last sample period."""
        v = self.call("nvmlDeviceGetUtilizationRates", h)
        if is_unknown(v):
            return v
        try:
            return int(v.gpu)
        except Exception as e:  # noqa: BLE001 - a binding's odd answer degrades to unknown
            return Unknown(_reason(e))

    def nvlink_states(self, h: Any) -> list[bool] | Unknown:
        """Active (True) / inactive (False) for each NVLink the device has; [] when it has none.
        The first link that NVML refuses ends the list (devices have fewer than the maximum)."""
        max_links = self.const(("NVML_NVLINK_MAX_LINKS",), 18)
        states: list[bool] = []
        first: Unknown | None = None
        for link in range(max_links):
            v = self.call("nvmlDeviceGetNvLinkState", h, link)
            if is_unknown(v):
                if link == 0:
                    first = v
                break
            states.append(bool(v))
        if first is not None and ("Not Supported" in first.reason or "Invalid Argument" in first.reason):
            return []  # no NVLink on this device
        if first is not None:
            return first
        return states

    def persistence_mode(self, h: Any) -> bool | Unknown:
        v = self.call("nvmlDeviceGetPersistenceMode", h)
        if is_unknown(v):
            return v
        return int(v) == self.const(("NVML_FEATURE_ENABLED",), 1)


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


@contextlib.contextmanager
def session() -> Iterator[Session]:
    """An NVML session: nvmlInit on entry, nvmlShutdown on exit. Never raises; a failed init
    gives a Session with ok False and the reason."""
    try:
        module = provider()
    except Exception as e:  # noqa: BLE001 - nvidia-ml-py not installed
        yield Session(None, f"nvidia-ml-py not importable ({type(e).__name__}: {e})", "ImportError")
        return
    try:
        module.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_* of any kind: the session says which
        name = type(e).__name__
        kind = name[len("NVMLError_"):] if name.startswith("NVMLError_") else name
        yield Session(module, _reason(e), kind)
        return
    try:
        yield Session(module)
    finally:
        try:
            module.nvmlShutdown()
        except Exception:  # noqa: BLE001 - best effort: the facts are already read
            pass
