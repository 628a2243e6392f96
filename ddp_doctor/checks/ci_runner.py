"""Checks of what a CI runner was declared to have (`--expect-gpus`, the pytest plugin's
`--ddp-expect-gpus`). IDs DDP590-DDP599; the rest of the gpu category lives in checks/gpu.py.

Options read (RankContext.options): `expect_gpus` (int, absent: no expectation, nothing checked).
"""
from __future__ import annotations

from typing import Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check


@check("DDP590", category="gpu", severity="error", title="Fewer GPUs than the runner should have")
def fewer_gpus_than_expected(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Compares the GPUs this rank can use (torch.cuda.device_count(), after CUDA_VISIBLE_DEVICES)
    with the count the runner is declared to have (`ddp-doctor preflight --expect-gpus N`, or the
    pytest plugin's `--ddp-expect-gpus N` / ini `ddp_expect_gpus`).
    Why: A CI GPU runner that lost a GPU (a card fell off the bus, the driver or the container
    runtime failed to expose it, CUDA_VISIBLE_DEVICES narrowed) otherwise shows up as hundreds of
    skipped or cryptically failing multi-GPU tests instead of one clear failure.
    Fix: Run `nvidia-smi` on the runner; check that the container was started with `--gpus all`
    (NVIDIA container toolkit) and that CUDA_VISIBLE_DEVICES is not set by the job; take the runner
    out of rotation until every expected GPU is back.
    """
    expected = ctx.options.get("expect_gpus")
    if expected is None:
        return
    visible = ctx.host.visible_gpus
    if visible >= int(expected):
        return
    cvd = ctx.env.get("CUDA_VISIBLE_DEVICES")
    nvml = ctx.host.physical_gpus
    yield Problem(
        message=f"{visible} GPU(s) usable (torch.cuda.device_count()), {expected} expected (as declared: "
                f"preflight --expect-gpus, or the pytest plugin's --ddp-expect-gpus / ddp_expect_gpus); "
                f"NVML counts {'no driver' if nvml is None else nvml}; CUDA_VISIBLE_DEVICES="
                f"{'(unset)' if cvd is None else repr(cvd)}",
        evidence={"expected": int(expected), "visible_gpus": visible, "nvml_gpus": nvml,
                  "cuda_visible_devices": cvd})
