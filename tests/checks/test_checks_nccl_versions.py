"""DDP408: the NCCL torch loads against the known-bug table (sources in checks/nccl_versions.py)."""
from __future__ import annotations

import pytest
from helpers.context import make_ctx

from ddp_doctor import check_runner
from ddp_doctor import checks as catalogue
from ddp_doctor.checks import nccl_versions
from ddp_doctor.facts import gpus as gpu_facts


def run(ctx):
    return check_runner.run_entry(catalogue.get("DDP408"), (ctx,), ctx.rank)


@pytest.fixture
def nccl(monkeypatch):
    def use(version, machine="x86_64"):
        monkeypatch.setattr(gpu_facts, "torch_nccl_version", lambda: version)
        monkeypatch.setattr(nccl_versions.platform, "machine", lambda: machine)
    return use


def test_the_2_29_2_regression_is_named_with_its_fix_and_source(nccl):
    nccl((2, 29, 2))
    [f] = run(make_ctx(backend="nccl"))
    assert f.severity == "warning"
    assert f.message.startswith("NCCL 2.29.2: a regression that hangs collectives (fixed in 2.29.3;")
    assert "pytorch/pytorch#174338" in f.message and f.evidence["fixed_in"] == "2.29.3"


def test_arm_only_bug_fires_on_aarch64_only(nccl):
    nccl((2, 28, 9), machine="aarch64")
    [f] = run(make_ctx(backend="nccl"))
    assert "NCCL 2.28.9 on aarch64" in f.message
    nccl((2, 28, 9), machine="x86_64")
    assert run(make_ctx(backend="nccl")) == []


def test_launch_blocking_bug_needs_the_variable(nccl):
    nccl((2, 14, 3))
    assert run(make_ctx(backend="nccl")) == []
    [f] = run(make_ctx({"CUDA_LAUNCH_BLOCKING": "1"}, backend="nccl"))
    assert "with CUDA_LAUNCH_BLOCKING=1" in f.message and "NVIDIA/nccl#750" in f.message


@pytest.mark.parametrize(("version", "machine"), [((2, 29, 3), "aarch64"), ((2, 30, 7), "aarch64"),
                                                  ((2, 21, 5), "x86_64")])
def test_fixed_versions_are_silent(nccl, version, machine):
    nccl(version, machine=machine)
    assert run(make_ctx(backend="nccl")) == []


def test_no_nccl_or_a_gloo_job_is_silent(nccl):
    nccl(None)
    assert run(make_ctx(backend="nccl")) == []
    nccl((2, 29, 2))
    assert run(make_ctx(backend="gloo")) == []  # a gloo job does not load NCCL
