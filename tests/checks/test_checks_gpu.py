"""GPU checks (DDP500-DDP599) against helpers.fake_nvml.FakeNVML: no GPU exists on these machines, so
every NVML answer here is made up (a healthy p4d-like host, then one fault at a time). Tests
marked `gpu` run only where a real NVIDIA GPU is present (scripts/gpu-smoke.sh)."""
from __future__ import annotations

import pynvml
import pytest
from helpers.context import make_ctx, sm_env, torchrun_env
from helpers.fake_nvml import FakeGPU, FakeNVML, p4d_host

from ddp_doctor import check_runner, registry
from ddp_doctor import checks as catalogue
from ddp_doctor.context import Group
from ddp_doctor.facts import gpus as gpu_facts
from ddp_doctor.facts import nvml

GPU_IDS = sorted(c.id for c in catalogue.load_catalogue().values() if c.category == "gpu")
LOCAL_IDS = [i for i in GPU_IDS if registry.REGISTRY[i].stage == "local"]


@pytest.fixture
def host(monkeypatch):
    """Install a fake NVML (default: healthy 8-GPU p4d) and torch seams; returns an installer."""
    state = {"cuda": "12.1", "current": None, "uuid": {}}
    monkeypatch.setattr(gpu_facts, "torch_cuda_version", lambda: state["cuda"])
    monkeypatch.setattr(gpu_facts, "torch_current_device", lambda: state["current"])
    monkeypatch.setattr(gpu_facts, "torch_device_uuid", lambda i: state["uuid"].get(i))

    def install(fake: FakeNVML | None = None, **torch_state):
        fake = fake if fake is not None else p4d_host()
        state.update(torch_state)
        monkeypatch.setattr(nvml, "provider", lambda: fake)
        return fake
    return install


def ctx_for(rank=0, world=8, lws=None, gpus=8, backend="nccl", env=None, **kw):
    e = torchrun_env(rank=rank, world_size=world, local_world_size=lws or world)
    e.update(env or {})
    return make_ctx(e, gpus=gpus, backend=backend, **kw)


def run(check_id, ctx, *args):
    return check_runner.run_entry(catalogue.get(check_id), (ctx, *args), ctx.rank)


def run_all(ctx):
    out = []
    for cid in LOCAL_IDS:
        out += run(cid, ctx)
    return out


def only(findings, check_id):
    return [f for f in findings if f.id == check_id]


# -- whole catalogue ---------------------------------------------------------------------------

def test_ids_and_docs():
    assert GPU_IDS[0] == "DDP500" and all("DDP500" <= i <= "DDP599" for i in GPU_IDS)
    for i in GPU_IDS:
        c = registry.REGISTRY[i]
        assert set(c.sections) - {"Severity"} == {"What", "Why", "Fix"}, i


def test_healthy_p4d_has_no_findings(host):
    host()
    sm_root = "/nonexistent"
    for r in range(8):
        ctx = ctx_for(r, env=sm_env(num_gpus=8), sm_root=sm_root)
        assert run_all(ctx) == [], r
        assert run("DDP504", ctx, Group(r, 8, "nccl", f"cuda:{r}", 10.0)) == []


def test_every_field_failing_never_crashes(host):
    boom = pynvml.NVMLError_Unknown()
    fields = ["uuid", "name", "memory_total", "memory_used", "processes", "ecc_volatile", "ecc_aggregate",
              "retired_dbe", "retired_sbe", "retired_pending", "remapped_rows", "clock_reasons", "pcie_gen",
              "pcie_max_gen", "pcie_width", "pcie_max_width", "utilization", "nvlinks", "persistence"]
    host(FakeNVML([FakeGPU(0, errors={f: boom for f in fields})]), cuda="12.1")
    findings = run_all(ctx_for(0, world=1, gpus=1))
    assert not only(findings, "DDP001"), findings
    unknown = only(findings, "DDP513")
    assert unknown and unknown[0].severity == "info" and "ECC (volatile) (Unknown Error)" in unknown[0].message


# -- DDP500 / DDP501: no GPU, NVML init failures ---------------------------------------------

def test_cpu_host_gloo_one_info(host):
    host(FakeNVML(init_error=pynvml.NVMLError_LibraryNotFound()))
    ctxs = [ctx_for(r, world=2, gpus=0, backend="gloo") for r in range(2)]
    findings = [f for c in ctxs for f in run_all(c)]
    assert [f.id for f in findings] == ["DDP500"]
    assert findings[0].severity == "info" and "not applicable" in findings[0].message
    assert "NVML Shared Library Not Found" in findings[0].message


def test_cpu_host_nccl_left_to_ddp106(host):
    host(FakeNVML(init_error=pynvml.NVMLError_LibraryNotFound()))
    assert run_all(ctx_for(0, world=2, gpus=0, backend="nccl")) == []


def test_gpus_counted_but_torch_sees_none(host):
    host(p4d_host(), cuda=None)
    f = run("DDP515", ctx_for(0, world=2, gpus=0, backend="gloo"))
    assert f[0].severity == "warning" and "NVML counts 8" in f[0].message and "None" in f[0].message
    assert run("DDP500", ctx_for(0, world=2, gpus=0, backend="gloo")) == []  # no longer DDP500's


def test_driver_not_loaded_with_nccl_is_error(host):
    host(FakeNVML(init_error=pynvml.NVMLError_DriverNotLoaded()))
    f = run("DDP501", ctx_for(0, world=2, gpus=0, backend="nccl"))
    assert f[0].severity == "error" and "Driver Not Loaded" in f[0].message


def test_version_mismatch_with_working_torch_is_warning(host):
    host(FakeNVML(init_error=pynvml.NVMLError_LibRmVersionMismatch()))
    findings = run_all(ctx_for(0))
    assert [x.id for x in findings] == ["DDP501"] and findings[0].severity == "warning"
    assert "version mismatch" in findings[0].message


# -- DDP502: counts ------------------------------------------------------------------------------

def test_gpu_missing_on_p4d(host):
    host(p4d_host(7))
    f = run("DDP502", ctx_for(0, lws=7, world=7, gpus=7, env=sm_env(num_gpus=7)))
    assert f[0].severity == "error" and "NVML counts 7" in f[0].message and "has 8" in f[0].message


def test_fewer_ranks_than_gpus_is_info(host):
    host()
    f = run("DDP514", ctx_for(0, world=2))
    assert len(f) == 1 and f[0].severity == "info" and "6 GPU(s) idle" in f[0].message
    assert run("DDP514", ctx_for(1, world=2)) == []  # node-wide: local rank 0 reports
    assert run("DDP502", ctx_for(0, world=2)) == []  # idle GPUs are no longer DDP502's


# -- DDP503: CUDA_VISIBLE_DEVICES ------------------------------------------------------------------

@pytest.mark.parametrize("cvd,needle", [("0,1,9", "GPU 9 does not exist (NVML counts 8)"),
                                        ("0,0", "same GPU more than once"),
                                        ("0,gpu1", "'gpu1' is not a GPU index"),
                                        ("GPU-deadbeef", "no GPU on this host has UUID GPU-deadbeef")])
def test_cuda_visible_devices_faults(host, cvd, needle):
    host()
    f = run("DDP503", ctx_for(0, world=2, gpus=2, env={"CUDA_VISIBLE_DEVICES": cvd}))
    assert f and f[0].severity == "error" and needle in f[0].message, f


def test_cuda_visible_devices_uuid_duplicates_index(host):
    fake = host()
    f = run("DDP503", ctx_for(0, world=2, gpus=2, env={"CUDA_VISIBLE_DEVICES": f"1,{fake.gpus[1].uuid}"}))
    assert f and "more than once" in f[0].message


@pytest.mark.parametrize("cvd", ["0,1", "3,2", "GPU-fa4e0000-0000-4000-8000-000000000005,0", "-1"])
def test_cuda_visible_devices_valid(host, cvd):
    host()
    assert run("DDP503", ctx_for(0, world=2, gpus=2, env={"CUDA_VISIBLE_DEVICES": cvd})) == []


def test_cvd_maps_rank_to_physical_gpu(host):
    fake = host()
    fake.gpus[5].ecc_volatile = 1
    f = run("DDP506", ctx_for(1, world=2, gpus=2, env={"CUDA_VISIBLE_DEVICES": "3,5"}))
    assert f and "cuda:1, NVML index 5" in f[0].message


def test_torch_uuid_decides_the_mapping(host):
    fake = host()
    fake.gpus[6].ecc_volatile = 3
    # CUDA's order differs from NVML's: cuda:0 is NVML device 6 (torch reports the UUID bare)
    host(fake, uuid={0: fake.gpus[6].uuid[4:]})
    f = run("DDP506", ctx_for(0))
    assert f and "NVML index 6" in f[0].message and "3 uncorrectable" in f[0].message


def test_mig_device_is_unknown(host):
    host()
    f = run("DDP513", ctx_for(0, world=1, gpus=1, env={"CUDA_VISIBLE_DEVICES": "MIG-abc"}))
    assert f and "MIG instance" in f[0].message


# -- DDP504: current device ------------------------------------------------------------------------

def test_current_device_wrong(host):
    host(current=0)
    f = run("DDP504", ctx_for(3), Group(3, 8, "nccl", "cuda:3", 10.0))
    assert f[0].severity == "error" and "current_device() is 0" in f[0].message and "cuda:3" in f[0].message


def test_current_device_right_or_cpu(host):
    host(current=3)
    assert run("DDP504", ctx_for(3), Group(3, 8, "nccl", "cuda:3", 10.0)) == []
    assert run("DDP504", ctx_for(3, backend="gloo", gpus=0), Group(3, 8, "gloo", "cpu", 10.0)) == []


# -- DDP505-DDP512: health faults ----------------------------------------------------------------------

def test_memory_in_use_by_other_process(host):
    fake = host()
    fake.gpus[2].memory_used = 20 * 1024 ** 3
    fake.gpus[2].processes = [(4242, 20 * 1024 ** 3 - 512 * 1024 ** 2)]
    f = run("DDP505", ctx_for(2))
    assert f[0].severity == "warning" and "20480 MiB of 40960 MiB" in f[0].message and "pid 4242" in f[0].message
    assert run("DDP505", ctx_for(2, options={"gpu_busy_mib": 30000})) == []


def test_ecc_volatile_error_and_aggregate_warning(host):
    fake = host()
    fake.gpus[0].ecc_volatile, fake.gpus[0].ecc_aggregate = 2, 5
    fake.gpus[1].ecc_aggregate = 4
    f0, f1 = run("DDP506", ctx_for(0)), run("DDP506", ctx_for(1))
    assert f0[0].severity == "error" and "2 uncorrectable ECC error(s) since the driver loaded" in f0[0].message
    assert f1[0].severity == "warning" and "4 uncorrectable" in f1[0].message


@pytest.mark.parametrize("gpu_kw,severity,needle", [
    ({"remapped_rows": (0, 1, 1, 0)}, "error", "row remapping pending"),
    ({"remapped_rows": (0, 9, 0, 1)}, "error", "row remapping failed"),
    ({"remapped_rows": (2, 3, 0, 0)}, "info", "3 row(s) remapped"),
    ({"retired_pending": 1, "retired_dbe": [7], "unsupported": {"remapped_rows"}}, "error", "page retirement pending"),
    ({"retired_dbe": [7, 8], "unsupported": {"remapped_rows"}}, "info", "2 page(s) retired"),
])
def test_memory_retirement(host, gpu_kw, severity, needle):
    host(FakeNVML([FakeGPU(0, **gpu_kw)]))
    f = run("DDP507", ctx_for(0, world=1, gpus=1))
    assert f and f[0].severity == severity and needle in f[0].message, f


@pytest.mark.parametrize("mask,severity,needle", [(0x40, "warning", "hw_thermal_slowdown"),
                                                  (0x8 | 0x80, "warning", "hw_slowdown, hw_power_brake_slowdown"),
                                                  (0x20, "warning", "sw_thermal_slowdown"),
                                                  (0x4, "info", "power cap")])
def test_clock_reasons(host, mask, severity, needle):
    host(FakeNVML([FakeGPU(0, clock_reasons=mask)]))
    f = run("DDP508", ctx_for(0, world=1, gpus=1))
    assert f and f[0].severity == severity and needle in f[0].message


def test_clock_reasons_legacy_name_and_idle(host):
    host(FakeNVML([FakeGPU(0, clock_reasons=0x40)], legacy_clock_names=True))
    assert "hw_thermal_slowdown" in run("DDP508", ctx_for(0, world=1, gpus=1))[0].message
    host(FakeNVML([FakeGPU(0, clock_reasons=0x1 | 0x10)]))
    assert run("DDP508", ctx_for(0, world=1, gpus=1)) == []


def test_pcie_width_and_generation(host):
    host(FakeNVML([FakeGPU(0, pcie_width=8), FakeGPU(1, pcie_gen=1), FakeGPU(2, pcie_gen=3, utilization=95)]))
    w = run("DDP509", ctx_for(0, world=3, gpus=3))
    assert w[0].severity == "warning" and "x8, the device supports x16" in w[0].message
    idle = run("DDP509", ctx_for(1, world=3, gpus=3))
    assert idle[0].severity == "info" and "gen 1" in idle[0].message and "lower their PCIe" in idle[0].hint
    busy = run("DDP509", ctx_for(2, world=3, gpus=3))
    assert busy[0].severity == "warning" and "load 95%" in busy[0].message


def test_nvlink_down(host):
    host(FakeNVML([FakeGPU(0, nvlinks=[1] * 10 + [0, 0]), FakeGPU(1, nvlinks=[0] * 12),
                   FakeGPU(2, nvlinks=[])]))
    some = run("DDP510", ctx_for(0, world=3, gpus=3))
    assert some[0].severity == "warning" and "link(s) 10, 11 down, 10 of 12 active" in some[0].message
    all_down_p4d = run("DDP510", ctx_for(1, world=3, gpus=3, env=sm_env(num_gpus=3)))
    assert all_down_p4d[0].severity == "error" and "p4d.24xlarge" in all_down_p4d[0].message
    assert run("DDP510", ctx_for(1, world=3, gpus=3))[0].severity == "info"
    assert run("DDP510", ctx_for(2, world=3, gpus=3)) == []  # no NVLink at all


@pytest.mark.parametrize("torch_cuda,driver,severity", [("12.4", 11080, "error"), ("12.4", 12020, "warning"),
                                                        ("12.1", 12020, None), ("11.8", 12020, None),
                                                        (None, 11000, None)])
def test_driver_vs_torch_cuda(host, torch_cuda, driver, severity):
    host(p4d_host(cuda_driver_version=driver), cuda=torch_cuda)
    f = run("DDP511", ctx_for(0))
    assert [x.severity for x in f] == ([severity] if severity else [])
    if severity:
        assert f"torch was built for CUDA {torch_cuda}" in f[0].message


def test_persistence_off_is_info(host):
    host(FakeNVML([FakeGPU(0, persistence=0)]))
    f = run("DDP512", ctx_for(0, world=1, gpus=1))
    assert f[0].severity == "info" and "persistence mode is off" in f[0].message


def test_not_supported_fields_are_unknown_not_findings(host):
    # A consumer card: no ECC, no NVLink, no retirement data, no permission for processes.
    gpu0 = FakeGPU(0, name="NVIDIA GeForce RTX 4090",
                   unsupported={"ecc_volatile", "ecc_aggregate", "retired_dbe", "retired_sbe", "retired_pending",
                                "remapped_rows", "nvlinks", "persistence"},
                   errors={"processes": pynvml.NVMLError_NoPermission()})
    host(FakeNVML([gpu0]))
    findings = run_all(ctx_for(0, world=1, gpus=1))
    assert [f.id for f in findings] == ["DDP513"], findings
    msg = findings[0].message
    assert "ECC (volatile) (Not Supported)" in msg and "memory retirement / row remapping" in msg
    assert "NVLink" not in msg  # no NVLink is an answer, not an unknown


def test_no_local_rank_checks_every_visible_gpu(host):
    fake = host()
    fake.gpus[7].ecc_volatile = 1
    ctx = make_ctx({}, gpus=8, backend="nccl")
    f = run("DDP506", ctx)
    assert len(f) == 1 and "cuda:7" in f[0].message


# -- on a real GPU only (scripts/gpu-smoke.sh) -----------------------------------------------------

def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a torch that cannot say: no GPU test here
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs an NVIDIA GPU (run scripts/gpu-smoke.sh on a GPU host)")
def test_real_gpu_nvml_and_torch_agree():
    import torch

    from ddp_doctor.facts.host import read_host_facts
    with nvml.session() as s:
        assert s.ok, s.error
        assert s.device_count() >= torch.cuda.device_count()
    ctx = make_ctx(torchrun_env(rank=0, world_size=1), gpus=torch.cuda.device_count(), backend="nccl")
    snap = ctx.gpu_snapshot()
    assert snap.gpus and not snap.unresolved, snap.unresolved  # cuda:0 found in NVML by UUID
    torch.cuda.set_device(0)
    assert gpu_facts.torch_current_device() == 0
    assert run("DDP504", ctx, Group(0, 1, "nccl", "cuda:0", 10.0)) == []
    findings = run_all(ctx)
    assert not only(findings, "DDP001") and not only(findings, "DDP002"), findings
    assert read_host_facts().physical_gpus is not None
