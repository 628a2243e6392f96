"""`ddp-doctor history`: the runs the local history holds (ddp_doctor/history/database.py), for a host
or an instance type, as a table (readable column names: when, job, kind, script, host, layout,
versions, status, load, a figure per column), as JSON, or as a plot of each figure per run. With
`--host` and one `--figure` that DDP409 judges, it also shows the judgement of the newest run
holding that figure: the runs it was compared with (when, job, kind, script, load, value), their
median, MAD and band (checks/history_rules.baseline). Exit status: 0, 2 for a usage error (no such
history file, a path that is not a regular file, a figure it never held), 1 for a file that is no
history that can be read (corrupted, truncated, another file, locked): one line naming it and what
to do. Rows that are not records are skipped and counted, in a line on stderr (and `skipped_rows`
in --json)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Iterable

from ddp_doctor.checks.history_rules import BANDWIDTH, MIN_RUNS, PAST, STEP_TIME, Baseline, baseline, load_of, tracked
from ddp_doctor.cli.options import UsageError
from ddp_doctor.history.from_report import BUSY

HELP = "the runs the local history holds, for a host or an instance type (table, --json, --plot)"
DEFAULT_FIGURES = ("stage_seconds.total",)
COLLECTIVE_WORDS = {"all_reduce": "all_reduce", "all_reduce_intra": "all_reduce within a node",
                    "all_reduce_inter": "all_reduce between nodes", "broadcast": "broadcast",
                    "all_gather": "all_gather"}
NAMED = {"arrival.median_lag_s": "straggler's median lag (s)", "arrival.waited_share": "share waited for straggler",
         BUSY: "host busy (1: yes)", "stage_seconds.total": "preflight total (s)"}


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history", metavar="PATH", default=None,
                   help="the history file (default: $DDP_DOCTOR_HISTORY, else ~/.cache/ddp-doctor/history.sqlite)")
    p.add_argument("--host", default=None, help="only this host's records")
    p.add_argument("--instance-type", default=None, help="only records of this instance type")
    p.add_argument("--figure", action="append", metavar="NAME",
                   help="a figure to show (repeatable; default: the largest all_reduce's busbw, the newest "
                        "run's step time and the preflight's total time); `--figure list` lists those the "
                        "records hold; with --host and one figure DDP409 judges, also the runs the newest "
                        "run was compared with")
    p.add_argument("--last", type=int, default=20, metavar="N", help="the newest N records (default: 20)")
    p.add_argument("--hosts", action="store_true",
                   help="rank the hosts by the failures their runs' root causes blamed on them (exclude_host: "
                        "DDP607 names such a host), over the newest 20,000 records")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.add_argument("--plot", metavar="PATH.png", default=None,
                   help="plot each figure per run (needs matplotlib: pip install 'ddp-doctor[plot]')")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def label(name: str, recs: Iterable[Any] = ()) -> str:
    """A figure's column name: `all_reduce 256 MiB busbw (GB/s)`, `median step (s) of train.py`."""
    if ".busbw_gbps@" in name:
        coll, size = name.split(".busbw_gbps@", 1)
        try:
            return f"{COLLECTIVE_WORDS.get(coll, coll)} {_size(int(size))} busbw (GB/s)"
        except ValueError:
            return name
    if name.startswith(STEP_TIME):
        key = name[len(STEP_TIME[0]):]
        script = next((r.script for r in reversed(list(recs)) if name in r.figures and r.script), None)
        return f"median step (s) of {script or 'script'} [{key[:8]}]"
    if name in NAMED:
        return NAMED[name]
    if name.startswith("stage_seconds."):
        return f"preflight {name.split('.', 1)[1]} (s)"
    return name


def _largest_busbw(recs: list[Any]) -> list[str]:
    sizes = [(int(name.rsplit("@", 1)[1]), name) for r in recs for name in r.figures
             if name.startswith("all_reduce.busbw_gbps@")]
    return [max(sizes)[1]] if sizes else []


def _step_time(recs: list[Any]) -> list[str]:
    """The step time of the script the newest run recorded (each script and its arguments are a
    figure of their own)."""
    for r in reversed(recs):
        names = [n for n in r.figures if n.startswith(STEP_TIME)]
        if names:
            return names[:1]
    return []


def command(args: argparse.Namespace) -> int:
    import os
    import shlex

    from ddp_doctor.exit_codes import EXIT_INTERNAL
    from ddp_doctor.facts.env_values import not_regular
    from ddp_doctor.history.database import History, HistoryUnreadable, default_path
    from ddp_doctor.history.opened import open_history
    path = args.history or default_path()
    if path is None:
        raise UsageError("the history is off (DDP_DOCTOR_HISTORY=off): give --history PATH")
    if not path.startswith("s3://") and not os.path.exists(path):
        raise UsageError(f"no history at {path} (a preflight or run writes it)")
    if not path.startswith("s3://") and (kind := not_regular(path)) is not None:
        raise UsageError(f"{path} is {kind}, not a regular file: --history names the history's SQLite file")
    if args.last < 1:
        raise UsageError("--last takes a positive number")
    history = open_history(path)
    skipped = 0
    if isinstance(history, History):
        try:
            recs, skipped = history.read(host=args.host, instance_type=args.instance_type, limit=args.last)
        except (HistoryUnreadable, FileNotFoundError) as e:
            aside = f"mv {shlex.quote(path)} {shlex.quote(path + '.bad')}"
            sys.stderr.write(f"ddp-doctor history: error: the history {e}; move it aside ({aside}): "
                             f"the next preflight or run starts a new one\n")
            return EXIT_INTERNAL
    else:
        recs = history.records(host=args.host, instance_type=args.instance_type, limit=args.last)
        if getattr(history, "read_error", None):  # never "0 record(s)" for a history it could not read
            sys.stderr.write(f"ddp-doctor history: error: the history {path} could not be read: "
                             f"{history.read_error}\n")
            return EXIT_INTERNAL
    if skipped:
        sys.stderr.write(f"ddp-doctor history: {skipped} unreadable row(s) skipped in {path}\n")
    if args.hosts:
        ranked = host_faults(history.records(host=args.host, instance_type=args.instance_type, limit=20_000))
        if args.json:
            json.dump({"history": path, "hosts": ranked}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(_hosts_table(ranked, path))
        return 0
    held = sorted({name for r in recs for name in r.figures})
    if args.figure == ["list"]:
        width = max((len(n) for n in held), default=0)
        print("\n".join(f"{n.ljust(width)}  {label(n, recs)}" for n in held))
        return 0
    figures = args.figure or [f for f in [*_largest_busbw(recs), *_step_time(recs), *DEFAULT_FIGURES] if f in held]
    unknown = [f for f in args.figure or [] if f not in held and recs]
    if unknown:
        raise UsageError(f"no record holds {', '.join(unknown)} (`--figure list` lists the figures)")
    judged = None
    if args.host and args.figure and len(args.figure) == 1 and tracked(args.figure[0]):
        judged = _judgement(history, args.host, args.figure[0])
    if args.json:
        out: dict[str, Any] = {"history": path, "records": [r.to_dict() for r in recs], "skipped_rows": skipped,
                               "columns": {f: label(f, recs) for f in figures}}
        if judged is not None:
            out["compared"] = _judgement_dict(*judged)
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(_table(recs, figures, path))
        if judged is not None:
            print()
            print(_judgement_text(*judged))
    if args.plot:
        err = _plot(recs, figures, args.plot)
        if err:
            raise UsageError(err)
    return 0


def host_faults(recs: list[Any]) -> list[dict[str, Any]]:
    """Each host's runs and the host-class root causes among them (history/from_report.HOST_FAULT),
    most faults first, then most runs."""
    from ddp_doctor.history.from_report import HOST_FAULT
    by_host: dict[str, dict[str, Any]] = {}
    for r in recs:
        h = by_host.setdefault(r.host, {"host": r.host, "runs": 0, "host_faults": 0, "ids": {}, "last_fault": None})
        h["runs"] += 1
        for name in r.figures:
            if name.startswith(HOST_FAULT):
                cid = name[len(HOST_FAULT):]
                h["host_faults"] += 1
                h["ids"][cid] = h["ids"].get(cid, 0) + 1
                h["last_fault"] = max(h["last_fault"] or 0.0, r.time)
    return sorted(by_host.values(), key=lambda h: (-h["host_faults"], -h["runs"], h["host"]))


def _hosts_table(ranked: list[dict[str, Any]], path: str) -> str:
    rows = [["host", "runs", "host faults", "IDs", "last fault"]]
    for h in ranked:
        ids = ", ".join(f"{i} x{n}" if n > 1 else i for i, n in sorted(h["ids"].items()))
        rows.append([h["host"], str(h["runs"]), str(h["host_faults"]), ids or "-",
                     _when(h["last_fault"]) if h["last_fault"] else "-"])
    return "\n".join([f"{len(ranked)} host(s) in {path}", *_grid(rows)])


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _grid(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def _table(recs: list[Any], figures: list[str], path: str) -> str:
    head = ["when", "job", "kind", "script", "host", "layout", "torch", "nccl", "status", "load",
            *(label(f, recs) for f in figures)]
    rows = [head]
    for r in recs:
        layout = f"{r.nnodes or '?'}x{r.nproc_per_node or '?'} {r.backend or ''}".strip()
        rows.append([_when(r.time), str(r.job or "-"), r.kind, str(r.script or "-"), r.host, layout,
                     str(r.versions.get("torch") or "-"), str(r.versions.get("nccl") or "-"), str(r.status or "-"),
                     load_of(r), *(f"{r.figures[f]:.4g}" if f in r.figures else "-" for f in figures)])
    return "\n".join([f"{len(recs)} record(s) of {path}", *_grid(rows)])


def _judgement(history: Any, host: str, figure: str) -> tuple[Any, str, Baseline | None, list[Any]] | None:
    """(the newest record of `host` holding `figure`, the figure, what DDP409 compared it with, the
    comparable past it chose from); None when the host has no such record. Reads as DDP409 does
    (checks/history_rules.read_past)."""
    from ddp_doctor.checks.history_rules import read_past, unique
    from ddp_doctor.history.database import series_of
    mine = [r for r in history.records(host=host, limit=PAST) if figure in r.figures]
    if not mine:
        return None
    now = mine[-1]
    past = [r for r in unique(read_past(history, [now])) if r.time < now.time]
    comparable = [r for r in past if series_of(r) == series_of(now) and figure in r.figures]
    return now, figure, baseline(now, past, figure), comparable


def _judgement_dict(now: Any, figure: str, base: Baseline | None, comparable: list[Any]) -> dict[str, Any]:
    value = now.figures[figure]
    out: dict[str, Any] = {"figure": figure, "column": label(figure, [now]), "run": now.to_dict(), "value": value}
    if base is None:
        return {**out, "judged": False, "why": _why_not(now, comparable)}
    return {**out, "judged": True, "against": base.against, "median": base.median, "mad": base.mad,
            "band": list(base.band), "worse": base.worse(value), "robust_z": base.robust_z(value),
            "runs": base.listed()}


def _why_not(now: Any, comparable: list[Any]) -> str:
    mine = [r for r in comparable if r.host == now.host]
    loads = [load_of(r) for r in mine]
    return (f"fewer than {MIN_RUNS} comparable quiet runs before it (this host: {len(mine)} comparable, "
            f"{loads.count('quiet')} quiet, {loads.count('busy')} busy, {loads.count('unknown')} of unknown load)")


def _judgement_text(now: Any, figure: str, base: Baseline | None, comparable: list[Any]) -> str:
    value = now.figures[figure]
    unit = "s" if figure.startswith(STEP_TIME) else "GB/s"
    head = f"The newest run ({_when(now.time)}, job {now.job or '-'}, {value:.4g} {unit})"
    if base is None:
        return f"{head} was not judged by DDP409: {_why_not(now, comparable)}."
    low, high = base.band
    whose = "this host's" if base.against == "host" else f"{now.instance_type}'s (any host)"
    verdict = "within it (or better): no finding"
    if base.worse(value):
        verdict = "outside it: DDP409" + (", info: a host of the job was busy" if load_of(now) == "busy" else "")
    lines = [f"{head} against {whose} {len(base.runs)} comparable quiet runs: median {base.median:.4g} {unit}, "
             f"MAD {base.mad:.4g} {unit}, band {low:.4g}-{high:.4g} {unit}; {verdict}",
             "compared with:"]
    rows = [["when", "job", "kind", "script", "host", "load", label(figure, [now, *base.runs])]]
    for r in reversed(base.runs):
        rows.append([_when(r.time), str(r.job or "-"), r.kind, str(r.script or "-"), r.host, load_of(r),
                     f"{r.figures[figure]:.4g}"])
    return "\n".join([*lines, *_grid(rows)])


def _plot(recs: list[Any], figures: list[str], out: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot needs matplotlib: pip install 'ddp-doctor[plot]'"
    fig, axes = plt.subplots(len(figures), 1, figsize=(8, 2.5 * len(figures)), squeeze=False)
    for ax, name in zip(axes[:, 0], figures):
        points = [(i, r.figures[name]) for i, r in enumerate(recs) if name in r.figures]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o")
            ordered = sorted(ys)
            ax.axhspan(ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4], alpha=0.2, label="middle half")
            held = [r for r in recs if name in r.figures]
            # where DDP409 warns for a next run: the band of these runs' quiet ones (the newest 20)
            base = baseline(held[-1], held, name) if name.startswith(BANDWIDTH + STEP_TIME) and held else None
            if base is not None:
                ax.axhline(base.median, linestyle="--", linewidth=1, label="median (quiet runs)")
                bound = base.band[0] if base.higher_is_better else base.band[1]
                ax.axhline(bound, linestyle=":", linewidth=1, color="red", label="DDP409 (outside the band)")
            else:
                ax.axhline(ordered[len(ordered) // 2], linestyle="--", linewidth=1, label="median")
            ax.legend(loc="best")
        ax.set_title(label(name, recs))
        ax.set_xlabel("run")
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as e:
        return f"--plot {out}: {e.strerror or e}"
    finally:
        plt.close(fig)
    return None
