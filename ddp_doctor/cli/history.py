"""`ddp-doctor history`: the runs the local history holds (ddp_doctor/history/store.py), for a host
or an instance type, as a table (a figure per column), as JSON, or as a plot of each figure per
run. Exit status: 0, 2 for a usage error (no such history file, a path that is not a regular file,
a figure it never held), 1 for a file that is no history that can be read (corrupted, truncated,
another file, locked): one line naming it and what to do. Rows that are not records are skipped
and counted, in a line on stderr (and `skipped_rows` in --json)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ddp_doctor.checks.history_rules import BANDWIDTH, DROP, STEP_TIME
from ddp_doctor.cli.options import UsageError

HELP = "the runs the local history holds, for a host or an instance type (table, --json, --plot)"
DEFAULT_FIGURES = ("stage_seconds.total",)


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history", metavar="PATH", default=None,
                   help="the history file (default: $DDP_DOCTOR_HISTORY, else ~/.cache/ddp-doctor/history.sqlite)")
    p.add_argument("--host", default=None, help="only this host's records")
    p.add_argument("--instance-type", default=None, help="only records of this instance type")
    p.add_argument("--figure", action="append", metavar="NAME",
                   help="a figure to show (repeatable; default: the largest all_reduce's busbw, the newest "
                        "run's step time and the preflight's total time); `--figure list` lists those the "
                        "records hold")
    p.add_argument("--last", type=int, default=20, metavar="N", help="the newest N records (default: 20)")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.add_argument("--plot", metavar="PATH.png", default=None,
                   help="plot each figure per run (needs matplotlib: pip install 'ddp-doctor[plot]')")


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
    from ddp_doctor.history.opened import open_history
    from ddp_doctor.history.store import History, HistoryUnreadable, default_path
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
    if skipped:
        sys.stderr.write(f"ddp-doctor history: {skipped} unreadable row(s) skipped in {path}\n")
    held = sorted({name for r in recs for name in r.figures})
    if args.figure == ["list"]:
        print("\n".join(held))
        return 0
    figures = args.figure or [f for f in [*_largest_busbw(recs), *_step_time(recs), *DEFAULT_FIGURES] if f in held]
    unknown = [f for f in args.figure or [] if f not in held and recs]
    if unknown:
        raise UsageError(f"no record holds {', '.join(unknown)} (`--figure list` lists the figures)")
    if args.json:
        json.dump({"history": path, "records": [r.to_dict() for r in recs], "skipped_rows": skipped}, sys.stdout,
                  indent=2)
        sys.stdout.write("\n")
    else:
        print(_table(recs, figures, path))
    if args.plot:
        err = _plot(recs, figures, args.plot)
        if err:
            raise UsageError(err)
    return 0


def _table(recs: list[Any], figures: list[str], path: str) -> str:
    head = ["time", "kind", "host", "layout", "torch", "nccl", "status", *figures]
    rows = [head]
    for r in recs:
        layout = f"{r.nnodes or '?'}x{r.nproc_per_node or '?'} {r.backend or ''}".strip()
        rows.append([time.strftime("%Y-%m-%d %H:%M", time.localtime(r.time)), r.kind, r.host, layout,
                     str(r.versions.get("torch") or "-"), str(r.versions.get("nccl") or "-"), str(r.status or "-"),
                     *(f"{r.figures[f]:.4g}" if f in r.figures else "-" for f in figures)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([f"{len(recs)} record(s) of {path}", *lines])


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
            median = ordered[len(ordered) // 2]
            ax.axhspan(ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4], alpha=0.2, label="middle half")
            ax.axhline(median, linestyle="--", linewidth=1, label="median")
            if name.startswith(BANDWIDTH + STEP_TIME):  # where DDP409 warns
                bound = median / (1 - DROP) if name.startswith(STEP_TIME) else median * (1 - DROP)
                ax.axhline(bound, linestyle=":", linewidth=1, color="red", label=f"DDP409 ({DROP:.0%} slower)")
            ax.legend(loc="best")
        ax.set_title(name)
        ax.set_xlabel("run")
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as e:
        return f"--plot {out}: {e.strerror or e}"
    finally:
        plt.close(fig)
    return None
