"""The rank that makes the others wait (DDP877), from the order in which the ranks arrive at each
collective: every rank's ledger (torch's flight recorder, training/run/ledger.py) holds when it
issued each collective (`time_created_ns`). DDP hides such a rank: every rank's step takes as long
as the slowest one's, so step times look equal; the arrivals do not.

Per collective that every rank of a host issued (the same process group and sequence number),
the last rank to arrive and its lag behind the next-to-last. A rank is named when it arrives last
at most collectives, in each half of the run, more often than chance would make it (a binomial
test), its median lag is above noise (10 ms, and the spread of its own lags from collective to
collective), and the others' waiting for it adds up to a stated share of the time the collectives
span: quiet on a run whose ranks only take turns being last. On a host that was busy while it
trained (its ledgers' `host_load`, checks/host_busy.py) a rank is named as info, with that doubt,
unless other processes took its own CPUs more than the other ranks'. Ranks are compared within
one host (time_created_ns is the host's wall clock). Nodes are compared with each other (DDP878:
a node whose every rank comes late, which no rank of it shows against its neighbours) on clocks
aligned by the offsets the preflight measured (DDP407), with their error added to the lag a node
must show.

Where the slow rank spends its time before it arrives: its DataLoader waits (the probes, as
DDP872 measures them) when they account for its lag, else the places its stack samples (the
watchdog's, once a second, outside collectives) found it most often.

Pure functions over the ledger records and the probe records.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks import host_busy
from ddp_doctor.checks.internal import event_finding
from ddp_doctor.checks.training_scale import median_data_times
from ddp_doctor.comm.stragglers import ALPHA, median, spread
from ddp_doctor.facts.host_load import LoadWindow
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

ARRIVES_LAST = declare(
    "DDP877", category="consistency", severity="warning", title="One rank arrives last at the collectives",
    severities=("warning", "info"), kept_in_history=True,  # its lag and the others' waited share
    doc="""
    What: One rank issued most of the training's collectives last (by each rank's flight recorder,
    compared within a host), far enough behind the others that their waiting for it is a stated
    share of the time: at least 75% of at least 10 collectives, and of each half of them (not one
    burst); more often than chance would (a binomial test at 1%, shared by the ranks: with 2 ranks
    11 of 13 is not enough, 12 of 13 is); a median lag of 10 ms or more behind the next-to-last
    rank, and above the spread of its own lags from collective to collective (1.4826 x MAD: a
    rank held back by its own work is late by about the same each time); and the others' wait for
    it at least 10% of the span the collectives cover. The finding gives the rank, how often it
    came last, its median and p90 lag, the share of time the others waited, and where it spent
    its time before arriving: waiting for its
    DataLoader, or the place its stack was sampled at most, with the share of its samples in the
    backward, a forward, the optimizer, its DataLoader or elsewhere in the script.
    Why: DDP synchronises every step, so the whole job runs at the slowest rank's pace, and every
    rank's step time shows the same number: a throttled or shared GPU, a rank-dependent branch, a
    slower data shard or storage path on one rank costs every rank's time without an error.
    Fix: Go to the place named: a data wait points at that rank's data path (storage, num_workers,
    its shard; see DDP872); compute points at its device (clocks, temperature, another process on
    it: nvidia-smi on that host) or a branch only it takes at the line named.
    Severity: warning; info when the host was busy while the ranks trained (other processes used
    a quarter of its cores, the hypervisor stole 10% of its time, or its load average was above
    its cores): on a busy host who arrives last is the scheduler's doing as much as the rank's.
    Still a warning, saying the host was busy, when the rank stands far above that noise (last at
    90% of 30 collectives or more, its median lag 6x its own spread or more), or when other
    processes took the slow rank's own CPUs markedly more than the others' (that is said).
    """, cause_class="host", action="investigate")

ARRIVES_LAST_NODE = declare(
    "DDP878", category="consistency", severity="warning", title="One node arrives last at the collectives",
    severities=("warning", "info"),
    doc="""
    What: Every rank of one node issued most of the training's collectives after the ranks of the
    other nodes: each node's arrival is when its first rank issued the collective, on wall clocks
    aligned by the offsets the preflight measured (DDP407's barriers, with their error). Named with
    the same bounds as DDP877 (75% of at least 10 collectives, the others' wait at least 10% of the
    span), and a median lag of 10 ms plus the clocks' error. The finding gives the node and its
    ranks, how often it came last, the median and p90 lag, the error of the clock alignment, the
    share of time the other nodes waited, and where its ranks spent their time before arriving.
    Needs the preflight's clock measurement: with `--skip DDP407` (or none of it) nodes are not
    compared. Judged by the same tests as DDP877 (a binomial test, each half of the run, the lag
    above its own spread).
    Why: A node whose every rank is slow (a slower instance, throttled GPUs, a busy host, a slower
    storage mount) holds the whole job to its pace; within the node no rank stands out, so DDP877
    cannot see it, and step times are the same everywhere.
    Fix: Look at that node: nvidia-smi for clocks, temperature and other processes, its storage and
    network path, its instance type; compare its own history (`ddp-doctor history --host`); replace
    it or take it out of the job if it stays behind.
    Severity: warning; info when a host was busy while the job trained (as DDP877 reads it), unless
    the node stands far above that noise (as DDP877).
    """, cause_class="host", action="investigate")

MIN_COLLECTIVES = 10
LAST_SHARE = 0.75
WAIT_SHARE = 0.10
MIN_LAG_S = 0.010  # below, a shared host's CPU scheduling makes such lags on a correct run
# on a busy host a rank is still a warning when it stands far above the load's noise: last at
# FAR_SHARE of FAR_MIN collectives or more, its median lag FAR_NOISE x its own spread or more
FAR_SHARE, FAR_MIN, FAR_NOISE = 0.9, 30, 6.0
MIN_SAMPLES = 10  # stack samples (one a second) below which where a rank spends its time is said with a doubt


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


def _by_host(ledgers: dict[int, dict[str, Any]]
             ) -> tuple[dict[int, dict[tuple[str, int], int]], dict[str, list[int]]]:
    """(rank -> its collectives' issue times, host -> its ranks) for the ledgers of known host (a
    dump read after the fact has none: no clock to compare it with)."""
    by_host: dict[str, list[int]] = {}
    times = {}
    for r, led in ledgers.items():
        t = _times(led)
        if t and led.get("host"):
            times[r] = t
            by_host.setdefault(str(led["host"]), []).append(r)
    return times, by_host


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _where(ledger: dict[str, Any]) -> tuple[str, str, int] | None:
    """The place its samples found the rank most often: (place, count in words, total samples); places
    found as often as each other are all named (_most_often)."""
    samples = ledger.get("samples") or {}
    places = samples.get("where") or {}
    if not places:
        return None
    place, n = _most_often(places)
    return place, n, int(samples.get("total") or sum(places.values()))


def _most_often(places: dict[str, Any]) -> tuple[str, str]:
    """(the place found most often, its count in words); on a tie every place found that often
    ("A and B", "4 each"), since the samples do not tell one of them from the others."""
    n = max(int(c) for c in places.values())
    top = sorted(p for p, c in places.items() if int(c) == n)
    if len(top) == 1:
        return top[0], str(n)
    return ", ".join(top[:-1]) + " and " + top[-1], f"{n} each"


def _last_arriver(ranks: list[Any], times: dict[Any, dict[tuple[str, int], int]],
                  margin_s: float = 0.0) -> dict[str, Any] | None:
    """The figures of the one that arrives last among `ranks` (a host's ranks, or the nodes), or
    None. `margin_s`: how far the clocks compared may be off (0 within a host): the median lag
    must pass MIN_LAG_S by that much."""
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
    p = binomial_tail(last_count[slow], len(common), 1 / len(ranks))
    if p > ALPHA / len(ranks):  # chance makes a rank last that often among len(ranks) taking turns
        return None
    # each half of the run in time order: a burst in one part of it is not a rank that holds the job
    order = sorted(common, key=lambda k: min(times[r][k] for r in ranks))
    for half in (order[:len(order) // 2], order[len(order) // 2:]):
        if sum(1 for k in half if max(ranks, key=lambda r: times[r][k]) == slow) < LAST_SHARE * len(half):
            return None
    mid, p90 = _quantile(lags[slow], 0.5), _quantile(lags[slow], 0.9)
    # how much its lag moves from one collective to the next: a rank held back by its own work is
    # late by about the same each time; lags that move by more than their median are no steady delay
    noise = spread(lags[slow])
    if mid < MIN_LAG_S + margin_s or median(lags[slow]) <= noise or waited[slow] / span < WAIT_SHARE:
        return None
    return {"rank": slow, "last": last_count[slow], "compared": len(common), "median_lag_s": mid,
            "p90_lag_s": p90, "waited_s": waited[slow], "span_s": span, "ranks": ranks, "p": p, "noise_s": noise}


def binomial_tail(k: int, n: int, q: float) -> float:
    """P(X >= k) for X ~ Binomial(n, q)."""
    from math import comb
    return sum(comb(n, i) * q ** i * (1 - q) ** (n - i) for i in range(max(0, k), n + 1))


def lags_behind_first(ledgers: dict[int, dict[str, Any]], offsets: dict[int, tuple[float, float]] | None = None
                      ) -> dict[int, dict[tuple[str, int], float]]:
    """rank -> (process group, sequence number) -> seconds after the first rank issued that
    collective (for the trace): the first of the job on clocks aligned by `offsets` when they
    place every host (DDP878's clocks), else the first of its own host; collectives only some of
    the ranks compared issued are left out."""
    times, by_host = _by_host(ledgers)
    clocks = _host_clocks(by_host, offsets or {}) if len(by_host) >= 2 else None
    if clocks is not None:  # one group of the whole job, each host's clock moved onto rank 0's
        shift = {r: int(clocks[h][0] * 1e9) for h, rs in by_host.items() for r in rs}
        times = {r: {k: t - shift[r] for k, t in ts.items()} for r, ts in times.items()}
        by_host = {"job": sorted(times)}
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


SUMMARY_RANKS = 64  # ranks listed in measurements.arrivals; beyond, the latest arrivers (and a count)


def arrival_summary(ledgers: dict[int, dict[str, Any]], offsets: dict[int, tuple[float, float]] | None = None
                    ) -> dict[str, Any]:
    """measurements.arrivals of a run's report: per rank, how long after the first rank it issued
    the collectives (median, p90, max over those compared), on the clocks lags_behind_first uses
    (said in "clocks", with their error when aligned across hosts); {} when no two ranks compare.
    Beyond SUMMARY_RANKS ranks, the ones with the largest median lag are listed."""
    lags = lags_behind_first(ledgers, offsets)
    if not lags:
        return {}
    rows = {}
    for r, by_key in lags.items():
        vals = sorted(by_key.values())
        rows[r] = {"compared": len(vals), "median_ms": round(_quantile(vals, 0.5) * 1000, 3),
                   "p90_ms": round(_quantile(vals, 0.9) * 1000, 3), "max_ms": round(vals[-1] * 1000, 3)}
    hosts = {str(led["host"]) for led in ledgers.values() if led.get("host")}
    _, by_host = _by_host(ledgers)
    clocks = _host_clocks(by_host, offsets or {}) if len(hosts) >= 2 else None
    shown = sorted(rows, key=lambda r: (-rows[r]["median_ms"], r))[:SUMMARY_RANKS]
    out: dict[str, Any] = {
        "clocks": "one host" if len(hosts) < 2 else "aligned across hosts" if clocks else "each host's own",
        "ranks": {str(r): rows[r] for r in sorted(shown)}}
    if clocks:
        out["clock_error_ms"] = round(2000 * max(u for _, u in clocks.values()), 3)
    if len(rows) > len(shown):
        out["ranks_left_out"] = len(rows) - len(shown)
    return out


def arrival_findings(ledgers: dict[int, dict[str, Any]], probe_ranks: dict[int, dict[str, Any]] | None = None
                     ) -> list[Finding]:
    """DDP877 for each host whose ranks wait for one of them (see the module's doc)."""
    times, by_host = _by_host(ledgers)
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
        severity, load_said, load = _load_of(ranks, ledgers, got)
        out.append(event_finding(
            ARRIVES_LAST, f"rank {r} arrived last at {got['last']} of {got['compared']} collectives, a median "
            f"{got['median_lag_s'] * 1000:.1f} ms (p90 {got['p90_lag_s'] * 1000:.1f} ms) after the next rank: the "
            f"other ranks{' of ' + host if len(by_host) > 1 else ''} waited for it {got['waited_s']:.2f} s "
            f"of the {got['span_s']:.2f} s the collectives span ({got['waited_s'] / got['span_s']:.0%}); {doing}"
            f"{load_said}", rank=r, phase="training", severity=severity,
            evidence={"last": got["last"], "compared": got["compared"], "median_lag_s": round(got["median_lag_s"], 6),
                      "p90_lag_s": round(got["p90_lag_s"], 6), "waited_s": round(got["waited_s"], 6),
                      "span_s": round(got["span_s"], 6), "ranks_compared": got["ranks"], "host": host,
                      "p": round(got["p"], 6), "noise_s": round(got["noise_s"], 6), **load,
                      **({"median_data_s": {str(k): round(v, 6) for k, v in data.items()}} if data else {}),
                      **({"samples": ledgers[r]["samples"]} if ledgers[r].get("samples") else {})}))
    return out


def _far(got: dict[str, Any]) -> bool:
    """The one arriving last stands far above a busy host's noise (FAR_SHARE, FAR_MIN, FAR_NOISE)."""
    return (got["compared"] >= FAR_MIN and got["last"] >= FAR_SHARE * got["compared"]
            and got["median_lag_s"] >= FAR_NOISE * got["noise_s"])


def _load_of(ranks: list[int], ledgers: dict[int, dict[str, Any]], got: dict[str, Any]
             ) -> tuple[str | None, str, dict[str, Any]]:
    """(severity override, words, evidence) from how busy the ranks' host was while they trained."""
    slow = got["rank"]
    windows = {r: w for r in ranks if (w := LoadWindow.from_dict(ledgers[r].get("host_load"))) is not None}
    if not windows:
        return None, "", {}
    load = host_busy.read(windows, {r: 0 for r in windows})
    if load.shared(slow):
        rest = median([v for r, v in load.others.items() if r != slow])
        return None, (f"; other processes used {load.others[slow]:.2f} cores of its CPUs while it trained (the "
                      f"other ranks' CPUs: {rest:.2f})"), load.evidence()
    if load.busy and _far(got):
        return None, (f"; the host was busy while it trained ({load.describe()}), but it came last steadily, far "
                      f"beyond what the load's noise does"), load.evidence()
    if load.busy:
        return "info", (f"; the host was busy while it trained ({load.describe()}): who arrives last on a busy "
                        f"host is the scheduler's doing as much as the rank's"), load.evidence()
    return None, "", load.evidence()


def clock_offsets_of(measurements: dict[str, Any] | None) -> dict[int, tuple[float, float]]:
    """rank -> (its wall clock minus rank 0's, the uncertainty), in seconds, as the preflight
    measured them (DDP407: measurements.clock_offset_s / clock_uncertainty_s); {} when it did not."""
    m = measurements or {}
    offsets, unc = m.get("clock_offset_s") or {}, m.get("clock_uncertainty_s") or {}
    out = {}
    for r, o in offsets.items() if isinstance(offsets, dict) and isinstance(unc, dict) else ():
        try:
            out[int(r)] = (float(o), float(unc[r]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _host_clocks(by_host: dict[str, list[int]], offsets: dict[int, tuple[float, float]]
                 ) -> dict[str, tuple[float, float]] | None:
    """host -> (offset, uncertainty) of its clock from the best-measured of its ranks; None when a
    host has no measured rank (its collectives cannot be placed beside the others')."""
    out = {}
    for host, ranks in by_host.items():
        known = [offsets[r] for r in ranks if r in offsets]
        if not known:
            return None
        out[host] = min(known, key=lambda ou: ou[1])
    return out


def node_arrival_findings(ledgers: dict[int, dict[str, Any]], offsets: dict[int, tuple[float, float]],
                          probe_ranks: dict[int, dict[str, Any]] | None = None) -> list[Finding]:
    """DDP878 when one node arrives last (see its doc): each node's arrival at a collective is
    when its first rank issued it, on clocks aligned by the preflight's offsets. Quiet with one
    host, or when a host's clock offset was not measured."""
    times, by_host = _by_host(ledgers)
    clocks = _host_clocks(by_host, offsets) if len(by_host) >= 2 else None
    if clocks is None:
        return []
    common = set.intersection(*(set(t) for t in times.values()))  # the collectives every rank issued
    node_times = {host: {k: min(times[r][k] for r in ranks) - int(clocks[host][0] * 1e9) for k in common}
                  for host, ranks in by_host.items()}
    margin = 2 * max(u for _, u in clocks.values())
    got = _last_arriver(sorted(by_host), node_times, margin_s=margin)
    if got is None:
        return []
    host = got["rank"]
    mine = sorted(by_host[host])
    others = sorted(r for h, rs in by_host.items() if h != host for r in rs)
    doing = _doing_node(mine, others, got["median_lag_s"], median_data_times(probe_ranks or {}), ledgers)
    load = host_busy.of_ledgers(ledgers)
    severity, load_said = None, ""
    if load is not None and load.busy and not _far(got):
        severity, load_said = "info", (f"; a host was busy while it trained ({load.describe()}): who arrives last "
                                       f"on a busy host is the scheduler's doing as much as the node's")
    return [event_finding(
        ARRIVES_LAST_NODE, f"node {host} (rank{'s' if len(mine) > 1 else ''} {format_ranks(mine)}) arrived last at "
        f"{got['last']} of {got['compared']} collectives, a median {got['median_lag_s'] * 1000:.1f} ms (p90 "
        f"{got['p90_lag_s'] * 1000:.1f} ms) after the next node, on clocks aligned by the preflight's offsets "
        f"(+/- {margin * 1000:.1f} ms): the other nodes waited for it {got['waited_s']:.2f} s of the "
        f"{got['span_s']:.2f} s the collectives span ({got['waited_s'] / got['span_s']:.0%}); {doing}{load_said}",
        rank=None, ranks=mine, phase="training", severity=severity,
        evidence={"host": host, "last": got["last"], "compared": got["compared"],
                  "median_lag_s": round(got["median_lag_s"], 6), "p90_lag_s": round(got["p90_lag_s"], 6),
                  "waited_s": round(got["waited_s"], 6), "span_s": round(got["span_s"], 6),
                  "hosts_compared": sorted(by_host), "clock_offset_s": {h: round(o, 6) for h, (o, _) in clocks.items()},
                  "clock_error_s": round(margin, 6)})]


def _doing_node(mine: list[int], others: list[int], lag: float, data: dict[int, float],
                ledgers: dict[int, dict[str, Any]]) -> str:
    """Where a slow node's ranks spent their time before arriving, in words."""
    ours = [data[r] for r in mine if r in data]
    theirs = [data[r] for r in others if r in data]
    if ours and theirs and median(ours) - median(theirs) >= 0.5 * lag:
        return (f"before arriving its ranks wait for their data: {median(ours) * 1000:.1f} ms per training "
                f"batch from their DataLoaders (median), the other nodes' {median(theirs) * 1000:.1f} ms")
    places: dict[str, int] = {}
    doing: dict[str, int] = {}
    for r in mine:
        samples = ledgers[r].get("samples") or {}
        for place, n in (samples.get("where") or {}).items():
            places[place] = places.get(place, 0) + int(n)
        for what, n in (samples.get("doing") or {}).items():
            doing[what] = doing.get(what, 0) + int(n)
    if places:
        place, n = _most_often(places)
        total = sum(places.values())
        few = ", too few to be sure" if total < MIN_SAMPLES else ""
        return (f"before arriving its ranks work at {place} ({n} of their "
                f"{total} stack samples outside a collective{few}{_activities(doing)}): the same work is slower "
                "there (GPU clocks, temperature, another process, a slower storage path)")
    return "where its ranks spend that time is unknown (no stack sample outside a collective, no DataLoader measured)"


ACTIVITY_WORDS = {"backward": "in the backward", "forward": "in a forward", "data": "in its DataLoader",
                  "optimizer": "in the optimizer", "script": "elsewhere in the script"}


def _activities(doing: Any) -> str:
    """"; 80% in the backward, 20% elsewhere in the script" from the samples' activities
    (training/run/watchdog.activity), "" when none were counted."""
    if not isinstance(doing, dict):
        return ""
    counts = {k: int(v) for k, v in doing.items() if isinstance(v, (int, float)) and v > 0}
    total = sum(counts.values())
    if not total:
        return ""
    parts = [f"{n / total:.0%} {ACTIVITY_WORDS.get(k, k)}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "; " + ", ".join(parts)


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
        few = ", too few to be sure" if total < MIN_SAMPLES else ""
        return (f"before arriving it works at {place} ({n} of its {total} "
                f"stack samples outside a collective{few}"
                + _activities((ledger.get("samples") or {}).get("doing"))
                + (f"; its data waits, {mine * 1000:.1f} ms per batch, do not explain the lag)" if mine is not None
                   else ")"))
    return "where it spends that time is unknown (no stack sample outside a collective, no DataLoader measured)"
