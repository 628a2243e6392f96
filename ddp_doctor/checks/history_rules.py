"""A host against its own history (DDP409): a preflight's bus bandwidth per collective and message
size, and a run's median training step time, compared with the same host's own quiet, comparable
past runs in the history (ddp_doctor/history/database.py), by a robust test of the median and the
run-to-run spread.

Like with like: the same host (or, for a host new to the job, its instance type), the same series
(kind, layout, backend, torch, NCCL, CUDA: database.series_of) and the same figure: the same message
size, or the same script and arguments (the step time's figure names them by a digest:
history/from_report.py). Another job's figures (another script's step time, another world size's
bandwidth) never enter. Only quiet runs count (`quiet`): a run the report says was timed on a busy
machine is left out, and one whose load is not known counts only when it is older than the first
run of the same comparison whose load is known (see `quiet`). Nothing is judged before MIN_RUNS
such runs exist; figures that cannot be real were never kept (database.possible_figure).

`history_findings` is pure (the run's records and the past in, findings out); `baseline` is the
comparison itself (what `ddp-doctor history` shows too); `against_history` reads the past from the
history the run will be recorded in.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.comm.stragglers import median
from ddp_doctor.findings import Finding
from ddp_doctor.history.database import RunRecord, default_path, series_of
from ddp_doctor.history.from_report import BUSY, HOST_FAULT, records_of
from ddp_doctor.history.opened import open_history
from ddp_doctor.registry import declare

BELOW_HISTORY = declare(
    "DDP409", category="communication", severity="warning", title="Slower than this host's own history",
    severities=("warning", "info"),
    doc="""
    What: On a host, this run is slower than that host's own past, beyond that past's run-to-run
    spread: a preflight's all_reduce bus bandwidth (the whole job's, within a node, between nodes)
    at a message size of 1 MiB or more, or a `run`'s median training step time (the same script
    and arguments). The past is the host's newest comparable quiet runs (at most 20, at least 5:
    fewer, and nothing is judged): comparable, the same kind, world size, nodes, processes per
    node, backend, torch/NCCL/CUDA versions, and the same message size or the same script and
    arguments (another job's figures never enter); quiet, a run whose report said no host of its
    job was busy while it was timed (`measurements.host_load`), or one whose load is not known
    (written by an older ddp-doctor) that is older than the first of those runs whose load is
    known. While the host has fewer than 5 such runs of its own (an instance new to the job, as on
    SageMaker), its instance type's runs on any host, under the same rules. The test is a
    one-sided robust z-score on the median and the MAD (the modified z-score of Iglewicz and
    Hoaglin): the run is named when it is worse than the median of those runs by more than
    3.5 x 1.4826 x their median absolute deviation, and by more than 10% of the median (the floor:
    a past that repeats to the digit does not make a 2% drop a finding). The finding names the
    host, the figure, this run's value, the median, the MAD and the band it fell outside, how many
    runs and whose (the host's, or its instance type's), and lists those runs in its evidence
    (when, job, script, value). A bandwidth is named only when at least half of the message sizes
    compared fell below their bands (consistent across the run: a slow link is slow at every large
    size; a burst of other work on the host slows one or two).
    Why: Fixed thresholds cannot tell a slow link from a slow instance type; a host's own past
    can. A drop against it points at that host now: a degraded NIC or link, an EFA device not used,
    a throttled GPU, a noisy neighbour, a changed setting or data path.
    Fix: Compare with the other hosts of the job (their own histories): one host below its past
    is that host; every host below is a change in the job or the cluster. `ddp-doctor history
    --host HOST --figure FIGURE` lists the runs compared and the band; look at the network checks
    of this report (DDP330-DDP335); for a step time, at DDP877/DDP878 (a rank or a node the others
    wait for) in the same report.
    Severity: warning; info when a host of this run's job was busy while it was timed (other
    processes used a quarter of its cores, the hypervisor stole 10% of its time, or its load
    average was above its cores): a drop on a busy machine may be the other work's, not the
    host's, and the finding says which host was busy and why.
    """, cause_class="host", action="investigate")

MIN_RUNS = 5  # comparable quiet runs before any judgement
LAST_RUNS = 20  # the newest comparable quiet runs compared with (and listed in the finding)
NOISE_TIMES = 3.5  # the modified z-score's bound (Iglewicz and Hoaglin): 3.5 x 1.4826 x MAD
MAD_SIGMA = 1.4826  # MAD -> the standard deviation of a normal spread
FLOOR = 0.10  # never closer to the median than this share of it: 10% less bandwidth, a step 10% longer
BANDWIDTH = ("all_reduce.busbw_gbps@", "all_reduce_intra.busbw_gbps@", "all_reduce_inter.busbw_gbps@")  # higher: better
STEP_TIME = ("training.median_step_s@",)  # lower is better
MIN_BYTES = 1 << 20  # small messages measure latency, noisy: not compared


def tracked(name: str, figures: tuple[str, ...] = BANDWIDTH + STEP_TIME) -> bool:
    """Whether DDP409 judges the figure `name` (of those in `figures`)."""
    if not name.startswith(figures):
        return False
    if name.startswith(BANDWIDTH):
        try:
            return int(name.rsplit("@", 1)[1]) >= MIN_BYTES
        except ValueError:
            return False
    return True


def load_of(rec: RunRecord) -> str:
    """"busy", "quiet", or "unknown" (a record written before ddp-doctor kept the load, or a run
    whose load was not measured)."""
    if BUSY not in rec.figures:
        return "unknown"
    return "busy" if rec.figures[BUSY] > 0 else "quiet"


def quiet(records: list[RunRecord]) -> list[RunRecord]:
    """The records that count as quiet runs, of those of one comparison: known quiet, or of unknown
    load and older than the first record among them whose load is known. Records an older
    ddp-doctor wrote (before the load was kept) are a host's only past at first: they keep working,
    the median and MAD outweigh the odd busy run among them, and newer quiet runs join them. A
    record of unknown load written since the load is kept is a run that did not measure it: left
    out, as a busy one is."""
    known = [r.time for r in records if load_of(r) != "unknown"]
    since = min(known) if known else math.inf
    return [r for r in records if load_of(r) == "quiet" or (load_of(r) == "unknown" and r.time < since)]


@dataclass
class Baseline:
    """What one figure of a run is compared with: the runs (oldest first), their median and MAD."""

    figure: str
    against: str  # "host" or "instance_type"
    runs: list[RunRecord]
    median: float
    mad: float

    @property
    def higher_is_better(self) -> bool:
        return not self.figure.startswith(STEP_TIME)

    @property
    def margin(self) -> float:
        """How far from the median a run may be: max(NOISE_TIMES x 1.4826 x MAD, FLOOR x median)."""
        return max(NOISE_TIMES * MAD_SIGMA * self.mad, FLOOR * self.median)

    @property
    def band(self) -> tuple[float, float]:
        return self.median - self.margin, self.median + self.margin

    def worse(self, value: float) -> bool:
        """Worse than the median by more than the margin (one-sided: better is never a finding)."""
        low, high = self.band
        return value < low if self.higher_is_better else value > high

    def robust_z(self, value: float) -> float | None:
        """How many spreads (1.4826 x MAD) worse than the median; None when the runs do not spread."""
        if self.mad <= 0:
            return None
        worse_by = self.median - value if self.higher_is_better else value - self.median
        return worse_by / (MAD_SIGMA * self.mad)

    def below(self, value: float) -> float:
        """How much slower than the median, as a share of the rate (0.25: a quarter fewer bytes or
        steps per second); <= 0 when not slower."""
        if self.median <= 0 or value <= 0:
            return 0.0
        return 1 - value / self.median if self.higher_is_better else 1 - self.median / value

    def listed(self) -> list[dict[str, Any]]:
        """The runs compared, for a finding's evidence: newest first."""
        return [{"time": round(r.time, 3), "job": r.job, "host": r.host, "kind": r.kind, "script": r.script,
                 "value": r.figures[self.figure]} for r in reversed(self.runs)]


def unique(past: list[RunRecord]) -> list[RunRecord]:
    """Each record once (the host's records may also have been read as its instance type's), by time."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for r in past:
        key = (r.time, r.host, r.job, r.kind)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return sorted(out, key=lambda r: r.time)


def baseline(now: RunRecord, past: list[RunRecord], figure: str) -> Baseline | None:
    """The runs `now`'s `figure` is compared with: the host's newest LAST_RUNS comparable quiet runs
    holding it, or, with fewer than MIN_RUNS of those, its instance type's; None while fewer than
    MIN_RUNS exist either way."""
    return _Past(past).baseline(now, figure)


class _Past:
    """The past records once each, by time, found by host and by instance type. An instance type's
    baseline of a series and figure is made once, however many new hosts of the job ask for it."""

    def __init__(self, past: list[RunRecord]) -> None:
        self.by_host: dict[str, list[RunRecord]] = {}
        self.by_type: dict[str, list[RunRecord]] = {}
        self._kin: dict[tuple[Any, ...], Baseline | None] = {}
        self._mine: dict[tuple[Any, ...], list[RunRecord]] = {}
        for r in unique(past):
            self.by_host.setdefault(r.host, []).append(r)
            if r.instance_type:
                self.by_type.setdefault(r.instance_type, []).append(r)

    def baseline(self, now: RunRecord, figure: str) -> Baseline | None:
        key = series_of(now)
        mine = (now.host, *key)
        if mine not in self._mine:
            self._mine[mine] = [r for r in self.by_host.get(now.host, []) if series_of(r) == key]
        base = _baseline(figure, "host", self._mine[mine])
        if base is not None or not now.instance_type:
            return base
        kin = (now.instance_type, figure, *key)
        if kin not in self._kin:
            self._kin[kin] = _baseline(figure, "instance_type", [
                r for r in self.by_type.get(now.instance_type, []) if figure in r.figures and series_of(r) == key])
        return self._kin[kin]


def _baseline(figure: str, against: str, records: list[RunRecord]) -> Baseline | None:
    runs = quiet([r for r in records if figure in r.figures])[-LAST_RUNS:]
    if len(runs) < MIN_RUNS:
        return None
    values = [float(r.figures[figure]) for r in runs]
    mid = median(values)
    return Baseline(figure, against, runs, mid, median([abs(v - mid) for v in values]))


def history_findings(current: list[RunRecord], past: list[RunRecord],
                     figures: tuple[str, ...] = BANDWIDTH + STEP_TIME,
                     load: dict[str, Any] | None = None) -> list[Finding]:
    """DDP409 for each host of `current` slower than its own past at one of `figures`, or, for a
    figure its own past holds too few runs of (a new instance: every SageMaker job's), than the
    past of its instance type on any host (see the doc). `load`: the report's
    measurements.host_load, quoted when the run was busy."""
    out = []
    indexed = _Past(past)
    for now in current:
        drops: list[dict[str, Any]] = []
        compared: dict[str, Baseline] = {}
        judged: dict[str, int] = {}  # a bandwidth series (before "@") -> its sizes compared
        for name, value in sorted(now.figures.items()):
            if not tracked(name, figures):
                continue
            base = indexed.baseline(now, name)
            if base is not None:
                judged[_series(name)] = judged.get(_series(name), 0) + 1
            if base is None or not base.worse(value):
                continue
            z = base.robust_z(value)
            compared[name] = base
            low, high = base.band
            drops.append({"figure": name, "value": value, "median": base.median, "mad": base.mad,
                          "band": [round(low, 6), round(high, 6)], "runs": len(base.runs),
                          "robust_z": None if z is None else round(z, 2), "below": round(base.below(value), 4),
                          "against": base.against})
        drops = consistent(drops, judged)
        if not drops:
            continue
        worst = max(drops, key=lambda d: d["below"])
        busy = load_of(now) == "busy"
        busy_nodes = {str(k): str(v) for k, v in ((load or {}).get("busy_nodes") or {}).items()} if busy else {}
        message = _said(now, worst) + (f" ({len(drops) - 1} other figure(s) too)" if len(drops) > 1 else "")
        if busy:
            why = "; ".join(f"{'node ' + n if n.isdigit() else n}: {w}"
                            for n, w in sorted(busy_nodes.items())) or "measurements.host_load says so"
            message += (f"; but a host of the job was busy while it was timed ({why}): the drop may be the other "
                        "work's, not this host's")
        evidence: dict[str, Any] = {"host": now.host, "instance_type": now.instance_type, "load": load_of(now),
                                    "drops": drops, "compared": compared[worst["figure"]].listed()}
        if busy_nodes:
            evidence["busy_nodes"] = busy_nodes
        out.append(event_finding(BELOW_HISTORY, message, rank=None, evidence=evidence,
                                 severity="info" if busy else "warning"))
    return out


def _series(figure: str) -> str:
    return figure.rsplit("@", 1)[0]


def consistent(drops: list[dict[str, Any]], judged: dict[str, int]) -> list[dict[str, Any]]:
    """The drops of the series that fell across the run, not in one burst: a slow link or device
    is slow at every large message size, a moment of other work at one or two. A bandwidth series
    keeps its drops when at least half of its sizes compared fell below their bands; a step time
    (one figure, a median over the run's steps already) keeps its own."""
    fell: dict[str, int] = {}
    for d in drops:
        fell[_series(d["figure"])] = fell.get(_series(d["figure"]), 0) + 1
    return [d for d in drops if not d["figure"].startswith(BANDWIDTH)
            or 2 * fell[_series(d["figure"])] >= judged.get(_series(d["figure"]), 0)]


def _said(now: RunRecord, d: dict[str, Any]) -> str:
    whose = ("this host's" if d["against"] == "host" else
             f"{now.instance_type}'s (this host has fewer than {MIN_RUNS} quiet runs of its own)")
    low, high = d["band"]
    if d["figure"].startswith(STEP_TIME):
        return (f"on {now.host} the training step took a median {d['value']:.3g} s, {d['below']:.0%} fewer steps per "
                f"second than {whose} median of {d['median']:.3g} s over the last {d['runs']} comparable quiet runs "
                f"of the same script and arguments, above their band of {low:.3g}-{high:.3g} s (MAD "
                f"{d['mad']:.3g} s; the band: the median +/- the larger of {NOISE_TIMES:g} x {MAD_SIGMA} x MAD and "
                f"{FLOOR:.0%})")
    coll, size = d["figure"].split(".busbw_gbps@")
    return (f"on {now.host} {coll} at {int(size)} bytes ran at {d['value']:.3g} GB/s busbw, {d['below']:.0%} below "
            f"{whose} median of {d['median']:.3g} GB/s over the last {d['runs']} comparable quiet runs, under their "
            f"band of {low:.3g}-{high:.3g} GB/s (MAD {d['mad']:.3g} GB/s; the band: the median +/- the larger of "
            f"{NOISE_TIMES:g} x {MAD_SIGMA} x MAD and {FLOOR:.0%})")


PAST = 5 * LAST_RUNS  # the newest comparable records read per host: enough quiet ones among them


def read_past(history: Any, current: list[RunRecord]) -> list[RunRecord]:
    """What `current` is compared with: each host's newest PAST records of its series (series_of:
    only those are compared, and the history holds every other job of the host too) and its
    instance type's."""
    past = [r for now in current for r in history.records(host=now.host, limit=PAST, like=now)]
    for itype, now in sorted({now.instance_type: now for now in current if now.instance_type}.items()):
        past += history.records(instance_type=itype, limit=PAST, like=now)
    return past


HOST_FAULTS_NAMED = 2  # host-class root causes on a host, among its newest PAST records, that make DDP607

HOST_FAILED_BEFORE = declare(
    "DDP607", category="host", severity="warning", title="This host was the cause of earlier failures",
    cause_class="host", action="exclude_host",
    doc="""
    What: A host of this job was named by the root cause of at least 2 of its own newest 100
    runs in the history (a root cause whose action is exclude_host: uncorrectable ECC errors, a
    wrong all_reduce result, a GPU count below the instance type's, a rank that computes markedly
    slower, ...). The finding names the host, how many of its runs, which IDs and when.
    Why: A host that keeps failing for host reasons is a bad machine, not bad luck: a retry that
    lands on it fails again, at the cost of the whole job.
    Fix: Run without that host (`scontrol update nodename=HOST state=drain`, a Kubernetes node
    taint or cordon, a SageMaker HyperPod node replacement) and have it checked; `ddp-doctor
    history --hosts` ranks the hosts by such failures.
    """)


def host_fault_findings(current: list[RunRecord], past: list[RunRecord]) -> list[Finding]:
    """DDP607 for each host of `current` whose records in `past` hold at least HOST_FAULTS_NAMED
    host-class root causes (history/from_report.HOST_FAULT)."""
    out = []
    for host in sorted({now.host for now in current}):
        faults = [(r.time, name[len(HOST_FAULT):]) for r in past if r.host == host
                  for name in r.figures if name.startswith(HOST_FAULT)]
        if len(faults) < HOST_FAULTS_NAMED:
            continue
        runs = len({r.time for r in past if r.host == host})
        ids = sorted({i for _, i in faults})
        last = max(t for t, _ in faults)
        out.append(event_finding(
            HOST_FAILED_BEFORE, f"host {host} was named by the root cause of {len(faults)} of its last {runs} "
            f"run(s) in the history ({', '.join(ids)}; the last at "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(last))} UTC)",
            rank=None, evidence={"host": host, "faults": [{"time": t, "id": i} for t, i in sorted(faults)],
                                 "runs": runs}))
    return out


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
        load = (rep.get("measurements") or {}).get("host_load")
        history = open_history(path)
        found = history_findings(current, read_past(history, current), figures,
                                 load if isinstance(load, dict) else None) if figures else []
        hosts_past = [r for h in sorted({now.host for now in current}) for r in history.records(host=h, limit=PAST)]
        return found + host_fault_findings(current, hosts_past)
    except Exception:  # noqa: BLE001 - see the doc
        return []
