"""Rules over the in-training probe records about the DDP replicas staying identical (DDP870,
DDP871): check sums of the model's parameters and buffers, taken after the first optimizer step and
at the end, compared rank by rank.

Pure functions: records in, findings out (`replica_divergence`).
"""
from __future__ import annotations

import re
from typing import Any

from ddp_doctor.checks.probe_records import finding_at
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

PARAMS_DIVERGED = declare(
    "DDP870", category="consistency", severity="error", title="Parameters differ between ranks",
    doc="""
    What: Check sums of the DDP model's parameters, taken after the first optimizer step and at the
    end, differ between ranks at the same step; the finding names the ranks and parameters.
    Why: DDP keeps replicas identical only if every update goes through it: calling model.module(x)
    (skipping the gradient all-reduce), changing parameters on one rank, or rank-dependent optimizer
    settings let the replicas drift, and the saved model is only rank 0's.
    Fix: Call the DDP-wrapped model for the forward pass, change parameters on every rank alike, and
    keep optimizer settings identical across ranks.
    """, cause_class="code")

BUFFERS_DIVERGED = declare(
    "DDP871", category="consistency", severity="warning", title="Buffers differ between ranks",
    doc="""
    What: Model buffers (other than BatchNorm running statistics, which DDP re-broadcasts every
    forward) differ between ranks at the same step.
    Why: Buffers are not averaged by DDP; a buffer changed by rank-local logic drifts silently.
    Fix: Keep broadcast_buffers=True (the default) or update such buffers identically on every rank.
    """, cause_class="code")


REL_TOL = 1e-6
ROLLING_STATS = re.compile(r"(^|\.)(running_mean|running_var|num_batches_tracked)$")


def _differs(a: float, b: float) -> bool:
    return abs(a - b) > REL_TOL * max(1.0, abs(a), abs(b))


def replica_divergence(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    """Compare check sums rank by rank against the lowest rank, at the first point where any
    differ (later points only repeat it)."""
    for point in ("first_step", "end"):
        sums = {r: rec["checksums"][point] for r, rec in ranks.items() if point in (rec.get("checksums") or {})}
        by_step: dict[int, list[int]] = {}
        for r, s in sums.items():
            by_step.setdefault(int(s.get("step", 0)), []).append(r)
        found: list[Finding] = []
        for step, rs in sorted(by_step.items()):
            if len(rs) < 2:
                continue
            found += _compare(point, step, {r: sums[r] for r in sorted(rs)})
        if found:
            return found
    return []


def _compare(point: str, step: int, sums: dict[int, dict[str, Any]]) -> list[Finding]:
    ref_rank = min(sums)
    ref = sums[ref_rank]
    ref_vals = {n: (k, s, a) for n, k, s, a in zip(ref["names"], ref["kinds"], ref["sum"], ref["abs"])}
    params: dict[int, list[str]] = {}
    buffers: dict[int, list[str]] = {}
    examples: dict[str, str] = {}
    for r, s in sums.items():
        if r == ref_rank:
            continue
        vals = {n: (k, sm, ab) for n, k, sm, ab in zip(s["names"], s["kinds"], s["sum"], s["abs"])}
        for name in sorted(set(ref_vals) | set(vals)):
            mine, theirs = vals.get(name), ref_vals.get(name)
            kind = (mine or theirs)[0]  # type: ignore[index]
            if kind == "buffer" and ROLLING_STATS.search(name):
                continue
            if mine is None or theirs is None or _differs(mine[1], theirs[1]) or _differs(mine[2], theirs[2]):
                (params if kind == "param" else buffers).setdefault(r, []).append(name)
                if name not in examples:
                    examples[name] = ("missing on one rank" if mine is None or theirs is None else
                                      f"sum {theirs[1]:.6g} on rank {ref_rank} vs {mine[1]:.6g} on rank {r}")
    when = "after the first optimizer step" if point == "first_step" else f"at the end (step {step})"
    out = []
    for entry, diff, kind in ((PARAMS_DIVERGED, params, "parameters"), (BUFFERS_DIVERGED, buffers, "buffers")):
        if not diff:
            continue
        total = sum(1 for k in ref["kinds"] if (k == "param") == (kind == "parameters"))
        names = sorted({n for ns in diff.values() for n in ns})
        shown = "; ".join(f"{n}: {examples[n]}" for n in names[:3])
        out.append(finding_at(entry, (
            f"{kind} of the DDP model differ {when}: rank(s) {format_ranks(diff)} vs rank {ref_rank} in "
            f"{max(len(v) for v in diff.values())} of {total} tensors ({shown}"
            f"{'; …' if len(names) > 3 else ''})"), rank=None, ranks=sorted(set(diff) | {ref_rank}),
            evidence={"point": point, "step": step, "reference_rank": ref_rank,
                      "differing": {str(r): v[:20] for r, v in diff.items()}}))
    return out
