"""GPU facts (ddp_doctor.facts.gpus): which GPUs a rank answers for, and the snapshot a context holds."""
from __future__ import annotations

import pytest
from helpers.context import make_ctx, torchrun_env
from helpers.fake_nvml import p4d_host

from ddp_doctor.context import RankContext
from ddp_doctor.facts import gpus, nvml
from ddp_doctor.facts.env_values import visible_devices


def cvd_entries(ctx: RankContext) -> list[str] | None:
    return visible_devices(ctx.env.get("CUDA_VISIBLE_DEVICES"))


def test_cvd_entries() -> None:
    assert cvd_entries(make_ctx({})) is None
    assert cvd_entries(make_ctx({"CUDA_VISIBLE_DEVICES": " 0, ,GPU-ab "})) == ["0", "GPU-ab"]


@pytest.mark.parametrize("env, visible, expected", [
    ({}, 3, [0, 1, 2]),                                                           # no local rank: every GPU
    (torchrun_env(rank=2, world_size=4, local_world_size=4), 4, [2]),             # cuda:LOCAL_RANK
    ({**torchrun_env(rank=2, world_size=4, local_world_size=4), "CUDA_VISIBLE_DEVICES": "2"}, 1, [0]),
    (torchrun_env(rank=5, world_size=8, local_world_size=8), 4, []),              # no GPU for this rank
])
def test_target_indices(env: dict[str, str], visible: int, expected: list[int]) -> None:
    ctx = make_ctx(env, gpus=visible)
    assert gpus.target_indices(visible, ctx.local_rank, ctx.local_world_size, cvd_entries(ctx)) == expected


def test_norm_uuid() -> None:
    assert gpus.norm_uuid(" GPU-ABC ") == "abc" and gpus.norm_uuid("abc") == "abc"


def test_snapshot_is_read_once_per_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "torch_device_uuid", lambda i: None)
    monkeypatch.setattr(nvml, "provider", lambda: p4d_host())
    ctx = make_ctx(torchrun_env(rank=0, world_size=8, local_world_size=8), gpus=8)
    snap = ctx.gpu_snapshot()
    assert snap.ok and len(snap.gpus) == 1 and snap.gpus[0].cuda_index == 0 and len(snap.uuids) == 8
    assert ctx.gpu_snapshot() is snap
    assert make_ctx(torchrun_env(rank=0, world_size=8, local_world_size=8), gpus=8).gpu_snapshot() is not snap
