"""ddp_doctor.facts.nvml: a total wrapper. Every query returns a value or Unknown, never raises.
Run against helpers.fake_nvml.FakeNVML (no GPU exists here) and against the real pynvml, which on a
machine without a driver must fail init cleanly."""
from __future__ import annotations

import pynvml
import pytest
from helpers.fake_nvml import FakeGPU, FakeNVML, p4d_host

from ddp_doctor.facts import nvml
from ddp_doctor.facts.nvml import Unknown, is_unknown


@pytest.fixture
def use(monkeypatch):
    def install(fake):
        monkeypatch.setattr(nvml, "provider", lambda: fake)
        return fake
    return install


def test_healthy_host_reads_every_field(use):
    fake = use(p4d_host())
    with nvml.session() as s:
        assert s.ok and s.device_count() == 8
        h = s.handle(2)
        assert s.uuid(h) == fake.gpus[2].uuid and s.name(h) == "NVIDIA A100-SXM4-40GB"
        mem = s.memory(h)
        assert mem.total == 40 * 1024 ** 3 and mem.used + mem.free == mem.total
        assert s.processes(h) == []
        assert s.ecc_uncorrected(h, aggregate=False) == 0 and s.ecc_uncorrected(h, aggregate=True) == 0
        assert s.remapped_rows(h) == nvml.RemappedRows(0, 0, False, False)
        assert s.clock_reasons(h) == 0x1 and s.clock_reason_names(0x1) == ["gpu_idle"]
        assert s.pcie(h) == nvml.PcieLink(4, 4, 16, 16)
        assert s.nvlink_states(h) == [True] * 12
        assert s.persistence_mode(h) is True
        assert s.utilization(h) == 0
        assert s.cuda_driver_version() == 12020 and s.driver_version() == "535.183.01"
    assert fake.initialised == 0 and fake.shutdowns == 1


def test_not_supported_and_no_permission_become_unknown(use):
    gpu = FakeGPU(0, unsupported={"ecc_volatile", "clock_reasons", "pcie_width", "nvlinks"},
                  errors={"processes": pynvml.NVMLError_NoPermission(),
                          "memory_used": pynvml.NVMLError_Unknown()})
    use(FakeNVML([gpu]))
    with nvml.session() as s:
        h = s.handle(0)
        v = s.ecc_uncorrected(h, aggregate=False)
        assert is_unknown(v) and v.reason == "Not Supported" and not v
        assert s.ecc_uncorrected(h, aggregate=True) == 0
        assert is_unknown(s.clock_reasons(h))
        assert is_unknown(s.pcie(h).width) and s.pcie(h).gen == 4
        assert s.nvlink_states(h) == []  # "not supported" on link 0: the device has no NVLink
        assert s.processes(h).reason == "Insufficient Permissions"
        assert is_unknown(s.memory(h))
        assert str(Unknown("x")) == "unknown (x)"


def test_retired_pages_and_pending(use):
    use(FakeNVML([FakeGPU(0, name="Tesla V100-SXM2-16GB", retired_dbe=[1, 2], retired_sbe=[3],
                          retired_pending=1, unsupported={"remapped_rows"})]))
    with nvml.session() as s:
        h = s.handle(0)
        assert s.retired_pages(h, double_bit=True) == 2 and s.retired_pages(h, double_bit=False) == 1
        assert s.retired_pages_pending(h) is True
        assert is_unknown(s.remapped_rows(h))


def test_legacy_throttle_reason_name(use):
    fake = use(FakeNVML([FakeGPU(0, clock_reasons=0x40)], legacy_clock_names=True))
    assert not hasattr(fake, "nvmlDeviceGetCurrentClocksEventReasons")
    with nvml.session() as s:
        mask = s.clock_reasons(s.handle(0))
        assert mask == 0x40 and s.clock_reason_names(mask) == ["hw_thermal_slowdown"]


def test_missing_function_is_unknown(use):
    fake = use(FakeNVML([FakeGPU(0)]))
    with nvml.session() as s:
        v = s.call("nvmlDeviceGetSomethingNew", s.handle(0))
        assert is_unknown(v) and "not in this nvidia-ml-py" in v.reason
    assert fake.shutdowns == 1


def test_bad_index_and_lost_gpu(use):
    use(FakeNVML([FakeGPU(0, errors={"handle": pynvml.NVMLError_GpuIsLost()})]))
    with nvml.session() as s:
        assert s.handle(0).reason == "GPU is lost"
        assert is_unknown(s.handle(5))
        # a query on an unknown handle is itself unknown, not a crash
        assert is_unknown(s.memory(s.handle(5)))


@pytest.mark.parametrize("error,kind", [(pynvml.NVMLError_DriverNotLoaded(), "DriverNotLoaded"),
                                        (pynvml.NVMLError_LibRmVersionMismatch(), "LibRmVersionMismatch"),
                                        (pynvml.NVMLError_LibraryNotFound(), "LibraryNotFound"),
                                        (OSError("boom"), "OSError")])
def test_init_failure_is_reported_not_raised(use, error, kind):
    use(FakeNVML([FakeGPU(0)], init_error=error))
    with nvml.session() as s:
        assert not s.ok and s.error_kind == kind and s.error
        assert is_unknown(s.device_count()) and is_unknown(s.handle(0))


def test_provider_import_failure(monkeypatch):
    def missing():
        raise ModuleNotFoundError("No module named 'pynvml'")
    monkeypatch.setattr(nvml, "provider", missing)
    with nvml.session() as s:
        assert not s.ok and s.error_kind == "ImportError" and "pynvml" in s.error


def test_real_pynvml_without_a_driver_degrades():
    """The real nvidia-ml-py on this machine: with no NVIDIA driver, init fails as LibraryNotFound
    (or, where a GPU exists, works)."""
    with nvml.session() as s:
        if s.ok:
            assert isinstance(s.device_count(), int)
        else:
            assert s.error_kind in ("LibraryNotFound", "DriverNotLoaded") and s.error


def test_cuda_version_tuple():
    assert nvml.cuda_version_tuple(12040) == (12, 4) and nvml.cuda_version_tuple(11080) == (11, 8)
