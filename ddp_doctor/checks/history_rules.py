"""A host against its own history (DDP409): this run's bus bandwidth per collective and message
size, compared with the median of the same host's last comparable runs in the local history
(ddp_doctor/history/store.py). Nothing until MIN_RUNS comparable runs exist; comparable means the
same series (layout, backend, torch, NCCL, CUDA: store.series_of) and the same message size.

Pure: the run's records and the past records in, findings out.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding
from ddp_doctor.history.store import RunRecord, series_of
from ddp_doctor.registry import declare

BELOW_HISTORY = declare(
    "DDP409", category="communication", severity="warning", title="Bandwidth below this host's own history",
    doc="""
    What: A collective's bus bandwidth at a message size is 25% or more below the median of the
    same host's last comparable runs (at most LAST_RUNS, at least MIN_RUNS of them) in the local
    history: the same layout, backend and torch/NCCL/CUDA versions. The finding names the host,
    the collective and size, this run's figure, the median and how many runs it is the median of.
    Why: Fixed thresholds cannot tell a slow link from a slow instance type; a host's own past
    can. A drop against it points at that host now: a degraded NIC or link, an EFA device not used,
    a throttled GPU, a noisy neighbour, a changed setting.
    Fix: Compare with the other hosts of the job (their own histories): one host below its past
    is that host; every host below is a change in the job or the cluster. Look at `ddp-doctor
    history --host HOST` and at the network checks of this report (DDP330-DDP335).
    """)

MIN_RUNS = 5
LAST_RUNS = 20
DROP = 0.25
WATCHED = ("all_reduce.busbw_gbps@", "all_reduce_inter.busbw_gbps@")
MIN_BYTES = 1 << 20  # small messages measure latency, noisy: not compared


def _watched(name: str) -> bool:
    if not name.startswith(WATCHED):
        return False
    try:
        return int(name.rsplit("@", 1)[1]) >= MIN_BYTES
    except ValueError:
        return False


def history_findings(current: list[RunRecord], past: list[RunRecord]) -> list[Finding]:
    """DDP409 for each host of `current` whose figures fall below its own past (see the doc)."""
    out = []
    for now in current:
        mine = [r for r in past if r.host == now.host and series_of(r) == series_of(now)]
        drops: list[dict[str, Any]] = []
        for name, value in sorted(now.figures.items()):
            if not _watched(name):
                continue
            values = [float(r.figures[name]) for r in mine if name in r.figures][-LAST_RUNS:]
            if len(values) < MIN_RUNS:
                continue
            ordered = sorted(values)
            median = ordered[len(ordered) // 2]
            if median > 0 and value < (1 - DROP) * median:
                drops.append({"figure": name, "value": value, "median": median, "runs": len(values),
                              "below": round(1 - value / median, 4)})
        if drops:
            worst = max(drops, key=lambda d: d["below"])
            coll, size = worst["figure"].split(".busbw_gbps@")
            out.append(event_finding(
                BELOW_HISTORY, f"on {now.host} {coll} at {int(size)} bytes ran at {worst['value']:.3g} GB/s busbw, "
                f"{worst['below']:.0%} below this host's median of {worst['median']:.3g} GB/s over its last "
                f"{worst['runs']} comparable runs"
                + (f" ({len(drops) - 1} other size(s) too)" if len(drops) > 1 else ""),
                rank=None, evidence={"host": now.host, "drops": drops}))
    return out
