"""The preflight's rendezvous and view exchange at scale, simulated: RANKS ranks as threads of a few
processes (--procs), each thread with its own client of one real TCPStore (hosted by this process,
as rank 0's process hosts it), against a baseline of the same clients doing a plain store barrier
(each adds one to a counter; the last sets a key the others wait for) in the same run.

The preflight's part runs the project's own code (preflight_ranks/bounded_rendezvous.meet and
processes/tcp_store.read_json_keys, through the same bounded store calls), in the order a preflight
does: every rank has made its view and its text as sent (view_text) before the start, as a rank
has before it checks in (the CPU time this takes a rank is printed: on a cluster each rank spends
it on its own host, at once); then every rank meets (checks in, publishes its view, waits for
all; rank 0 reads the views a chunk of ranks at a time as they come), puts its final findings; the
reporting rank (0) reads every rank's final findings, agrees the job's token and puts the verdict
with it; every other rank reads the verdict. Each view is a real rank's size (about 2 KB of
JSON). A third part, the floor, sends the rendezvous's own requests bare (the check-in, one
compare_set of the claim's token and the view; one wait; rank 0's waits for and reads of the views,
and its key) with no bound on a call and no check of an answer: what any check-in that claims a
rank and sends a view costs these clients. A simulated rank calls torch's client as a real rank
calls its prefixed store: once a request, through a thin object that puts the part's prefix on
its keys and counts its requests (_Counting).

First, one rank alone (--alone): its own CPU time in the barrier, the floor and the rendezvous
on one thread, every request answered at once (the median of thousands of turns, the rank on a
core of its own: it moves by a few percent from run to run, where the simulation's rounds spread
by tenths); what the simulation multiplies.
Figures per world size: the time for every simulated rank to connect its own client (the
harness's cost, and a real rank's at start), the wall time of each part once all are connected
(from the moment they are told to start to the last rank done: the median of --rounds rounds,
taken in turns baseline, floor, rendezvous, preflight, then the other way, ...), their ratio to
the barrier (and how far the rounds spread: the quartiles of each round's rendezvous time over
that round's barrier time), the requests the clients sent to the store (all clients, counted client-side) per
second of that part, and the peak memory (the largest process's RSS, this one hosting the store
included).

    python bench/scale.py [--ranks 256 1024 4096] [--procs 4] [--rounds 3] [--shuffle] [--alone 3000]
                          [--timeout 900]

Aim: the rendezvous at most 1.2x the plain barrier at 1,024 and 4,096 ranks.
The simulation is crude (a few processes, one GIL each, one 2-core machine): it shows the shape
and the request counts, not a real cluster's seconds. The reporting rank (0) has a process of its
own, as in a job; the other ranks share --procs more. Each process starts its ranks in rank order,
so lower ranks tend to check in first; on a cluster, nodes come in any order, and a chunk of views
is complete only once its last node has come (rank 0 then reads the chunks left at once):
--shuffle starts them in a random order.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import resource
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

# the project's code, imported once (an import statement in a part's function cost a rank 2-3 us
# of CPU a call here, measured one rank alone, which a real rank does not spend)
from ddp_doctor.preflight_ranks.bounded_rendezvous import (  # noqa: E402
    ALL_HERE,
    READ_CHUNK,
    agree_job_token,
    meet,
    read_views,
    view_text,
)
from ddp_doctor.processes.tcp_store import connect_store, op_bound, read_json_keys, store_call  # noqa: E402

VIEW = {"hostname": "algo-1", "pid": 1, "launcher": "torchrun", "backend": "nccl",
        "versions": {k: "2.13.0" for k in ("python", "torch", "cuda", "nccl", "transformers", "accelerate", "numpy")},
        "env": {f"NCCL_SETTING_{i}": "value-of-the-setting" for i in range(40)}, "findings": []}


class _Counting:
    """A simulated rank's store: the keys under this part's prefix, each request counted (one per
    call; multi_get, multi_set and wait: one), each call going straight to torch's client.

    A plain Python object, not a subclass of torch's Store under torch's PrefixStore: a real
    rank's prefixed store is torch's own, C++ over C++, so a call releases the interpreter's lock
    once, while a Store subclass in Python under torch's PrefixStore takes the lock back and hands
    it on twice more a call; with hundreds of ranks in one interpreter that is the harness's cost,
    not the rank's, and it grows with how many threads wait for the lock."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.prefix, self.requests = inner, "", 0
        self.released: float | None = None  # when this rank released the others (set ALL_HERE)

    def set(self, k, v):  # noqa: ANN001, ANN201 - torch's Store interface
        self.requests += 1
        if k == ALL_HERE:
            self.released = time.time()
        return self.inner.set(self.prefix + k, v)

    def get(self, k):  # noqa: ANN001, ANN201
        self.requests += 1
        return self.inner.get(self.prefix + k)

    def add(self, k, v):  # noqa: ANN001, ANN201
        self.requests += 1
        return self.inner.add(self.prefix + k, v)

    def check(self, ks):  # noqa: ANN001, ANN201
        self.requests += 1
        return self.inner.check([self.prefix + k for k in ks])

    def wait(self, ks, t=None):  # noqa: ANN001, ANN201
        self.requests += 1
        ks = [self.prefix + k for k in ks]
        return self.inner.wait(ks, t) if t is not None else self.inner.wait(ks)

    def multi_get(self, ks):  # noqa: ANN001, ANN201
        self.requests += 1
        return self.inner.multi_get([self.prefix + k for k in ks])

    def multi_set(self, ks, vs):  # noqa: ANN001, ANN201
        self.requests += 1
        return self.inner.multi_set([self.prefix + k for k in ks], vs)

    def append(self, k, v):  # noqa: ANN001, ANN201
        self.requests += 1
        return self.inner.append(self.prefix + k, v)

    def compare_set(self, k, e, d):  # noqa: ANN001, ANN201
        self.requests += 1
        return self.inner.compare_set(self.prefix + k, e, d)


def _baseline(store: Any, rank: int, world: int, timeout: float, view: Any) -> None:
    """A plain store barrier: add, and the last one sets the key the others wait for."""
    if int(store.add("barrier", 1)) == world:
        store.set("barrier/all", "1")
    else:
        store.wait(["barrier/all"], timedelta(seconds=timeout))


def _floor(store: Any, rank: int, world: int, timeout: float, view: Any) -> float | None:
    """The requests of a check-in that claims its rank and sends its view, bare: the rendezvous's
    own (a compare_set of the same record, one wait; rank 0's wait for each chunk of views and its
    read of them, each distinct long value parsed once, then its key) with nothing else, no bound
    on a call and no check of an answer: the least such a check-in costs these clients."""
    store.compare_set(f"view/{rank}", "", "0" * 32 + "\n" + view[1])
    if rank == 0:
        longs = {line: json.loads(line) for line in view[1].split("\n")[1:]}  # its own, as the rendezvous's
        for lo in range(0, world, READ_CHUNK):
            chunk = [f"view/{r}" for r in range(lo, min(lo + READ_CHUNK, world))]
            store.wait(chunk, timedelta(seconds=timeout))
            for v in store.multi_get(chunk):
                _, short, *rest = v.decode("utf-8").split("\n")
                json.loads(short)
                for line in rest:
                    if line not in longs:
                        longs[line] = json.loads(line)
        store.set(ALL_HERE, "1")
        return store.released
    store.wait([ALL_HERE], timedelta(seconds=timeout))
    return None


def _rendezvous(store: Any, rank: int, world: int, timeout: float, view: Any) -> float | None:
    """The rendezvous and the view exchange: every rank meets (checks in, publishes its view, waits
    for all); the reporting rank (0) reads every view. Rank 0 returns when it released the others."""
    meeting = meet(store, rank, world, view[0], timeout, view[1])
    assert not meeting.missing, meeting.missing
    if rank == 0:  # the views it read as they came, and any other
        released = store.released
        views = {**meeting.views, **read_views(store, [r for r in meeting.arrived if r not in meeting.views],
                                               time.monotonic() + timeout, present=True, own=view[1])}
        assert len(views) == world and views[world - 1]["env"] == VIEW["env"], len(views)
        return released
    return None


def _preflight(store: Any, rank: int, world: int, timeout: float, view: Any) -> None:
    """The preflight's rendezvous and view exchange, with its own functions (see the doc)."""
    meeting = meet(store, rank, world, view[0], timeout, view[1])
    assert not meeting.missing, meeting.missing
    final = json.dumps({"findings": [], "measurements": {"stage_seconds": {"total": 1.0}}})
    store_call(lambda: store.set(f"final/{rank}", final), "final", op_bound(timeout))
    deadline = time.monotonic() + timeout
    if rank == 0:
        finals = read_json_keys(store, [f"final/{r}" for r in meeting.arrived], deadline)
        views = {**meeting.views, **read_views(store, [r for r in meeting.arrived if r not in meeting.views],
                                               deadline, present=True, own=view[1])}
        assert len(finals) == len(views) == world, (len(finals), len(views))
        verdict = json.dumps({"status": "pass", "job_token": agree_job_token(store, op_bound(timeout))})
        store_call(lambda: store.set("verdict", verdict), "verdict", op_bound(timeout))
    else:
        assert read_json_keys(store, ["verdict"], deadline), "no verdict"


PARTS = ("baseline", "floor", "rendezvous", "preflight")  # taken in turns: this order, then the other way


def _run_part(fn: Any, store: Any, rank: int, world: int, timeout: float, view: Any, ends: dict[int, float],
              errors: list[str], released: dict[int, float], used: dict[int, float]) -> None:
    try:
        cpu = time.thread_time()
        at = fn(store, rank, world, timeout, view)
        ends[rank] = time.time()
        used[rank] = time.thread_time() - cpu  # this rank's own CPU: its Python and its client's
        if at is not None:
            released[rank] = at
    except Exception as e:  # noqa: BLE001 - said by the parent
        errors.append(f"rank {rank}: {type(e).__name__}: {e}")


def _worker(port: int, ranks: list[int], world: int, timeout: float, rounds: int, out: Any, shuffle: bool) -> None:
    import torch.distributed as dist
    control = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout),
                            wait_for_workers=False)
    control.add("ready", 1)
    control.wait(["go/connect"], timedelta(seconds=timeout))
    from concurrent.futures import ThreadPoolExecutor

    # now and then a connection waits 5 s for the store's reverse lookup of its address (docs/facts.md,
    # the store's reverse lookups): the clients connect in parallel
    with ThreadPoolExecutor(64) as pool:
        made = pool.map(lambda r: (r, connect_store("127.0.0.1", port, hosting=False, timeout=timeout)),
                        ranks)  # as a rank connects: its calls then watched
        clients = {r: _Counting(c) for r, c in made}
    results: dict[str, Any] = {"connected": time.time()}
    # each rank's view and its text as sent (view_text), made before it checks in, as a rank does
    # (one_rank: the view is made, then the rendezvous): its own work, timed here a rank at a time
    views, used = {}, time.process_time()
    for r in ranks:
        v = {**VIEW, "rank": r}
        views[r] = (v, view_text(v))
    results["encode_us"] = (time.process_time() - used) / len(ranks) * 1e6
    for i in range(rounds):
        for part in PARTS if i % 2 == 0 else PARTS[::-1]:
            key = f"{part}-{i}"
            control.add("ready", 1)
            control.wait([f"go/{key}"], timedelta(seconds=timeout))
            before = {r: c.requests for r, c in clients.items()}
            ends: dict[int, float] = {}
            errors: list[str] = []
            released: dict[int, float] = {}  # rank 0's release of the others (floor, rendezvous)
            used: dict[int, float] = {}
            fn = {"baseline": _baseline, "floor": _floor, "rendezvous": _rendezvous, "preflight": _preflight}[part]
            for c in clients.values():
                c.prefix, c.released = f"{key}/", None
            threads = [threading.Thread(target=_run_part, daemon=True,
                                        args=(fn, clients[r], r, world, timeout,
                                              views[r], ends, errors, released, used)) for r in ranks]
            if shuffle:  # the ranks start in any order, as nodes come on a cluster (the same in every part)
                random.Random(i).shuffle(threads)
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout + 30)
            if errors or len(ends) < len(ranks):
                out.put({"error": errors[:3] or [f"{len(ranks) - len(ends)} rank(s) did not finish"]})
                return
            results.setdefault(part, []).append((max(ends.values()),
                                                 sum(c.requests - before[r] for r, c in clients.items())))
            results.setdefault(f"{part}/cpu", []).extend(x for r, x in used.items() if r != 0)
            if 0 in released:  # rank 0's read of the views, from its release of the others
                results.setdefault(f"{part}/read", []).append(ends[0] - released[0])
    out.put({"results": results, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})


ALONE = ("baseline", "floor", "rendezvous")  # the parts one rank's own CPU is timed in, alone (_alone)


def _alone(port: int, n: int, out: Any) -> None:
    """One rank's own CPU in each part, with no other rank about: the process's one thread runs a
    part as rank 1 of 2, n times in turns (the order reversed every other time), each time under
    keys of its own where the key it waits for is already there, so that every request is answered
    at once; the median thread CPU per part, and its quartiles. What the simulation's hundreds of
    ranks to an interpreter turn into wall time, without their contention for its lock."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:  # a core of its own, apart from the store's (alone): steadier medians
        os.sched_setaffinity(0, {cpus[1]})
    c = _Counting(connect_store("127.0.0.1", port, hosting=False, timeout=60.0))
    v = {**VIEW, "rank": 1}
    view = (v, view_text(v))
    fns = {"baseline": _baseline, "floor": _floor, "rendezvous": _rendezvous}
    used: dict[str, list[float]] = {part: [] for part in ALONE}
    for i in range(n):
        for part in ALONE if i % 2 == 0 else ALONE[::-1]:
            c.prefix = f"alone/{part}-{i}/"
            c.inner.multi_set([c.prefix + k for k in ("barrier/all", ALL_HERE)], ["1", "1"])  # out of the time
            cpu = time.thread_time_ns()
            fns[part](c, 1, 2, 60.0, view)
            used[part].append((time.thread_time_ns() - cpu) / 1e3)
    out.put({part: (statistics.median(xs), *statistics.quantiles(xs, n=4)[::2]) for part, xs in used.items()})


def _host_store(timeout: float) -> tuple[Any, int]:
    """A TCPStore hosted by this process on a free loopback port, as rank 0's process hosts it."""
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False), port


def alone(n: int, timeout: float) -> dict[str, tuple[float, float, float]]:
    """_alone in a process of its own, against a store this one hosts: part -> (median, q1, q3) us."""
    host, port = _host_store(timeout)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_alone, args=(port, n, out))
    cpus = os.sched_getaffinity(0)
    p.start()
    if len(cpus) > 1:  # the store on the first core, its client on the second (_alone)
        os.sched_setaffinity(0, {min(cpus)})
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return out.get(timeout=1.0)
            except queue.Empty:
                if not p.is_alive():  # its figures may have come just before it ended
                    try:
                        return out.get(timeout=1.0)
                    except queue.Empty:
                        raise SystemExit(f"one rank alone: its process ended (exit code {p.exitcode}) "
                                         "without its figures") from None
                if time.monotonic() > deadline:
                    raise SystemExit(f"one rank alone: no figures within {timeout:g} s") from None
    finally:
        os.sched_setaffinity(0, cpus)
        p.join(10)
        if p.is_alive():
            p.kill()
        del host  # the store lives until its client is done


def measure(world: int, procs: int, rounds: int, timeout: float, shuffle: bool = False) -> dict[str, Any]:
    host, port = _host_store(timeout)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    # the reporting rank (0) in a process of its own, as in a job: its serial part (the wait for
    # every view, reading them) is not held up by hundreds of simulated ranks' interpreter lock
    shares = [[0]] + [part for part in (list(range(1, world))[i::procs] for i in range(procs)) if part]
    workers = [ctx.Process(target=_worker, args=(port, share, world, timeout, rounds, out, shuffle))
               for share in shares]
    for w in workers:
        w.start()
    starts: dict[str, float] = {}
    cpu: dict[str, float] = {}  # this process's CPU seconds (its store's, all but the polling) from each go
    try:
        keys = ["connect"] + [f"{part}-{i}" for i in range(rounds) for part in (PARTS if i % 2 == 0 else PARTS[::-1])]
        for n, key in enumerate(keys, 1):
            deadline = time.monotonic() + timeout
            while int(host.add("ready", 0)) < len(workers) * n:  # every process says "ready" once per part
                if time.monotonic() > deadline or not all(w.is_alive() for w in workers):
                    said = [] if out.empty() else [out.get(timeout=5)]  # a worker that failed says why
                    raise SystemExit(f"{world} ranks: the workers did not get ready for {key}: {said}")
                time.sleep(0.05)
            if n > 1:
                cpu[keys[n - 2]] = time.process_time() - cpu[keys[n - 2]]
            cpu[key] = time.process_time()
            starts[key] = time.time()
            host.set(f"go/{key}", "1")
        got = [out.get(timeout=timeout + 60) for _ in workers]
        cpu[keys[-1]] = time.process_time() - cpu[keys[-1]]
    finally:
        for w in workers:
            w.join(10)
            if w.is_alive():
                w.kill()
    bad = [g["error"] for g in got if "error" in g]
    if bad:
        raise SystemExit(f"{world} ranks: {bad[0]}")
    figures: dict[str, Any] = {"connect": max(g["results"]["connected"] for g in got) - starts["connect"],
                               "encode_us": statistics.median(g["results"]["encode_us"] for g in got)}
    for part in PARTS:
        secs, reqs, used = [], [], []
        for i in range(rounds):
            key = f"{part}-{i}"
            secs.append(max(g["results"][part][i][0] for g in got) - starts[key])
            reqs.append(sum(g["results"][part][i][1] for g in got))
            used.append(cpu[key])
        figures[part] = {"seconds": statistics.median(secs), "each": secs, "requests": statistics.median(reqs),
                         "store_cpu": statistics.median(used),
                         "rank_cpu": statistics.median([x for g in got for x in g["results"].get(f"{part}/cpu", [])]
                                                       or [0.0])}  # a world of rank 0 alone has none
    for part in ("floor", "rendezvous"):
        reads = [x for g in got for x in g["results"].get(f"{part}/read", [])]
        figures[part]["read"] = statistics.median(reads)
    for part in PARTS:  # each round's ratio to that round's barrier: how far the rounds spread
        figures[part]["ratios"] = sorted(x / b for x, b in zip(figures[part]["each"], figures["baseline"]["each"]))
    figures["rss_mb"] = max([g["rss_kb"] for g in got] + [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]) / 1024
    return figures


def _quartiles(xs: list[float]) -> str:
    """The first and third quartiles of sorted `xs`, as "q1-q3" (one value: itself twice)."""
    if len(xs) < 2:
        return f"{xs[0]:.2f}-{xs[0]:.2f}" if xs else "-"
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.2f}-{q[2]:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--procs", type=int, default=4, help="processes ranks 1.. are spread over (rank 0 has one more)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each part, in turns (median)")
    ap.add_argument("--shuffle", action="store_true",
                    help="start each process's ranks in a random order (else in rank order, lower ranks first)")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds any wait may take (4,096 clients take about 400 s to connect here)")
    ap.add_argument("--alone", type=int, default=3000,
                    help="times each part runs for one rank alone on one thread (its own CPU, printed first; 0: not)")
    args = ap.parse_args()
    if args.alone == 1 or args.alone < 0:  # a median and quartiles need two turns at least
        ap.error("--alone takes 0 (not timed) or 2 turns or more")
    if args.alone:
        a = alone(args.alone, args.timeout)
        b = a["baseline"][0]
        print("one rank alone, its own CPU (median, q1-q3 us): " + "; ".join(
            f"{'barrier' if part == 'baseline' else part} {m:.1f} ({q1:.1f}-{q3:.1f}, {m / b:.2f}x)"
            for part, (m, q1, q3) in a.items()), flush=True)
    print(f"{'ranks':>6} {'connect s':>10} {'barrier s':>10} {'floor s':>8} {'ratio':>6} {'rendezvous s':>13} "
          f"{'ratio':>6} {'rdv ratio q1-q3':>16} {'preflight s':>12} "
          f"{'ratio':>6} {'barrier req/s':>14} {'rendezvous req/s':>17} {'preflight req/s':>16} {'req/rank':>9} "
          f"{'store CPU ms b/r/p':>19} {'rank CPU us b/f/r':>18} {'view us':>8} {'read ms f/r':>12} "
          f"{'peak RSS MB':>12}")
    for world in args.ranks:
        f = measure(world, min(args.procs, world), args.rounds, args.timeout, args.shuffle)
        b, r, p, c, fl = f["baseline"], f["rendezvous"], f["preflight"], f["connect"], f["floor"]
        print(f"{world:>6} {c:>10.3f} {b['seconds']:>10.3f} {fl['seconds']:>8.3f} {fl['seconds'] / b['seconds']:>6.2f} "
              f"{r['seconds']:>13.3f} {r['seconds'] / b['seconds']:>6.2f} {_quartiles(r['ratios']):>16} "
              f"{p['seconds']:>12.3f} {p['seconds'] / b['seconds']:>6.2f} {b['requests'] / b['seconds']:>14.0f} "
              f"{r['requests'] / r['seconds']:>17.0f} {p['requests'] / p['seconds']:>16.0f} "
              f"{p['requests'] / world:>9.1f} "
              f"{'/'.join(str(round(x['store_cpu'] * 1000)) for x in (b, r, p)):>19} "
              f"{'/'.join(str(round(x['rank_cpu'] * 1e6)) for x in (b, fl, r)):>18} {f['encode_us']:>8.1f} "
              f"{'/'.join(str(round(x['read'] * 1000)) for x in (fl, r)):>12} "
              f"{f['rss_mb']:>12.0f}", flush=True)
    print(f"connect: every simulated rank connecting its own client (the harness's cost, and a rank's); barrier, "
          f"floor (the rendezvous's requests bare: the check-in, a wait; rank 0 reading every view), "
          f"rendezvous (meet + rank 0 reading every view), preflight (the rendezvous, every rank's final "
          f"findings, rank 0 reading them and the views, the verdict read by all): once all are connected, start "
          f"to the last rank done; ratio: to the barrier (the ratio of the medians); rdv ratio q1-q3: the first and "
          f"third quartiles of each round's rendezvous time over that round's barrier time (how far rounds spread); "
          f"req/rank: the preflight's requests per rank; "
          f"store CPU: the CPU time of the process hosting the store (its server thread, and a look at a "
          f"counter every 50 ms) in barrier, rendezvous, preflight, each to the next part's start; rank CPU: a "
          f"rank's own CPU time (its thread's: its Python and its client's) in barrier, floor, rendezvous, the "
          f"median of ranks 1 and up (what the simulation turns into wall time); view us: the "
          f"CPU time a rank takes to make its view's text (view_text), before the start, as a rank makes them "
          f"before it checks in (a real rank's own work, in parallel with the others'); read ms: rank 0's time "
          f"from its release of the others to its end, in floor and rendezvous (what it reads then: it read the "
          f"views as they came). Median of "
          f"{args.rounds} rounds each, in turns; rank 0 in a process of its own, the others in {args.procs}; requests "
          f"counted client-side.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
