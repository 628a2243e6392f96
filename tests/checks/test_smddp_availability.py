"""--backend smddp where SMDDP cannot exist: one root cause (DDP106) that says
SMDDP is only in SageMaker's framework images, with the fix, and no process-group attempt that
adds a network hint (DDP321). Availability is the module that registers the backend, not the
top-level `smdistributed` package."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from helpers.context import make_ctx, sm_env, torchrun_env, write_sm_config
from helpers.procs import DDP, clean_env, load_json, run

from ddp_doctor.check_runner import run_stage
from ddp_doctor.checks import load_catalogue
from ddp_doctor.facts.host import SMDDP_MODULE, available_backends, smddp_available

load_catalogue()


def ddp106(ctx: Any) -> list:
    found = run_stage("local", (ctx,), rank=ctx.rank, select=["DDP106"])
    assert not [f for f in found if f.id in ("DDP001", "DDP002")], found
    return [f for f in found if f.id == "DDP106"]


def test_off_sagemaker_one_finding_names_the_images_and_the_local_backend():
    (f,) = ddp106(make_ctx(torchrun_env(world_size=2), backend="smddp"))  # CPU host, no smdistributed
    assert SMDDP_MODULE in f.message and "not a SageMaker training container" in f.message
    assert "only in SageMaker's PyTorch GPU framework images" in f.message
    assert "no GPU is visible" not in f.message  # not the GPU: the library is the cause
    assert "Run the job on SageMaker" in f.hint and "--backend gloo" in f.hint
    (g,) = ddp106(make_ctx(torchrun_env(world_size=2), gpus=8, backend="smddp"))
    assert "--backend nccl" in g.hint


def test_on_sagemaker_the_image_lacks_it(tmp_path):
    root = write_sm_config(tmp_path)
    (f,) = ddp106(make_ctx({**sm_env(), **torchrun_env(world_size=8)}, gpus=8, sm_root=root, backend="smddp"))
    assert "this SageMaker container's image does not ship it" in f.message
    assert "smdistributed" in f.hint and "torch_distributed" in f.hint


def test_smddp_available_passes():
    assert ddp106(make_ctx(torchrun_env(world_size=8), gpus=8, backends=("gloo", "nccl", "smddp"),
                           backend="smddp")) == []


@pytest.mark.slow
def test_a_top_level_smdistributed_package_is_not_enough(tmp_path):
    # e.g. the model-parallel library, or a stub: `smdistributed` imports, torch_smddp does not
    (tmp_path / "smdistributed").mkdir()
    (tmp_path / "smdistributed" / "__init__.py").write_text("")
    code = ("import importlib.util, sys; from ddp_doctor.facts.host import smddp_available, available_backends; "
            "print(importlib.util.find_spec('smdistributed') is not None, smddp_available(), "
            "'smddp' in available_backends())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=clean_env(PYTHONPATH=f"{tmp_path}:{sys.path[0]}"))
    assert out.stdout.split() == ["True", "False", "False"], out.stderr
    # with the real module path present, it is available
    pkg = tmp_path / "smdistributed" / "dataparallel" / "torch"
    pkg.mkdir(parents=True)
    for d in (pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "torch_smddp.py").write_text("")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=clean_env(PYTHONPATH=f"{tmp_path}:{sys.path[0]}"))
    assert out.stdout.split() == ["True", "True", "True"], out.stderr


def test_here_smddp_is_not_available():
    assert not smddp_available() and "smddp" not in available_backends()


@pytest.mark.slow
def test_preflight_backend_smddp_end_to_end(tmp_path):
    """A real self-launched 2-rank preflight: DDP106 once for both ranks, no DDP321, exit 3."""
    report = tmp_path / "r.json"
    res = run([*DDP, "preflight", "--backend", "smddp", "--timeout", "20", "--report", str(report)],
              clean_env(), str(tmp_path), timeout=120)
    rep = load_json(str(report))
    ids = [f["id"] for f in rep["findings"] if f["severity"] == "error"]
    assert ids == ["DDP106"], rep["findings"]
    assert rep["root_cause"]["id"] == "DDP106" and rep["root_cause"]["ranks"] == [0, 1]
    assert "DDP321" not in res.output and res.rc == 3, res.output[-3000:]
