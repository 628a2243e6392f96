"""The ranks' timelines as a Chrome trace (the trace event format read by ui.perfetto.dev and
chrome://tracing), from records already made: pure functions, records in, trace dict out.

    records (per rank)                           trace
    preflight timeline (stages, checks)   ->     pid = rank, named "rank N (host)"
    heartbeat step times, probe events,          tid = a track of that rank: preflight, script,
    outcome, ledger of collectives, findings     steps, collectives <process group>

A record is {"name", "cat", "track", "start", "end"} (a span, "X" event) or {"name", "cat",
"track", "time"} (an instant, "i" event), times in Unix seconds, with optional "args". Times
become microseconds since the earliest record (its Unix time is `otherData.origin_unix_s`).
Writing the trace is a sink's job (sinks.write_trace_file).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ddp_doctor.version import __version__

# Tracks of a rank, in the order they are shown; each process group's collectives get a track
# of their own after these.
TRACKS = ("preflight", "script", "steps")
COLLECTIVES = "collectives"
STALL_MIN_S = 2.0  # a heartbeat this long without progress is drawn as a stall


def span(name: str, start: float, end: float, *, cat: str, track: str,
         args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "cat": cat, "track": track, "start": float(start), "end": max(float(start), float(end)),
            **({"args": args} if args else {})}


def instant(name: str, time: float, *, cat: str, track: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "cat": cat, "track": track, "time": float(time), **({"args": args} if args else {})}


# ---------------------------------------------------------------- records from what the ranks left

QUIET_CHECK_S = 0.001  # a check that found nothing in less time gets no slice of its own


def _quiet(t: Mapping[str, Any], start: float, end: float) -> bool:
    return t.get("cat") == "check" and t.get("found") == 0 and end - start < QUIET_CHECK_S


def preflight_records(timeline: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A rank's preflight timeline ({"name", "cat": "stage" | "check", "start", "end"}, from
    RankPreflight) on its preflight track; a check is named by its ID and title. Consecutive checks
    that found nothing in under a millisecond (most of them do not apply on this host: SageMaker's
    on a laptop) share one slice, "N checks, nothing found", with their IDs in its args."""
    out: list[dict[str, Any]] = []
    quiet: list[tuple[Mapping[str, Any], float, float]] = []

    def fold() -> None:
        if len(quiet) > 1:
            ids = [str(q[0].get("name")) for q in quiet]
            out.append(span(f"{len(ids)} checks, nothing found", quiet[0][1], quiet[-1][2], cat="preflight.check",
                            track="preflight", args={"checks": ids, "seconds": round(quiet[-1][2] - quiet[0][1], 6)}))
        elif quiet:
            one(*quiet[0])
        quiet.clear()

    def one(t: Mapping[str, Any], start: float, end: float) -> None:
        cat = str(t.get("cat") or "stage")
        name = str(t.get("name"))
        if cat == "check" and t.get("title"):
            name = f"{name} {t['title']}"
        args: dict[str, Any] = {"seconds": round(end - start, 6)}
        if t.get("category"):
            args["category"] = t["category"]
        out.append(span(name, start, end, cat=f"preflight.{cat}", track="preflight", args=args))

    for t in timeline:
        try:
            start, end = float(t["start"]), float(t["end"])
        except (KeyError, TypeError, ValueError):
            continue
        if _quiet(t, start, end):
            quiet.append((t, start, end))
            continue
        fold()
        one(t, start, end)
    fold()
    return out


def step_records(heartbeat: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Optimizer steps from a heartbeat's bounded list of step end times (`step_times`, the most
    recent ones): each step from the previous step's end to its own."""
    if not heartbeat:
        return []
    times = [float(t) for t in heartbeat.get("step_times") or []]
    steps = int(heartbeat.get("steps") or len(times))
    first = steps - len(times) + 1
    out = []
    for i, t in enumerate(times):
        n = first + i
        if i == 0:
            out.append(instant(f"step {n} end", t, cat="step", track="steps"))
        else:
            out.append(span(f"step {n}", times[i - 1], t, cat="step", track="steps"))
    return out


def stall_records(heartbeat: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The time a training rank's last heartbeat saw no progress (no step, no stack change)."""
    if not heartbeat or heartbeat.get("phase") != "training":
        return []
    try:
        last, now = float(heartbeat["last_progress"]), float(heartbeat["time"])
    except (KeyError, TypeError, ValueError):
        return []
    if now - last < STALL_MIN_S:
        return []
    return [span("no progress", last, now, cat="stall", track="script",
                 args={"where": heartbeat.get("where"), "innermost": heartbeat.get("innermost"),
                       "in_collective": heartbeat.get("in_collective"), "steps": heartbeat.get("steps")})]


PROBE_EVENTS = {"init_process_group": "init_process_group", "ddp": "DDP construction",
                "destroy_process_group": "destroy_process_group", "set_device": "set_device"}


def probe_records(probe: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """What the in-training probes saw (their events carry their start time only): instants."""
    if not probe:
        return []
    out = []
    for e in probe.get("events") or []:
        kind = str(e.get("kind"))
        if kind not in PROBE_EVENTS or e.get("t") is None:
            continue
        args = {k: v for k, v in e.items() if k not in ("kind", "t") and v is not None}
        out.append(instant(PROBE_EVENTS[kind], float(e["t"]), cat="probe", track="script", args=args))
    return out


def _op(entry: Mapping[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "collective")
    return name.split(":", 1)[1] if ":" in name else name


def _pg_name(entry: Mapping[str, Any]) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[1] if len(pg) > 1 and pg[1] else pg[0])
    return str(pg or "default_pg")


def ledger_records(ledger: Mapping[str, Any] | None, *, failed_in_collective: bool = False,
                   lags: Mapping[Any, float] | None = None,
                   key: Callable[[Mapping[str, Any]], Any] | None = None) -> list[dict[str, Any]]:
    """A rank's ledger of collectives (torch's flight recorder), one track per process group.
    `lags`: key(entry) -> seconds after the first rank of its host issued it (its arrival order:
    checks/arrivals.py), shown as `arrived_after_first_ms`.
    A collective runs from its creation to its completion where the backend records it (NCCL);
    gloo records none, so it is drawn to the next collective's creation in its group, or, for the
    last one, to the ledger's dump time when it never retired (pending: where the rank waits) or
    when the rank's exception came out of a collective (`failed_in_collective`, the latest one).
    A collective whose end nothing tells is an instant."""
    if not ledger:
        return []
    dumped = float(ledger.get("time") or 0.0)
    by_pg: dict[str, list[Mapping[str, Any]]] = {}
    for e in ledger.get("entries") or []:
        if isinstance(e, Mapping) and e.get("time_created_ns"):
            by_pg.setdefault(_pg_name(e), []).append(e)
    latest = max((int(e["time_created_ns"]) for es in by_pg.values() for e in es), default=0)
    out = []
    for pg, entries in by_pg.items():
        entries.sort(key=lambda e: int(e["time_created_ns"]))
        for i, e in enumerate(entries):
            start = int(e["time_created_ns"]) / 1e9
            done = int(e.get("time_discovered_completed_ns") or 0) / 1e9
            retired = bool(e.get("retired"))
            if done:
                end, until = done, "completed"
            elif i + 1 < len(entries):
                end, until = int(entries[i + 1]["time_created_ns"]) / 1e9, "next collective created"
            elif not retired and dumped:
                end, until = dumped, "ledger dumped (never completed)"
            elif failed_in_collective and dumped and int(e["time_created_ns"]) == latest:
                end, until = dumped, "ledger dumped (the rank failed in it)"
            else:
                end, until = None, "unknown (no completion time recorded)"
            seq = e.get("collective_seq_id")
            pending = not retired
            failed = until.endswith("(the rank failed in it)")
            name = f"#{seq} {_op(e)}" + (" (pending)" if pending else " (failed)" if failed else "")
            args = {"seq_id": seq, "op": _op(e), "process_group": pg, "input_sizes": e.get("input_sizes"),
                    "input_dtypes": e.get("input_dtypes"), "retired": retired, "state": e.get("state"),
                    "drawn_until": until}
            lag = lags.get(key(e)) if lags and key is not None else None
            if lag is not None:
                args["arrived_after_first_ms"] = round(lag * 1000, 3)
            cat = "stall" if pending else "failure" if failed else "collective"
            track = f"{COLLECTIVES} {pg}"
            out.append(instant(name, start, cat=cat, track=track, args=args) if end is None
                       else span(name, start, end, cat=cat, track=track, args=args))
    return out


def outcome_records(outcome: Mapping[str, Any] | None, crash_time: float | None = None) -> list[dict[str, Any]]:
    """How the rank's script ended: an instant, marked as a failure when it raised or exited
    non-zero; a fatal signal's time (faulthandler's crash file) when one hit the rank."""
    out = []
    if outcome and outcome.get("time") is not None:
        exc = outcome.get("exception") or {}
        code = outcome.get("exit_code")
        failed = bool(exc) or bool(code) or bool(outcome.get("hung"))
        if exc:
            name = f"failed: {exc.get('type')}: {str(exc.get('message') or '')[:120]}"
        elif outcome.get("hung"):
            name = "ended: no progress"
        else:
            name = f"script ended (exit {code})"
        out.append(instant(name, float(outcome["time"]), cat="failure" if failed else "end", track="script",
                           args={"exit_code": code, **({"exception": exc.get("type")} if exc else {})}))
    if crash_time is not None:
        out.append(instant("fatal signal", crash_time, cat="failure", track="script"))
    return out


def script_records(start: float | None, end: float | None) -> list[dict[str, Any]]:
    if start is None:
        return []
    if end is None or end < start:
        return [instant("script started", start, cat="script", track="script")]
    return [span("script", start, end, cat="script", track="script")]


def finding_records(report: Mapping[str, Any] | None) -> dict[int, list[dict[str, Any]]]:
    """Error findings (the root cause first among them) as instants on the ranks they name, at the
    time they were seen."""
    out: dict[int, list[dict[str, Any]]] = {}
    if not report:
        return out
    cause = report.get("root_cause") or {}
    for f in report.get("findings") or []:
        if f.get("severity") != "error" or not f.get("time"):
            continue
        is_cause = bool(cause) and f.get("id") == cause.get("id") and f.get("message") == cause.get("message")
        label = ("root cause: " if is_cause else "") + f"{f.get('id')} {f.get('title')}"
        track = "preflight" if f.get("phase") == "preflight" else "script"
        for r in f.get("ranks") or []:
            out.setdefault(int(r), []).append(instant(
                label, float(f["time"]), cat="root_cause" if is_cause else "finding", track=track,
                args={"id": f.get("id"), "message": str(f.get("message") or "")[:500]}))
    return out


# ---------------------------------------------------------------- the trace

def _track_order(track: str) -> int:
    return TRACKS.index(track) if track in TRACKS else len(TRACKS)


def chrome_trace(lanes: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The trace: `lanes` maps a rank to {"host": str | None, "records": [record, ...]}. One
    process per rank ("rank N (host)"), one thread per track; empty lanes are still named."""
    times = [t for lane in lanes.values() for r in lane.get("records") or ()
             for t in (r.get("start"), r.get("time")) if t is not None]
    origin = min(times) if times else 0.0

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    events: list[dict[str, Any]] = []
    for rank in sorted(lanes):
        lane = lanes[rank]
        host = lane.get("host")
        records = list(lane.get("records") or ())
        label = f"rank {rank} ({host})" if host else f"rank {rank}"
        events.append({"name": "process_name", "ph": "M", "ts": 0, "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        tracks = sorted({str(r["track"]) for r in records}, key=lambda t: (_track_order(t), t))
        tids = {t: i + 1 for i, t in enumerate(tracks)}
        for t, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": rank, "tid": tid, "args": {"name": t}})
            events.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": rank, "tid": tid,
                           "args": {"sort_index": tid}})
        # Longer spans first at equal start: a viewer nests the shorter inside them.
        records.sort(key=lambda r: (r.get("start", r.get("time")), -(r.get("end", 0) - r.get("start", 0))))
        for r in records:
            ev: dict[str, Any] = {"name": r["name"], "cat": r.get("cat", ""), "pid": rank, "tid": tids[str(r["track"])]}
            if "start" in r:
                # the end rounded as the next start is: a slice never overlaps the one after it
                ts = us(r["start"])
                ev.update(ph="X", ts=ts, dur=max(0.0, round(us(r["end"]) - ts, 3)))
            else:
                ev.update(ph="i", ts=us(r["time"]), s="t")
            if r.get("args"):
                ev["args"] = r["args"]
            events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": f"ddp-doctor {__version__}", "origin_unix_s": origin}}


def validate(trace: Any) -> list[str]:
    """What makes `trace` not a Chrome trace this module would write (empty when valid): a JSON
    object with `traceEvents`, every event with name, ph, ts, pid and tid, "X" events with a
    non-negative dur, metadata events naming their process or thread."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    problems = []
    for i, e in enumerate(trace["traceEvents"]):
        missing = [k for k in ("name", "ph", "ts", "pid", "tid") if not isinstance(e, dict) or k not in e]
        if missing:
            problems.append(f"event {i}: missing {', '.join(missing)}")
            continue
        if not isinstance(e["ts"], (int, float)) or not isinstance(e["pid"], int) or not isinstance(e["tid"], int):
            problems.append(f"event {i}: ts, pid and tid must be numbers")
        if e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            problems.append(f"event {i}: a complete event needs dur >= 0")
        if e["ph"] == "M" and not (e["name"] in ("process_name", "thread_name", "process_sort_index",
                                                 "thread_sort_index") and isinstance(e.get("args"), dict)):
            problems.append(f"event {i}: unknown metadata event {e['name']!r}")
        if e["ph"] not in ("X", "i", "M"):
            problems.append(f"event {i}: phase {e['ph']!r} is not written here")
    return problems


def lanes_named(trace: Mapping[str, Any]) -> dict[int, str]:
    """pid -> process name, from a trace's metadata events."""
    return {e["pid"]: e["args"]["name"] for e in trace.get("traceEvents", [])
            if e.get("ph") == "M" and e.get("name") == "process_name"}
