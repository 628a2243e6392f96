"""GPU facts (ddp_doctor.facts.gpus): which GPUs a rank answers for, and the per-context snapshot cache."""
from __future__ import annotations

import pytest
from helpers.context import make_ctx, torchrun_env
from helpers.fake_nvml import p4d_host

from ddp_doctor.facts import gpus, nvml


def test_cvd_entries() -> None:
    assert gpus.cvd_entries(make_ctx({})) is None
    assert gpus.cvd_entries(make_ctx({"CUDA_VISIBLE_DEVICES": " 0, ,GPU-ab "})) == ["0", "GPU-ab"]


@pytest.mark.parametrize("env, visible, expected", [
    ({}, 3, [0, 1, 2]),                                                           # no local rank: every GPU
    (torchrun_env(rank=2, world_size=4, local_world_size=4), 4, [2]),             # cuda:LOCAL_RANK
    ({**torchrun_env(rank=2, world_size=4, local_world_size=4), "CUDA_VISIBLE_DEVICES": "2"}, 1, [0]),
    (torchrun_env(rank=5, world_size=8, local_world_size=8), 4, []),              # no GPU for this rank
])
def test_target_indices(env: dict[str, str], visible: int, expected: list[int]) -> None:
    assert gpus.target_indices(make_ctx(env, gpus=visible)) == expected


def test_norm_uuid() -> None:
    assert gpus.norm_uuid(" GPU-ABC ") == "abc" and gpus.norm_uuid("abc") == "abc"


def test_snapshot_is_read_once_per_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "torch_device_uuid", lambda i: None)
    monkeypatch.setattr(nvml, "provider", lambda: p4d_host())
    ctx = make_ctx(torchrun_env(rank=0, world_size=8, local_world_size=8), gpus=8)
    snap = gpus.snapshot(ctx)
    assert snap.ok and len(snap.gpus) == 1 and snap.gpus[0].cuda_index == 0 and len(snap.uuids) == 8
    assert gpus.snapshot(ctx) is snap
    assert gpus.snapshot(make_ctx(torchrun_env(rank=0, world_size=8, local_world_size=8), gpus=8)) is not snap
