"""A host against its own history (DDP409): a preflight's bus bandwidth per collective and message
size, and a run's median training step time, compared with the median of the same host's last
comparable runs in the history (ddp_doctor/history/store.py). Nothing until MIN_RUNS comparable
runs exist; comparable means the same series (kind, layout, backend, torch, NCCL, CUDA:
store.series_of) and the same figure: the same message size, or the same script and arguments
(the step time's figure names them by a digest: history/from_report.py).

`history_findings` is pure (the run's records and the past in, findings out); `against_history`
reads the past from the history the run will be recorded in.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding
from ddp_doctor.history.from_report import records_of
from ddp_doctor.history.opened import open_history
from ddp_doctor.history.store import RunRecord, default_path, series_of
from ddp_doctor.registry import declare

BELOW_HISTORY = declare(
    "DDP409", category="communication", severity="warning", title="Slower than this host's own history",
    doc="""
    What: This run is 25% or more slower on a host than the median of the same host's last
    comparable runs (at most LAST_RUNS, at least MIN_RUNS of them) in the history, or, while the
    host has fewer than MIN_RUNS of its own (an instance new to this job, as on SageMaker), of its
    instance type's last comparable runs on any host: a preflight's
    all_reduce bus bandwidth (the whole job's, within a node, between nodes) at a message size of
    1 MiB or more 25% below it, or a `run`'s median
    training step time long enough for 25% fewer steps per second (the same script and arguments).
    Comparable runs have the same kind, layout, backend and torch/NCCL/CUDA versions. The finding
    names the host, the figure, this run's value, the median, how many runs it is the median of,
    and whose runs they are (the host's, or its instance type's).
    Why: Fixed thresholds cannot tell a slow link from a slow instance type; a host's own past
    can. A drop against it points at that host now: a degraded NIC or link, an EFA device not used,
    a throttled GPU, a noisy neighbour, a changed setting or data path.
    Fix: Compare with the other hosts of the job (their own histories): one host below its past
    is that host; every host below is a change in the job or the cluster. Look at `ddp-doctor
    history --host HOST` and at the network checks of this report (DDP330-DDP335); for a step time,
    at DDP877/DDP878 (a rank or a node the others wait for) in the same report.
    """)

MIN_RUNS = 5
LAST_RUNS = 20
DROP = 0.25
BANDWIDTH = ("all_reduce.busbw_gbps@", "all_reduce_intra.busbw_gbps@", "all_reduce_inter.busbw_gbps@")  # higher: better
STEP_TIME = ("training.median_step_s@",)  # lower is better
MIN_BYTES = 1 << 20  # small messages measure latency, noisy: not compared


def _watched(name: str, figures: tuple[str, ...]) -> bool:
    if not name.startswith(figures):
        return False
    if name.startswith(BANDWIDTH):
        try:
            return int(name.rsplit("@", 1)[1]) >= MIN_BYTES
        except ValueError:
            return False
    return True


def _below(name: str, value: float, median: float) -> float:
    """How much slower than the median, as a share of the rate (0.25: a quarter fewer bytes or
    steps per second); <= 0 when not slower."""
    if median <= 0 or value <= 0:
        return 0.0
    return 1 - median / value if name.startswith(STEP_TIME) else 1 - value / median


def _median_of(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def history_findings(current: list[RunRecord], past: list[RunRecord],
                     figures: tuple[str, ...] = BANDWIDTH + STEP_TIME) -> list[Finding]:
    """DDP409 for each host of `current` slower than its own past at one of `figures`, or, for a
    figure its own past holds too few runs of (a new instance: every SageMaker job's), than the
    past of its instance type on any host (see the doc)."""
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for r in past:  # the host's records may also have been read as its instance type's
        key = (r.time, r.host, r.job, r.kind)
        if key not in seen:
            seen.add(key)
            unique.append(r)
    out = []
    for now in current:
        comparable = [r for r in unique if series_of(r) == series_of(now)]
        mine = [r for r in comparable if r.host == now.host]
        kin = [r for r in comparable if now.instance_type and r.instance_type == now.instance_type]
        drops: list[dict[str, Any]] = []
        for name, value in sorted(now.figures.items()):
            if not _watched(name, figures):
                continue
            against = "host"
            values = [float(r.figures[name]) for r in mine if name in r.figures][-LAST_RUNS:]
            if len(values) < MIN_RUNS:
                against = "instance_type"
                values = [float(r.figures[name]) for r in kin if name in r.figures][-LAST_RUNS:]
            if len(values) < MIN_RUNS:
                continue
            median = _median_of(values)
            below = _below(name, value, median)
            if below >= DROP:
                drops.append({"figure": name, "value": value, "median": median, "runs": len(values),
                              "below": round(below, 4), "against": against})
        if drops:
            worst = max(drops, key=lambda d: d["below"])
            out.append(event_finding(
                BELOW_HISTORY, _said(now, worst) + (f" ({len(drops) - 1} other figure(s) too)" if len(drops) > 1
                                                    else ""),
                rank=None, evidence={"host": now.host, "instance_type": now.instance_type, "drops": drops}))
    return out


def _said(now: RunRecord, d: dict[str, Any]) -> str:
    whose = ("this host's" if d["against"] == "host" else
             f"{now.instance_type}'s (this host has fewer than {MIN_RUNS} runs of its own)")
    if d["figure"].startswith(STEP_TIME):
        return (f"on {now.host} the training step took a median {d['value']:.3g} s, {d['below']:.0%} fewer steps per "
                f"second than {whose} median of {d['median']:.3g} s over the last {d['runs']} comparable runs "
                "of the same script and arguments")
    coll, size = d["figure"].split(".busbw_gbps@")
    return (f"on {now.host} {coll} at {int(size)} bytes ran at {d['value']:.3g} GB/s busbw, {d['below']:.0%} below "
            f"{whose} median of {d['median']:.3g} GB/s over the last {d['runs']} comparable runs")


PAST = 500  # the newest records read per host


def against_history(rep: dict[str, Any], env: Any, figures: tuple[str, ...] = BANDWIDTH + STEP_TIME
                    ) -> list[Finding]:
    """DDP409 for the report `rep` (as it will be recorded) against the history that $DDP_DOCTOR_HISTORY
    names in `env` (the default: the user's cache). Never raises: a history that cannot be read
    compares nothing, and the history is an aid, never a failed run."""
    path = default_path(dict(env))
    if path is None:
        return []
    try:
        current = records_of(rep)
        history = open_history(path)
        past = [r for now in current for r in history.records(host=now.host, limit=PAST)]
        for itype in sorted({now.instance_type for now in current if now.instance_type}):
            past += history.records(instance_type=itype, limit=PAST)
        return history_findings(current, past, figures)
    except Exception:  # noqa: BLE001 - see the doc
        return []
