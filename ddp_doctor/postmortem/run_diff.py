"""`ddp-doctor diff GOOD BAD`: what differs between two runs' reports that matters to a distributed
job, most likely culprit first.

Pure functions: two report dicts in (as the CLI read them), a `RunDiff` out, and its text or JSON
form. What is compared, in this order (KINDS):

- versions: ddp-doctor's (`tool_version`), and torch, NCCL, CUDA, python... as each rank entry
  records them (`ranks[].versions`, the rank view's);
- variables, as each rank entry records them (`ranks[].env`, redacted): NCCL/FI and the other
  communication settings, then the launchers' (TORCHELASTIC_*, MASTER_*, SM_*, OMPI_*, SLURM_*...),
  then any other recorded one;
- the world layout (launcher, backend, world_size, nnodes, nproc_per_node, device types), the
  instance (type, count, GPUs, region), the hosts (and MASTER_ADDR);
- the all_reduce sweeps' bus bandwidth at the largest size both measured, beyond a relative
  tolerance (default 20%), and whether their results were correct;
- the verdicts: status, root cause ID, error and warning IDs found in one run only.

Left out as noise: anything that differs between two runs of the same job: times, pids, ports, run
and job IDs, temp paths, the tool's own timings (stage_seconds, check_seconds), a sweep's time_us
and iterations, findings' messages, and variables that are a rank's own identity (RANK, SLURM_PROCID:
the layout says it). A part that one of the reports does not record is named under `not_compared`
rather than listed as a difference of every item in it.
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
DEFAULT_BW_TOLERANCE = 0.20  # relative: a 2-core CPU box swings more; NCCL on one fabric much less

# (kind, heading), in the order the text lists them: how likely a difference of that kind broke a job.
KINDS = (
    ("versions", "versions"),
    ("nccl_env", "NCCL/FI variables"),
    ("launcher_env", "launcher variables"),
    ("other_env", "other variables"),
    ("world", "world layout"),
    ("instance", "instance"),
    ("hosts", "hosts"),
    ("bandwidth", "bus bandwidth"),
    ("verdict", "verdict"),
)
_KIND_ORDER = {k: i for i, (k, _) in enumerate(KINDS)}

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
    """One thing that differs: `what` of `kind`, as GOOD and BAD show it (redacted display text);
    `note` adds what a reader needs to weigh it (the bandwidth ratio); `ratio` is BAD/GOOD."""

    kind: str
    what: str
    good: str
    bad: str
    note: str = ""
    ratio: float | None = None

    def line(self) -> str:
        return f"{self.what}: {self.good} -> {self.bad}" + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "what": self.what, "good": self.good, "bad": self.bad}
        if self.note:
            out["note"] = self.note
        if self.ratio is not None:
            out["ratio"] = round(self.ratio, 4)
        return out


@dataclass
class RunDiff:
    """The differences that matter, most likely culprit first, and the parts that could not be
    compared because a report does not record them (so an empty list is never mistaken for
    "the same")."""

    differences: list[Difference] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)

    @property
    def matters(self) -> bool:
        return bool(self.differences)


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
                 bw_tolerance: float = DEFAULT_BW_TOLERANCE) -> RunDiff:
    """What differs between the GOOD and the BAD run's reports (both valid: `report_problem`),
    ordered by KINDS; bandwidth differs only beyond `bw_tolerance` (relative, 0.2 = 20%)."""
    out = RunDiff()
    _versions(good, bad, out)
    _variables(good, bad, out)
    _world(good, bad, out)
    _hosts(good, bad, out)
    for name in SWEEPS:
        _bandwidth(name, good, bad, bw_tolerance, out)
    _verdict(good, bad, out)
    out.differences.sort(key=lambda d: _KIND_ORDER[d.kind])  # stable: each kind keeps its own order
    return out


# -- the parts ------------------------------------------------------------------------------------

def _add(out: RunDiff, kind: str, what: str, good: Any, bad: Any, **extra: Any) -> None:
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


def _versions(good: Mapping[str, Any], bad: Mapping[str, Any], out: RunDiff) -> None:
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


def _variables(good: Mapping[str, Any], bad: Mapping[str, Any], out: RunDiff) -> None:
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


def _world(good: Mapping[str, Any], bad: Mapping[str, Any], out: RunDiff) -> None:
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


def _hosts(good: Mapping[str, Any], bad: Mapping[str, Any], out: RunDiff) -> None:
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


def _busbw_by_size(entries: list[dict[str, Any]]) -> dict[int, float]:
    """{bytes: busbw GB/s}; several entries of one size (groups swept apart): the slowest one's."""
    by_size: dict[int, float] = {}
    for e in entries:
        size, bw = e.get("bytes"), e.get("busbw_gbps")
        if isinstance(size, int) and isinstance(bw, (int, float)) and not isinstance(bw, bool):
            by_size[size] = min(by_size.get(size, float(bw)), float(bw))
    return by_size


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _bandwidth(name: str, good: Mapping[str, Any], bad: Mapping[str, Any], tolerance: float,
               out: RunDiff) -> None:
    """The sweep's busbw at the largest size both runs measured (nccl-tests' headline figure), when
    BAD/GOOD is beyond `tolerance`; a sweep one run has and the other lacks; wrong results."""
    ge, be = _sweep(good, name), _sweep(bad, name)
    if not ge and not be:
        return
    g, b = _busbw_by_size(ge), _busbw_by_size(be)
    if not g or not b:
        have = g or b
        size = max(have)
        fig = f"{have[size]:.3g} GB/s at {_size_text(size)}"
        out.differences.append(Difference("bandwidth", f"{name} busbw", fig if g else NOT_MEASURED,
                                          NOT_MEASURED if g else fig))
    else:
        common = set(g) & set(b)
        if not common:
            out.not_compared.append(f"{name} busbw: the two sweeps share no size")
        else:
            size = max(common)
            gv, bv = g[size], b[size]
            ratio = bv / gv if gv > 0 else (1.0 if bv <= 0 else float("inf"))
            if abs(ratio - 1.0) > tolerance:
                ratio_text = f"{ratio:.2f}" if ratio != float("inf") else "inf"
                out.differences.append(Difference(
                    "bandwidth", f"{name} busbw at {_size_text(size)}", f"{gv:.3g} GB/s", f"{bv:.3g} GB/s",
                    note=f"BAD/GOOD {ratio_text}, beyond {tolerance:.0%}",
                    ratio=ratio if ratio != float("inf") else None))
    if ge and be:
        _add(out, "bandwidth", f"{name} results", _correctness(ge), _correctness(be))


def _correctness(entries: list[dict[str, Any]]) -> str:
    wrong = [e for e in entries if e.get("correct") is False]
    if not wrong:
        return "correct"
    ranks = sorted({r for e in wrong for r in e.get("wrong_ranks") or [] if isinstance(r, int)})
    return (f"WRONG at {len(wrong)} of {len(entries)} size(s)"
            + (f" ({_ranks_text(ranks)})" if ranks else ""))


def _verdict(good: Mapping[str, Any], bad: Mapping[str, Any], out: RunDiff) -> None:
    _add(out, "verdict", "status", _status(good), _status(bad))
    _add(out, "verdict", "root cause", _cause_id(good), _cause_id(bad))
    gf, bf = _finding_severities(good), _finding_severities(bad)
    titles = {**gf[1], **bf[1]}
    for fid in sorted(set(gf[0]) | set(bf[0])):
        g, b = gf[0].get(fid), bf[0].get(fid)
        if g != b:
            out.differences.append(Difference("verdict", f"finding {fid} {titles.get(fid, '')}".rstrip(),
                                              g or "(absent)", b or "(absent)"))


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

def render_text(result: RunDiff, good_name: str, bad_name: str) -> str:
    """The listing: a headline, one line per difference under its kind's heading, then what could
    not be compared."""
    n = len(result.differences)
    head = (f"ddp-doctor diff: {n} difference(s) that matter" if n else "ddp-doctor diff: nothing that matters differs")
    lines = [f"{head} - GOOD {good_name}, BAD {bad_name}"]
    for kind, heading in KINDS:
        mine = [d for d in result.differences if d.kind == kind]
        if mine:
            lines.append(f"{heading}:")
            lines += [f"  {d.line()}" for d in mine]
    if result.not_compared:
        lines.append("not compared:")
        lines += [f"  {x}" for x in result.not_compared]
    return "\n".join(lines)


def to_json(result: RunDiff, good_name: str, bad_name: str) -> dict[str, Any]:
    """The machine-readable form: `differences` in the text's order, each {kind, what, good, bad,
    note?, ratio?}."""
    return {"schema": DIFF_SCHEMA, "good": good_name, "bad": bad_name, "matters": result.matters,
            "differences": [d.to_dict() for d in result.differences], "not_compared": list(result.not_compared)}


__all__ = ["DEFAULT_BW_TOLERANCE", "Difference", "KINDS", "RunDiff", "diff_reports", "render_text", "report_problem",
           "to_json", "variable_kind"]
