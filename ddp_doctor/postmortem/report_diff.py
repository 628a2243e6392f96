"""`ddp-doctor diff GOOD BAD`: did the BAD run get worse than the GOOD one, and what differs
between them that could be why, most likely culprit first.

Pure functions: two report dicts in (as the CLI read them), a `ReportDiff` out, and its text or JSON
form. Every difference found is judged (`Difference.change`, CHANGES):

- "worse" or "better": a figure beyond its noise band in the direction that hurts (or helps), a
  verdict that got worse (or better). Only "worse" fails the comparison (the CLI's exit status 3);
- "within_noise": a figure that moved no further than this pair's noise band;
- "changed": a setting that differs, neither better nor worse in itself (a version, a variable,
  the layout): the likely causes of what got worse.

What is compared, in this order (KINDS):

- versions: ddp-doctor's (`tool_version`), and torch, NCCL, CUDA, python... as each rank entry
  records them (`ranks[].versions`, the rank view's);
- variables, as each rank entry records them (`ranks[].env`, redacted): NCCL/FI and the other
  communication settings, then the launchers' (TORCHELASTIC_*, MASTER_*, SM_*, OMPI_*, SLURM_*...),
  then any other recorded one;
- the world layout (launcher, backend, world_size, nnodes, nproc_per_node, device types), the
  instance (type, count, GPUs, region), the hosts (and MASTER_ADDR);
- figures, each with its direction: the all_reduce sweeps' bus bandwidth at the largest size both
  measured (higher is better), a `run`'s median training step time of the same script and
  arguments (lower is better), and the sweeps' wrong results (fewer is better);
- the verdicts: status (pass < warn < fail), root cause ID, and the error and warning IDs found in
  one run only or at another severity (a new one, or a more severe one, is worse).

The noise band of a figure (`_bw_band`; the step time's in `_step_time`) is the largest of: a floor
(FLOOR_NOISY, 25%, for a figure measured on CPU ranks, whose machine's load moves it, or from fewer
than FEW_ITERS timed iterations; FLOOR_STEADY, 10%, otherwise; `--bw-tolerance` replaces the floor
of the bandwidth figures) and each run's own spread: for busbw, how far apart that run's figures
are over the compared size and the sizes it measured down to a quarter of it (1 - min/max: on the
plateau of the sweep they measure one bandwidth, so their spread is the run's noise). A band b
holds BAD/GOOD from 1 - b to 1 / (1 - b) (25%: -25% to +33%, the same factor either way, so that a
pair is judged alike whichever run is GOOD); a figure beyond it is worse or better by its
direction.

Left out as noise: anything that differs between two runs of the same job: times, pids, ports, run
and job IDs, temp paths, the tool's own timings (stage_seconds, check_seconds), a sweep's time_us
(its busbw says it) and iterations, findings' messages, and variables that are a rank's own
identity (RANK, SLURM_PROCID: the layout says it). A part that one of the reports does not record
is named under `not_compared` rather than listed as a difference of every item in it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ddp_doctor.findings import SEVERITIES, format_ranks, severity_rank
from ddp_doctor.report.build import SCHEMA, SCHEMA_VERSION
from ddp_doctor.report.redact import MASK, is_secret_name, redact_env, redact_text
from ddp_doctor.report.schema import validate_report

DIFF_SCHEMA = "ddp-doctor.diff"

# What a difference is judged (Difference.change), in the order the output lists them: what fails
# the comparison first.
WORSE, BETTER, WITHIN_NOISE, CHANGED = "worse", "better", "within_noise", "changed"
CHANGES = (WORSE, BETTER, WITHIN_NOISE, CHANGED)
_CHANGE_ORDER = {c: i for i, c in enumerate(CHANGES)}

# The noise band's floor (see the module's doc): a figure measured on CPU ranks (a shared machine's
# load moves it 20% between two back-to-back runs) or from fewer than FEW_ITERS timed iterations
# (a CPU preflight times its largest sizes once), and any other (GPU figures averaged over
# FEW_ITERS or more iterations).
FLOOR_NOISY = 0.25
FLOOR_STEADY = 0.10
FEW_ITERS = 5
PLATEAU = 4  # a run's spread is taken over the compared size and its sizes down to a quarter of it
INF = float("inf")

# (kind, heading), in the order the text lists them within each change: how likely a difference of
# that kind broke a job.
KINDS = (
    ("versions", "versions"),
    ("nccl_env", "NCCL/FI variables"),
    ("launcher_env", "launcher variables"),
    ("other_env", "other variables"),
    ("world", "world layout"),
    ("instance", "instance"),
    ("hosts", "hosts"),
    ("bandwidth", "bus bandwidth"),
    ("training", "training"),
    ("verdict", "verdict"),
)
_KIND_ORDER = {k: i for i, (k, _) in enumerate(KINDS)}
STATUS_ORDER = {"pass": 0, "warn": 1, "fail": 2}  # the verdicts that judge a job; others just differ

UNSET, NONE, NOT_MEASURED = "(unset)", "(none)", "(not measured)"

# Versions by how often they break a job; others (transformers, numpy...) follow by name.
VERSION_ORDER = ("torch", "nccl", "cuda", "python")
VERSION_LABELS = {"torch": "torch", "nccl": "NCCL", "cuda": "CUDA", "python": "python"}

NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_", "FI_", "GLOO_", "SMDATAPARALLEL_")
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "MASTER_", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_", "ROLE_", "SM_",
                     "OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_", "I_MPI_", "HYDRA_")
# A rank's own identity: different on every rank by design, and the world layout already compares it.
RANK_IDENTITY = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMIX_RANK",
    "MPI_LOCALRANKID", "SM_CURRENT_HOST",
})
# Names whose value changes with every run of one job: ports, pids, run/job/step IDs, error files,
# start times, and SageMaker's per-job blobs (SM_TRAINING_ENV holds the job name).
NOISE_NAME = re.compile(
    r"(_PORT|(^|_)PID|RUN_?ID|JOB_?ID|STEP_?ID|_ERROR_FILE|(START|END)_TIME|_URI|NAMESPACE|JOB_NAME)$"
    r"|^(SM_TRAINING_ENV|SM_MODULE_DIR|OMPI_MCA_orte_hnp_uri|OMPI_MCA_ess_base_jobid)$", re.IGNORECASE)
# A temp path (a per-run directory) inside a value compares equal to any other.
_TEMP_PATH = re.compile(r"(?:/tmp|/var/tmp|/dev/shm|/private/var/folders)/[^\s:,;\"']*")

WORLD_FIELDS = (("launcher", "launcher"), ("launched_by", "launched by"), ("backend", "backend"),
                ("world_size", "world_size"), ("nnodes", "nnodes"), ("nproc_per_node", "nproc_per_node"),
                ("platform", "platform"), ("planned", "planned"), ("distribution", "distribution"))
INSTANCE_FIELDS = (("instance_type", "instance type"), ("instance_count", "instance count"),
                   ("gpus_per_instance", "GPUs per instance"), ("region", "region"))
SWEEPS = ("all_reduce", "all_reduce_intra", "all_reduce_inter")
MAX_VALUE_GROUPS = 4  # per-rank values shown in one line before "... and N more"
MAX_HOSTS_SHOWN = 8


@dataclass(frozen=True)
class Difference:
    """One thing that differs: `what` of `kind`, as GOOD and BAD show it (redacted display text),
    and how it is judged (`change`, one of CHANGES). A figure also carries `ratio` (BAD/GOOD), its
    `direction` ("higher is better", "lower is better"), the pair's noise `band` (a fraction: 0.25
    holds BAD/GOOD from 0.75 to 1.33, `within_ratio`) and what set it (`band_from`); `note` says it
    in words."""

    kind: str
    what: str
    good: str
    bad: str
    note: str = ""
    ratio: float | None = None
    change: str = CHANGED
    band: float | None = None
    band_from: str = ""
    direction: str = ""

    def line(self) -> str:
        return f"{self.what}: {self.good} -> {self.bad}" + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "what": self.what, "good": self.good, "bad": self.bad,
                               "change": self.change}
        if self.note:
            out["note"] = self.note
        if self.ratio is not None:
            out["ratio"] = round(self.ratio, 4)
        if self.direction:
            out["direction"] = self.direction
        if self.band is not None:
            lo, hi = within_ratio(self.band)
            out["band"] = round(self.band, 4)
            out["within_ratio"] = [round(lo, 4), None if hi == INF else round(hi, 4)]  # None: no bound
            out["band_from"] = self.band_from
        return out


@dataclass
class ReportDiff:
    """The differences, what fails the comparison first (CHANGES), then most likely culprit first
    (KINDS), and the parts that could not be compared because a report does not record them (so an
    empty list is never mistaken for "the same")."""

    differences: list[Difference] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)

    def of(self, change: str) -> list[Difference]:
        return [d for d in self.differences if d.change == change]

    @property
    def worse(self) -> bool:
        """Whether anything got worse: a figure beyond its noise band, a worse verdict."""
        return any(d.change == WORSE for d in self.differences)

    def counts(self) -> dict[str, int]:
        return {c: len(self.of(c)) for c in CHANGES}


def report_problem(obj: Any) -> str | None:
    """Why `obj` (a parsed JSON file) is not a ddp-doctor report this version can compare, in a
    few words; None when it is one."""
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
        return f"not a ddp-doctor report (no \"schema\": \"{SCHEMA}\")"
    if "schema_version" not in obj:
        return "not a valid ddp-doctor report: it has no schema_version"
    if obj["schema_version"] != SCHEMA_VERSION:
        return (f"a ddp-doctor report of schema_version {obj['schema_version']!r}; "
                f"this ddp-doctor reads {SCHEMA_VERSION}")
    errors = validate_report(obj)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"not a valid ddp-doctor report: {errors[0]}{more}"
    return None


def diff_reports(good: Mapping[str, Any], bad: Mapping[str, Any], *,
                 bw_tolerance: float | None = None) -> ReportDiff:
    """What differs between the GOOD and the BAD run's reports (both valid: `report_problem`), each
    judged (CHANGES), ordered by CHANGES then KINDS. `bw_tolerance` (relative, 0.2 = 20%), when
    given, replaces the floor of the bandwidth figures' noise band; each run's own spread still
    widens it."""
    out = ReportDiff()
    _versions(good, bad, out)
    _variables(good, bad, out)
    _world(good, bad, out)
    _hosts(good, bad, out)
    for name in SWEEPS:
        _bandwidth(name, good, bad, bw_tolerance, out)
    _step_time(good, bad, out)
    _verdict(good, bad, out)
    # stable: each kind keeps its own order
    out.differences.sort(key=lambda d: (_CHANGE_ORDER[d.change], _KIND_ORDER[d.kind]))
    return out


# -- the parts ------------------------------------------------------------------------------------

def _add(out: ReportDiff, kind: str, what: str, good: Any, bad: Any, **extra: Any) -> None:
    """Record a difference when the display values differ (both already shown as text)."""
    g, b = _show(good), _show(bad)
    if g != b:
        out.differences.append(Difference(kind, what, g, b, **extra))


def _show(value: Any) -> str:
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    return redact_text(str(value))


def _rank_dicts(report: Mapping[str, Any], key: str) -> dict[Any, dict[str, Any]] | None:
    """{rank: entry[key]} over the rank entries that record `key` as an object; None when none does."""
    found = {r.get("rank"): r[key] for r in report.get("ranks") or [] if isinstance(r.get(key), dict)}
    return found or None


def _per_rank_text(values: Mapping[Any, str]) -> str:
    """One value when every rank agrees; else each value with its ranks, most ranks first, then lowest rank."""
    groups: dict[str, list[Any]] = {}
    for rank, v in values.items():
        groups.setdefault(v, []).append(rank)
    if len(groups) == 1:
        return next(iter(groups))
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min((r for r in kv[1] if isinstance(r, int)),
                                                                    default=1 << 62), kv[0]))
    parts = [f"{v} ({_ranks_text(rs)})" for v, rs in ordered[:MAX_VALUE_GROUPS]]
    if len(ordered) > MAX_VALUE_GROUPS:
        parts.append(f"and {len(ordered) - MAX_VALUE_GROUPS} more value(s)")
    return "; ".join(parts)


def _ranks_text(ranks: Iterable[Any]) -> str:
    known = [r for r in ranks if isinstance(r, int)]
    if not known:
        return "rank ?"
    return f"{'rank' if len(known) == 1 else 'ranks'} {format_ranks(known)}"


def _lacking(good: Any, bad: Any) -> str:
    """Which report does not record a part (its value there is None)."""
    if good is None and bad is None:
        return "neither report records them"
    return f"the {'GOOD' if good is None else 'BAD'} report does not record them"


def _versions(good: Mapping[str, Any], bad: Mapping[str, Any], out: ReportDiff) -> None:
    g, b = _rank_dicts(good, "versions"), _rank_dicts(bad, "versions")
    if g is None or b is None:
        out.not_compared.append(f"library versions (torch, NCCL, CUDA, python): {_lacking(g, b)}")
        g = b = {}
    names = {k for d in (*g.values(), *b.values()) for k in d if k != "ddp_doctor"}  # tool_version says it
    order = sorted(names, key=lambda k: (VERSION_ORDER.index(k) if k in VERSION_ORDER else len(VERSION_ORDER), k))
    for name in order:
        _add(out, "versions", VERSION_LABELS.get(name, name),
             _per_rank_text({r: _show(d.get(name)) for r, d in g.items()}),
             _per_rank_text({r: _show(d.get(name)) for r, d in b.items()}))
    # last: the libraries' behaviour matters more than the diagnostic tool's
    _add(out, "versions", "ddp-doctor", good.get("tool_version"), bad.get("tool_version"))


def variable_kind(name: str) -> str | None:
    """The kind a recorded variable is compared under; None for noise and a rank's own identity."""
    if name in RANK_IDENTITY or NOISE_NAME.search(name):
        return None
    if name.startswith(NCCL_PREFIXES):
        return "nccl_env"
    if name.startswith(LAUNCHER_PREFIXES):
        return "launcher_env"
    return "other_env"


def _variable_value(env: Mapping[str, Any], name: str) -> str:
    """The display text of one variable: its redacted value, never a secret-named one's."""
    if name not in env or env[name] is None:
        return UNSET
    if is_secret_name(name):
        return MASK
    return _show(env[name])


def _variables(good: Mapping[str, Any], bad: Mapping[str, Any], out: ReportDiff) -> None:
    g, b = _rank_dicts(good, "env"), _rank_dicts(bad, "env")
    if g is None or b is None:
        out.not_compared.append(f"environment variables (NCCL_*, FI_*, launchers'): {_lacking(g, b)}")
        return
    g = {r: redact_env(e) for r, e in g.items()}  # reports are redacted already: this keeps it so
    b = {r: redact_env(e) for r, e in b.items()}
    names = sorted({k for e in (*g.values(), *b.values()) for k in e if isinstance(k, str)})
    for name in names:
        kind = variable_kind(name)
        if kind is None:
            continue
        gv = _per_rank_text({r: _variable_value(e, name) for r, e in g.items()})
        bv = _per_rank_text({r: _variable_value(e, name) for r, e in b.items()})
        if _TEMP_PATH.sub("<temp>", gv) != _TEMP_PATH.sub("<temp>", bv):
            out.differences.append(Difference(kind, name, gv, bv))


def _world(good: Mapping[str, Any], bad: Mapping[str, Any], out: ReportDiff) -> None:
    gw, bw = good.get("world") or {}, bad.get("world") or {}
    for key, label in WORLD_FIELDS:
        _add(out, "world", label, gw.get(key), bw.get(key))
    gd, bd = _device_types(good), _device_types(bad)
    if gd and bd:  # a planned job (sagemaker-check) has no ranks to say it
        _add(out, "world", "devices", gd, bd)
    for key, label in INSTANCE_FIELDS:
        _add(out, "instance", label, gw.get(key), bw.get(key))


def _device_types(report: Mapping[str, Any]) -> str:
    """"cpu", "cuda": the kinds of device the ranks use (the index is nproc_per_node's business)."""
    kinds = {str(r.get("device")).split(":")[0] for r in report.get("ranks") or [] if r.get("device")}
    return ", ".join(sorted(kinds))


def _hosts(good: Mapping[str, Any], bad: Mapping[str, Any], out: ReportDiff) -> None:
    gh, bh = _host_set(good), _host_set(bad)
    if gh and bh:
        if gh != bh:
            only_g, only_b = sorted(gh - bh), sorted(bh - gh)
            note = "; ".join(p for p in (f"only GOOD: {_listed(only_g)}" if only_g else "",
                                         f"only BAD: {_listed(only_b)}" if only_b else "") if p)
            out.differences.append(Difference("hosts", "hosts", _show(_listed(sorted(gh))),
                                              _show(_listed(sorted(bh))), note=_show(note)))
    elif gh or bh:
        out.not_compared.append(f"hosts: {_lacking(gh or None, bh or None)}")
    _add(out, "hosts", "MASTER_ADDR", (good.get("world") or {}).get("master_addr"),
         (bad.get("world") or {}).get("master_addr"))


def _host_set(report: Mapping[str, Any]) -> set[str]:
    return {str(r["host"]) for r in report.get("ranks") or [] if r.get("host")}


def _listed(hosts: list[str]) -> str:
    shown = ", ".join(hosts[:MAX_HOSTS_SHOWN])
    return shown + (f" and {len(hosts) - MAX_HOSTS_SHOWN} more" if len(hosts) > MAX_HOSTS_SHOWN else "")


def _sweep(report: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    entries = (report.get("measurements") or {}).get(name)
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not nan


def _busbw_by_size(entries: list[dict[str, Any]]) -> dict[int, tuple[float, int | None]]:
    """{bytes: (busbw GB/s, timed iterations)}; several entries of one size (groups swept apart): the
    slowest one's busbw and the fewest iterations (None where an entry does not say)."""
    by_size: dict[int, tuple[float, int | None]] = {}
    for e in entries:
        size, bw, iters = e.get("bytes"), e.get("busbw_gbps"), e.get("iters")
        if not (isinstance(size, int) and _number(bw)):
            continue
        it = iters if isinstance(iters, int) and not isinstance(iters, bool) else None
        if size in by_size:
            old_bw, old_it = by_size[size]
            it = None if it is None or old_it is None else min(it, old_it)
            bw = min(old_bw, float(bw))
        by_size[size] = (float(bw), it)
    return by_size


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _on_cpu(*reports: Mapping[str, Any]) -> bool:
    """Whether a figure of these reports may have been measured on CPU ranks (or on ranks whose
    device the report does not say)."""
    return any("cpu" in _device_types(r).split(", ") or not _device_types(r) for r in reports)


def _spread(by_size: Mapping[int, tuple[float, int | None]], size: int) -> tuple[float, str] | None:
    """A run's own spread around `size`: 1 - min/max of its busbw at `size` and at the sizes it
    measured down to a quarter of it (as a band: BAD/GOOD within the factor max/min either way),
    and those sizes in words; None with fewer than two figures."""
    near = {s: bw for s, (bw, _) in by_size.items() if size // PLATEAU <= s <= size}
    if len(near) < 2 or max(near.values()) <= 0:
        return None
    return 1.0 - min(near.values()) / max(near.values()), f"{_size_text(min(near))}-{_size_text(size)}"


def _bw_band(good: Mapping[str, Any], bad: Mapping[str, Any], g: Mapping[int, tuple[float, int | None]],
             b: Mapping[int, tuple[float, int | None]], size: int, tolerance: float | None) -> tuple[float, str]:
    """This pair's noise band for busbw at `size`, and what set it (see the module's doc)."""
    if tolerance is not None:
        candidates = [(tolerance, f"the least band --bw-tolerance sets, {tolerance:.0%}")]
    else:
        iters = [g[size][1], b[size][1]]
        if _on_cpu(good, bad):
            candidates = [(FLOOR_NOISY, f"the {FLOOR_NOISY:.0%} floor for figures measured on CPU")]
        elif any(i is None or i < FEW_ITERS for i in iters):
            candidates = [(FLOOR_NOISY, f"the {FLOOR_NOISY:.0%} floor for figures of fewer than {FEW_ITERS} timed "
                                        "iterations")]
        else:
            candidates = [(FLOOR_STEADY, f"the {FLOOR_STEADY:.0%} floor for GPU figures of {FEW_ITERS} or more "
                                         "timed iterations")]
    for who, by_size in (("GOOD", g), ("BAD", b)):
        spread = _spread(by_size, size)
        if spread is not None:
            candidates.append((spread[0], f"{who}'s own spread over {spread[1]}"))
    return max(candidates, key=lambda c: c[0])  # the first of equals: the floor


def within_ratio(band: float) -> tuple[float, float]:
    """The BAD/GOOD ratios within a noise band of `band`: a fall by up to `band` of GOOD's figure,
    or the rise that is the same factor the other way (25%: 0.75 to 1.333; a pair measured the
    other way round is judged alike)."""
    return max(0.0, 1.0 - band), (1.0 / (1.0 - band) if band < 1.0 else INF)


def _pct(x: float, digits: int = 0) -> str:
    return "+inf%" if x == INF else f"{x:+.{digits}%}"


def _judged(kind: str, what: str, gv: float, bv: float, unit: str, *, higher_is_better: bool, band: float,
            band_from: str) -> Difference | None:
    """A figure's difference, judged against `band` (see within_ratio); None when the two figures
    are equal."""
    if gv == bv:
        return None
    ratio = bv / gv if gv > 0 else INF  # a figure of 0 in GOOD: anything is more of it
    lo, hi = within_ratio(band)
    if lo <= ratio <= hi:
        change, where = WITHIN_NOISE, "within"
    else:
        change, where = (BETTER if (ratio > 1.0) == higher_is_better else WORSE), "beyond"
    # the change and the bound on its side, with a decimal where whole percents would read alike
    bound = (lo if ratio < 1.0 else hi) - 1.0
    digits = 1 if _pct(ratio - 1.0) == _pct(bound) and ratio - 1.0 != bound else 0
    band_text = f"{_pct(lo - 1.0, digits)}/{_pct(hi - 1.0, digits)}"
    return Difference(kind, what, f"{gv:.3g} {unit}", f"{bv:.3g} {unit}",
                      note=f"{_pct(ratio - 1.0, digits)}, {where} this pair's noise band of {band_text}: {band_from}",
                      ratio=None if ratio == INF else ratio, change=change, band=band, band_from=band_from,
                      direction="higher is better" if higher_is_better else "lower is better")


def _bandwidth(name: str, good: Mapping[str, Any], bad: Mapping[str, Any], tolerance: float | None,
               out: ReportDiff) -> None:
    """The sweep's busbw at the largest size both runs measured (nccl-tests' headline figure; higher
    is better), judged against this pair's noise band; a sweep one run has and the other lacks (a
    change, not a judgement: a failed run's verdict says it failed); wrong results (fewer is better)."""
    ge, be = _sweep(good, name), _sweep(bad, name)
    if not ge and not be:
        return
    g, b = _busbw_by_size(ge), _busbw_by_size(be)
    if not g or not b:
        have = g or b
        size = max(have)
        fig = f"{have[size][0]:.3g} GB/s at {_size_text(size)}"
        out.differences.append(Difference("bandwidth", f"{name} busbw", fig if g else NOT_MEASURED,
                                          NOT_MEASURED if g else fig))
    else:
        common = set(g) & set(b)
        if not common:
            out.not_compared.append(f"{name} busbw: the two sweeps share no size")
        else:
            size = max(common)
            band, band_from = _bw_band(good, bad, g, b, size, tolerance)
            d = _judged("bandwidth", f"{name} busbw at {_size_text(size)}", g[size][0], b[size][0], "GB/s",
                        higher_is_better=True, band=band, band_from=band_from)
            if d is not None:
                out.differences.append(d)
    if ge and be:
        gw, bw = _wrong(ge), _wrong(be)
        # fewer sizes wrong is better; as many, fewer elements wrong; as many of both: it moved
        change = WORSE if bw > gw else BETTER if bw < gw else CHANGED
        _add(out, "bandwidth", f"{name} results", _correctness(ge), _correctness(be), change=change)


def _wrong(entries: list[dict[str, Any]]) -> tuple[int, int]:
    """(sizes whose result was wrong, elements that arrived wrong)."""
    wrong = [e for e in entries if e.get("correct") is False]
    return len(wrong), sum(e["wrong"] for e in wrong if isinstance(e.get("wrong"), int))


def _correctness(entries: list[dict[str, Any]]) -> str:
    wrong = [e for e in entries if e.get("correct") is False]
    if not wrong:
        return "correct"
    ranks = sorted({r for e in wrong for r in e.get("wrong_ranks") or [] if isinstance(r, int)})
    return (f"WRONG at {len(wrong)} of {len(entries)} size(s)"
            + (f" ({_ranks_text(ranks)})" if ranks else ""))


def _training(report: Mapping[str, Any]) -> dict[str, Any] | None:
    t = (report.get("measurements") or {}).get("training")
    return t if isinstance(t, dict) and _number(t.get("median_step_s")) else None


def _step_time(good: Mapping[str, Any], bad: Mapping[str, Any], out: ReportDiff) -> None:
    """A `run`'s median training step time (lower is better), of the same script and arguments
    only. The report keeps one figure, not its spread: the band is the floor (FLOOR_NOISY on CPU
    ranks, FLOOR_STEADY on GPUs)."""
    gt, bt = _training(good), _training(bad)
    if gt is None and bt is None:
        return
    if gt is None or bt is None:
        out.not_compared.append(f"training step time: the {'GOOD' if gt is None else 'BAD'} report does not "
                                "record it")
        return
    if gt.get("script_key") != bt.get("script_key"):
        out.not_compared.append("training step time: the runs ran different scripts or arguments "
                                f"({_show(gt.get('script'))}, {_show(bt.get('script'))})")
        return
    band, band_from = ((FLOOR_NOISY, f"the {FLOOR_NOISY:.0%} floor for times measured on CPU") if _on_cpu(good, bad)
                       else (FLOOR_STEADY, f"the {FLOOR_STEADY:.0%} floor for times measured on GPUs"))
    script = f" of {_show(gt['script'])}" if gt.get("script") else ""
    d = _judged("training", f"median step time{script}", float(gt["median_step_s"]), float(bt["median_step_s"]), "s",
                higher_is_better=False, band=band, band_from=band_from)
    if d is not None:
        out.differences.append(d)


def _verdict(good: Mapping[str, Any], bad: Mapping[str, Any], out: ReportDiff) -> None:
    gs, bs = good.get("status"), bad.get("status")
    change = CHANGED
    if gs in STATUS_ORDER and bs in STATUS_ORDER:  # "running", "interrupted": not a judgement of the job
        change = WORSE if STATUS_ORDER[bs] > STATUS_ORDER[gs] else BETTER
    _add(out, "verdict", "status", _status(good), _status(bad), change=change)
    gc, bc = _cause_id(good), _cause_id(bad)
    _add(out, "verdict", "root cause", gc, bc, change=WORSE if gc is None else BETTER if bc is None else CHANGED)
    gf, bf = _finding_severities(good), _finding_severities(bad)
    titles = {**gf[1], **bf[1]}
    for fid in sorted(set(gf[0]) | set(bf[0])):
        g, b = gf[0].get(fid), bf[0].get(fid)
        if g != b:
            # new, or more severe (error before warning): worse; gone, or less severe: better
            worse = g is None or (b is not None and severity_rank(b) < severity_rank(g))
            out.differences.append(Difference("verdict", f"finding {fid} {titles.get(fid, '')}".rstrip(),
                                              g or "(absent)", b or "(absent)", change=WORSE if worse else BETTER))


def _status(report: Mapping[str, Any]) -> str:
    status = str(report.get("status"))
    pre = report.get("preflight_status")
    return f"{status} (preflight {pre})" if status == "running" and pre else status


def _cause_id(report: Mapping[str, Any]) -> str | None:
    cause = report.get("root_cause")
    return str(cause.get("id")) if isinstance(cause, dict) and cause.get("id") else None


def _finding_severities(report: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """({ID: its most severe error or warning}, {ID: title}); info findings say how things are,
    not what went wrong, and are left out."""
    worst: dict[str, str] = {}
    titles: dict[str, str] = {}
    for f in report.get("findings") or []:
        fid, sev = f.get("id"), f.get("severity")
        if not fid or sev not in SEVERITIES[:2]:
            continue
        if fid not in worst or severity_rank(sev) < severity_rank(worst[fid]):
            worst[fid] = sev
        titles.setdefault(fid, redact_text(str(f.get("title") or "")))
    return worst, titles


# -- output ---------------------------------------------------------------------------------------

# (change, heading of {n} differences) as the text lists them: what fails the comparison first.
SECTIONS = (
    (WORSE, "worse ({n}: the comparison fails, exit 3)"),
    (BETTER, "better ({n})"),
    (WITHIN_NOISE, "within noise ({n})"),
    (CHANGED, "also differs ({n}; neither better nor worse in itself: the likely causes, most likely first)"),
)


def headline(result: ReportDiff) -> str:
    """"2 worse; 1 better, 1 within noise, 3 other difference(s)", "nothing worse; ..."."""
    n = result.counts()
    judged = f"{n[WORSE]} worse" if n[WORSE] else "nothing worse"
    return (f"{judged}; {n[BETTER]} better, {n[WITHIN_NOISE]} within noise, "
            f"{n[CHANGED]} other difference(s)")


def render_text(result: ReportDiff, good_name: str, bad_name: str) -> str:
    """The listing: a headline, then per change (SECTIONS: what got worse first) one line per
    difference under its kind's heading, then what could not be compared."""
    lines = [f"ddp-doctor diff: {headline(result)} - GOOD {good_name}, BAD {bad_name}"]
    for change, title in SECTIONS:
        mine = result.of(change)
        if not mine:
            continue
        lines.append(title.format(n=len(mine)) + ":")
        for kind, heading in KINDS:
            of_kind = [d for d in mine if d.kind == kind]
            if of_kind:
                lines.append(f"  {heading}:")
                lines += [f"    {d.line()}" for d in of_kind]
    if result.not_compared:
        lines.append("not compared:")
        lines += [f"  {x}" for x in result.not_compared]
    return "\n".join(lines)


def to_json(result: ReportDiff, good_name: str, bad_name: str) -> dict[str, Any]:
    """The machine-readable form: `worse` (whether anything got worse: the exit status 3), `counts`
    per change, and `differences` in the text's order, each {kind, what, good, bad, change, note?,
    ratio?, direction?, band?, band_from?}."""
    return {"schema": DIFF_SCHEMA, "good": good_name, "bad": bad_name, "worse": result.worse,
            "counts": result.counts(), "differences": [d.to_dict() for d in result.differences],
            "not_compared": list(result.not_compared)}


__all__ = ["BETTER", "CHANGED", "CHANGES", "Difference", "FLOOR_NOISY", "FLOOR_STEADY", "KINDS", "ReportDiff",
           "WITHIN_NOISE", "WORSE", "diff_reports", "headline", "render_text", "report_problem", "to_json",
           "variable_kind", "within_ratio"]
