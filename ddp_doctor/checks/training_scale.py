"""Rules over the in-training probe records about the job spread over ranks (DDP872, DDP873): a rank
whose data loading sets every rank's pace, and the global batch size and learning rate the
Trainer's arguments add up to.

Pure functions: records in, findings out (`stragglers`, `batch_scaling`).
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.probe_records import finding_at
from ddp_doctor.findings import Finding
from ddp_doctor.registry import declare

DATA_STRAGGLER = declare(
    "DDP872", category="consistency", severity="warning", title="One rank waits much longer for data",
    severities=("warning", "info"),
    doc="""
    What: One rank's median time to get a training batch from its DataLoader is more than twice
    the others' and at least 20 ms longer, beyond doubt: over at least 8 batches (the first left
    out: it starts the workers), the excess above the others' own spread from batch to batch
    (1.4826 x MAD), and the rank slower than the others at so many of the same batches that chance
    would do so with a probability under 1% (a one-sided sign test, shared by the ranks).
    Why: DDP synchronises every step, so the slowest rank's data pipeline sets the pace of all.
    Fix: Look at that rank's data path: its storage, num_workers, a rank-dependent transform, or a
    shard much larger than the others.
    Severity: warning; info when the host was busy while the ranks trained (as DDP877 reads it)
    and other processes did not take the slow rank's own CPUs more than the others': a data
    pipeline on a busy host waits for the scheduler as much as for its data. Still a warning,
    saying the host was busy, when the rank stands far above that noise: longer at 90% of the
    batches, 4x the others' median or more, by 3x their spread or more.
    """, cause_class="host", action="investigate")

BATCH_SCALING = declare(
    "DDP873", category="consistency", severity="info", title="Effective batch size and learning rate",
    doc="""
    What: The global batch (per-device batch x gradient accumulation x world size) and the learning
    rate the Trainer uses.
    Why: Moving from one GPU to N multiplies the global batch by N; the learning rate usually needs
    scaling (linear or square-root rule) or the per-device batch dividing, or results change.
    Fix: Nothing to fix if intended; otherwise scale the learning rate or the per-device batch.
    """)


STRAGGLER_RATIO, STRAGGLER_MIN_S = 2.0, 0.020
MIN_BATCHES = 8  # batches a rank measured, the first left out, below which no rank is named
# on a busy host still a warning when it stands far above the load's noise: longer at FAR_SHARE of
# the batches, FAR_RATIO x the others' median, by FAR_NOISE x their spread (a scheduler's delays
# fall on any rank, a few milliseconds at a time)
FAR_SHARE, FAR_RATIO, FAR_NOISE = 0.9, 4.0, 3.0


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def _data_times(ranks: dict[int, dict[str, Any]]) -> dict[int, list[float]]:
    """Each rank's times per training batch from its DataLoaders, in order, the first of each
    loader left out (it includes starting the workers)."""
    return {r: [t for ld in rec.get("loaders") or [] if any(it.get("training") for it in ld.get("iterations", []))
                for t in (ld.get("data_times") or [])[1:]] for r, rec in ranks.items()}


def median_data_times(ranks: dict[int, dict[str, Any]]) -> dict[int, float]:
    """Median time per training batch from the DataLoader, rank by rank (first batch left out:
    it includes starting the workers); ranks with fewer than 3 batches measured are left out."""
    return {r: _median(times) for r, times in _data_times(ranks).items() if len(times) >= 3}


def stragglers(ranks: dict[int, dict[str, Any]], load: Any = None) -> list[Finding]:
    """DDP872 over the ranks' data times (see its doc); `load`: the hosts' load while they trained
    (checks/host_busy.Load), None when unknown."""
    from ddp_doctor.comm.stragglers import ALPHA, sign_test_p, spread
    series = {r: v for r, v in _data_times(ranks).items() if len(v) >= 3}
    med = {r: _median(v) for r, v in series.items()}
    if len(med) < 2:
        return []
    slow = max(med, key=lambda r: med[r])
    others = _median([v for r, v in med.items() if r != slow])
    if not (med[slow] > STRAGGLER_RATIO * others and med[slow] - others > STRAGGLER_MIN_S):
        return []
    n = min(len(v) for v in series.values())
    if n < MIN_BATCHES:
        return []
    rest = [r for r in series if r != slow]
    slower = sum(1 for i in range(n) if series[slow][i] > _median([series[r][i] for r in rest]))
    p = sign_test_p(slower, n)
    noise = _median([spread(series[r][:n]) for r in rest])
    if p > ALPHA / len(series) or med[slow] - others <= noise:
        return []
    severity, said = None, ""
    far = slower >= FAR_SHARE * n and med[slow] >= FAR_RATIO * others and med[slow] - others >= FAR_NOISE * noise
    if load is not None and load.busy and far:
        said = (f"; the host was busy while it trained ({load.describe()}), but this rank waited longer steadily, "
                f"far beyond what the load's noise does")
    elif load is not None and load.busy and not load.shared(slow):
        severity, said = "info", (f"; the host was busy while it trained ({load.describe()}): a data pipeline on a "
                                  f"busy host waits for the scheduler as much as for its data")
    return [finding_at(DATA_STRAGGLER, (
        f"rank {slow} waits {med[slow] * 1000:.1f} ms for each training batch from its DataLoader, "
        f"the other ranks {others * 1000:.1f} ms (median), longer at {slower} of {n} batches{said}"), rank=slow,
        severity=severity, evidence={"median_data_s": {str(r): round(v, 6) for r, v in med.items()},
                                     "slower_batches": slower, "batches": n, "p": round(p, 6),
                                     "noise_s": round(noise, 6)})]


def batch_scaling(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    for r in sorted(ranks):
        args = (ranks[r].get("extra") or {}).get("trainer_args")
        if not args:
            continue
        per, accum, world, lr = (args.get("per_device_train_batch_size"), args.get("gradient_accumulation_steps"),
                                 args.get("world_size"), args.get("learning_rate"))
        try:
            total = int(per) * int(accum) * int(world)
        except (TypeError, ValueError):
            return []
        return [finding_at(BATCH_SCALING, (
            f"global batch {total} = {per} per device x {accum} accumulation step(s) x {world} rank(s); "
            f"learning rate {lr}"), rank=None, evidence=dict(args))]
    return []
