"""The rank that makes the others wait (DDP877), from the order in which the ranks arrive at each
collective: every rank's ledger (torch's flight recorder, training/run/ledger.py) holds when it
issued each collective (`time_created_ns`). DDP hides such a rank: every rank's step takes as long
as the slowest one's, so step times look equal; the arrivals do not.

Per collective that every rank of a host issued (the same process group and sequence number),
the last rank to arrive and its lag behind the next-to-last. A rank is named when it arrives last
at most collectives, its median lag is above noise, and the others' waiting for it adds up to a
stated share of the time the collectives span: quiet on a run whose ranks only take turns being
last (a loaded host). Clocks are compared within one host only (time_created_ns is the host's
wall clock); ranks of other hosts are judged among their own host's ranks.

Where the slow rank spends its time before it arrives: its DataLoader waits (the probes, as
DDP872 measures them) when they account for its lag, else the places its stack samples (the
watchdog's, once a second, outside collectives) found it most often.

Pure functions over the ledger records and the probe records.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.checks.training_scale import median_data_times
from ddp_doctor.findings import Finding
from ddp_doctor.registry import declare

ARRIVES_LAST = declare(
    "DDP877", category="consistency", severity="warning", title="One rank arrives last at the collectives",
    doc="""
    What: One rank issued most of the training's collectives last (by each rank's flight recorder,
    compared within a host), far enough behind the others that their waiting for it is a stated
    share of the time: at least 75% of the collectives, a median lag of 10 ms or more behind the
    next-to-last rank, and the others' wait for it at least 10% of the span the collectives
    cover. The finding gives the rank, how often it came last, its median and p90 lag, the share
    of time the others waited, and where it spent its time before arriving: waiting for its
    DataLoader, or the places its stack was sampled at most.
    Why: DDP synchronises every step, so the whole job runs at the slowest rank's pace, and every
    rank's step time shows the same number: a throttled or shared GPU, a rank-dependent branch, a
    slower data shard or storage path on one rank costs every rank's time without an error.
    Fix: Go to the place named: a data wait points at that rank's data path (storage, num_workers,
    its shard; see DDP872); compute points at its device (clocks, temperature, another process on
    it: nvidia-smi on that host) or a branch only it takes at the line named.
    """)

MIN_COLLECTIVES = 10
LAST_SHARE = 0.75
WAIT_SHARE = 0.10
MIN_LAG_S = 0.010  # below, a shared host's CPU scheduling makes such lags on a correct run


def collective_key(entry: Any) -> tuple[str, int] | None:
    """A collective's identity across ranks: its process group and sequence number."""
    if entry.get("is_p2p") or entry.get("time_created_ns") in (None, 0):
        return None
    pg = entry.get("process_group")
    group = str(pg[1] if isinstance(pg, (list, tuple)) and len(pg) > 1 else entry.get("pg_id"))
    try:
        return group, int(entry.get("collective_seq_id"))
    except (TypeError, ValueError):
        return None


def _times(ledger: dict[str, Any]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for e in ledger.get("entries") or []:
        if isinstance(e, dict) and (k := collective_key(e)) is not None:
            out.setdefault(k, int(e["time_created_ns"]))
    return out


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _where(ledger: dict[str, Any]) -> tuple[str, int, int] | None:
    """The place its samples found the rank most often: (place, count, total samples)."""
    samples = ledger.get("samples") or {}
    places = samples.get("where") or {}
    if not places:
        return None
    place = max(places, key=lambda p: places[p])
    return place, int(places[place]), int(samples.get("total") or sum(places.values()))


def _last_arriver(ranks: list[int], times: dict[int, dict[tuple[str, int], int]]) -> dict[str, Any] | None:
    """The figures of the rank that arrives last, among `ranks` (one host), or None."""
    common = set.intersection(*(set(times[r]) for r in ranks))
    if len(common) < MIN_COLLECTIVES:
        return None
    last_count = {r: 0 for r in ranks}
    lags: dict[int, list[float]] = {r: [] for r in ranks}
    waited = {r: 0.0 for r in ranks}  # seconds the others waited for r, on average per other rank
    for k in common:
        at = sorted((times[r][k], r) for r in ranks)
        t_last, last = at[-1]
        last_count[last] += 1
        lags[last].append((t_last - at[-2][0]) / 1e9)
        waited[last] += sum(t_last - t for t, _ in at[:-1]) / (len(at) - 1) / 1e9
    span = (max(times[r][k] for r in ranks for k in common) - min(times[r][k] for r in ranks for k in common)) / 1e9
    slow = max(ranks, key=lambda r: last_count[r])
    share = last_count[slow] / len(common)
    if share < LAST_SHARE or span <= 0 or not lags[slow]:
        return None
    median, p90 = _quantile(lags[slow], 0.5), _quantile(lags[slow], 0.9)
    if median < MIN_LAG_S or waited[slow] / span < WAIT_SHARE:
        return None
    return {"rank": slow, "last": last_count[slow], "compared": len(common), "median_lag_s": median,
            "p90_lag_s": p90, "waited_s": waited[slow], "span_s": span, "ranks": ranks}


def lags_behind_first(ledgers: dict[int, dict[str, Any]]) -> dict[int, dict[tuple[str, int], float]]:
    """rank -> (process group, sequence number) -> seconds after the first rank of its host issued
    that collective (for the trace); collectives only some of a host's ranks issued are left out."""
    by_host: dict[str, list[int]] = {}
    times = {}
    for r, led in ledgers.items():
        t = _times(led)
        if t and led.get("host"):
            times[r] = t
            by_host.setdefault(str(led["host"]), []).append(r)
    out: dict[int, dict[tuple[str, int], float]] = {}
    for ranks in by_host.values():
        if len(ranks) < 2:
            continue
        common = set.intersection(*(set(times[r]) for r in ranks))
        for k in common:
            first = min(times[r][k] for r in ranks)
            for r in ranks:
                out.setdefault(r, {})[k] = (times[r][k] - first) / 1e9
    return out


def arrival_findings(ledgers: dict[int, dict[str, Any]], probe_ranks: dict[int, dict[str, Any]] | None = None
                     ) -> list[Finding]:
    """DDP877 for each host whose ranks wait for one of them (see the module's doc)."""
    by_host: dict[str, list[int]] = {}
    times = {}
    for r, led in ledgers.items():
        t = _times(led)
        if t and led.get("host"):  # a ledger of unknown host (a dump read after the fact): no clock to compare with
            times[r] = t
            by_host.setdefault(str(led["host"]), []).append(r)
    data = median_data_times(probe_ranks or {})
    out = []
    for host, ranks in sorted(by_host.items()):
        if len(ranks) < 2:
            continue
        got = _last_arriver(sorted(ranks), times)
        if got is None:
            continue
        r = got["rank"]
        others = sorted(x for x in got["ranks"] if x != r)
        doing = _doing(r, others, got["median_lag_s"], data, ledgers[r])
        out.append(event_finding(
            ARRIVES_LAST, f"rank {r} arrived last at {got['last']} of {got['compared']} collectives, a median "
            f"{got['median_lag_s'] * 1000:.1f} ms (p90 {got['p90_lag_s'] * 1000:.1f} ms) after the next rank: the "
            f"other ranks{' of ' + host if len(by_host) > 1 else ''} waited for it {got['waited_s']:.2f} s "
            f"of the {got['span_s']:.2f} s the collectives span ({got['waited_s'] / got['span_s']:.0%}); {doing}",
            rank=r, phase="training",
            evidence={"last": got["last"], "compared": got["compared"], "median_lag_s": round(got["median_lag_s"], 6),
                      "p90_lag_s": round(got["p90_lag_s"], 6), "waited_s": round(got["waited_s"], 6),
                      "span_s": round(got["span_s"], 6), "ranks_compared": got["ranks"], "host": host,
                      **({"median_data_s": {str(k): round(v, 6) for k, v in data.items()}} if data else {}),
                      **({"samples": ledgers[r]["samples"]} if ledgers[r].get("samples") else {})}))
    return out


def _doing(rank: int, others: list[int], lag: float, data: dict[int, float], ledger: dict[str, Any]) -> str:
    """Where the slow rank spent its time before arriving, in words."""
    mine = data.get(rank)
    theirs = sorted(data[o] for o in others if o in data)
    if mine is not None and theirs:
        extra = mine - theirs[len(theirs) // 2]
        if extra >= 0.5 * lag:
            return (f"before arriving it waits for its data: {mine * 1000:.1f} ms per training batch from its "
                    f"DataLoader, the others {theirs[len(theirs) // 2] * 1000:.1f} ms (median)")
    where = _where(ledger)
    if where is not None:
        place, n, total = where
        return (f"before arriving it works at {place} ({n} of its {total} stack samples outside a collective"
                + (f"; its data waits, {mine * 1000:.1f} ms per batch, do not explain the lag)" if mine is not None
                   else ")"))
    return "where it spends that time is unknown (no stack sample outside a collective, no DataLoader measured)"
