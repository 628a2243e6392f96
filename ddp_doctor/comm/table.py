"""The nccl-tests style table of `ddp-doctor bench-comm` (TABLE_HEADER, table_row,
render_table) and its bandwidth-vs-size plot (plot; needs matplotlib).
"""
from __future__ import annotations

from typing import Any, Mapping

from ddp_doctor.comm.arithmetic import format_bytes

TABLE_HEADER = (f"{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time(us)':>11} "
                f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}")


def table_row(e: Mapping[str, Any]) -> str:
    return (f"{e['bytes']:>12} {e.get('count', e['bytes'] // 4):>12} {e.get('type', 'float'):>6} "
            f"{e.get('redop', 'sum'):>6} {e['time_us']:>11.1f} {e['algbw_gbps']:>12.3f} "
            f"{e['busbw_gbps']:>12.3f} {e.get('wrong', 0 if e.get('correct') else 'N/A'):>7}")


def render_table(measurements: Mapping[str, Any]) -> str:
    """The all_reduce sweeps of a report as nccl-tests prints them, one block per group."""
    lines = []
    for name, title in (("all_reduce", "all_reduce, all ranks"), ("all_reduce_intra", "all_reduce, intra-node"),
                        ("all_reduce_inter", "all_reduce, inter-node")):
        entries = measurements.get(name) or []
        if not entries:
            continue
        n = entries[0].get("nranks", "?")
        lines.append(f"# {title} ({n} ranks per group)")
        lines.append(TABLE_HEADER)
        lines += [table_row(e) for e in entries]
        big = max(entries, key=lambda e: e["bytes"])
        wrong = sum(int(e.get("wrong", 0) or 0) for e in entries)
        lines.append(f"# busbw at {format_bytes(big['bytes'])}: {big['busbw_gbps']:.3f} GB/s; "
                     f"out of bounds values: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    return "\n".join(lines)


def plot(measurements: Mapping[str, Any], path: str, title: str = "ddp-doctor bench-comm") -> None:
    """A bandwidth-vs-size PNG (log-scale x and y): busbw and algbw for each all_reduce sweep."""
    fig = figure(measurements, title)  # says how to get matplotlib when it is missing
    import matplotlib.pyplot as plt
    fig.savefig(path)
    plt.close(fig)


def figure(measurements: Mapping[str, Any], title: str = "ddp-doctor bench-comm") -> Any:
    """The plot's matplotlib figure (the caller saves and closes it)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'ddp-doctor[plot]' "
                           "(or pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    drawn = False
    for name, label in (("all_reduce", "all ranks"), ("all_reduce_intra", "intra-node"),
                        ("all_reduce_inter", "inter-node")):
        entries = measurements.get(name) or []
        if not entries:
            continue
        xs = [e["bytes"] for e in entries]
        line, = ax.plot(xs, [e["busbw_gbps"] for e in entries], marker="o", label=f"busbw, {label}")
        # drawn over busbw, hollow: with 2 ranks the two are equal (busbw = algbw x 2(n-1)/n) and
        # a line drawn under the other would vanish
        ax.plot(xs, [e["algbw_gbps"] for e in entries], marker="s", markerfacecolor="none", linestyle="--",
                color=line.get_color(), zorder=3, label=f"algbw, {label}")
        bad = [e for e in entries if not e.get("correct", True)]
        if bad:
            ax.scatter([e["bytes"] for e in bad], [e["busbw_gbps"] for e in bad], marker="x", color="red",
                       s=80, zorder=5, label="wrong result")
        drawn = True
    if not drawn:
        plt.close(fig)
        raise RuntimeError("the report has no all_reduce measurements to plot")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", nonpositive="mask")  # small messages run at a tiny share of the large ones' bandwidth
    ticks = [e["bytes"] for e in (measurements.get("all_reduce") or measurements.get("all_reduce_intra")
                                   or measurements.get("all_reduce_inter") or [])]
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_bytes(b).replace(" ", "") for b in ticks], rotation=45, ha="right")
    ax.minorticks_off()
    ax.set_xlabel("message size")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig
