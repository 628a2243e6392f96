"""Communication checks (category `communication`): the all_reduce sweep with its correctness
check, broadcast and all_gather, the bandwidth an instance type should reach, stragglers, the
send/recv ring and clock skew. The measuring lives in ddp_doctor.comm; these functions decide.

Settings read from ctx.options (set by the preflight options of the same names; defaults in
ddp_doctor.comm): comm_min_bytes, comm_max_bytes, comm_iters, comm_warmup, comm_budget_s,
comm_mode, comm_progress (a callable bench-comm passes to print each size), comm_min_fraction,
instance_type, straggler_factor, straggler_min_s, max_clock_skew_s.

Every check here issues the same collectives on every rank, decided only from values all ranks
agree on, so a skipped or failing check never leaves a rank waiting in a collective alone.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from ddp_doctor.checks import host_busy
from ddp_doctor.comm import arithmetic, layout, stragglers, sweep
from ddp_doctor.comm import expected as expected_bw
from ddp_doctor.context import Group
from ddp_doctor.facts import host_load
from ddp_doctor.findings import Problem, format_ranks
from ddp_doctor.registry import check

# Kept for callers of the first version of DDP401.
busbw_factor = arithmetic.busbw_factor


def _opt(ctx: Any, key: str, default: Any) -> Any:
    options: Mapping[str, Any] = getattr(ctx, "options", None) or {}
    v = options.get(key)
    return default if v is None else v


def _split_possible(ctx: Any, group: Group) -> bool:
    return group.backend != "smddp" and group.world_size > 1


def wrong_result_problems(op: str, entries: list[dict[str, Any]], backend: str) -> list[Problem]:
    """One problem per group of entries with wrong elements (empty when every size was right)."""
    bad = [e for e in entries if not e.get("correct", True)]
    if not bad:
        return []
    ranks = sorted({r for e in bad for r in e.get("wrong_ranks", [])})
    sizes = ", ".join(f"{arithmetic.format_bytes(e['bytes'])} ({e['wrong']} wrong)" for e in bad)
    first = bad[0]
    label = first.get("group", "world")
    where = "" if label == "world" else f" in the {label} group"
    return [Problem(
        message=f"{op} over {first.get('nranks', '?')} ranks{where} ({backend}) returned wrong "
                f"elements at {len(bad)} of {len(entries)} sizes: {sizes}; wrong on rank(s) "
                f"{format_ranks(ranks) if ranks else '?'}",
        ranks=tuple(ranks) if ranks else None,
        evidence={"op": op, "group": label, "sizes": [e["bytes"] for e in bad],
                  "wrong": [e["wrong"] for e in bad], "wrong_ranks": ranks})]


@check("DDP401", category="communication", severity="error", stage="group",
       title="all_reduce gives a wrong result", timeout=900.0, cause_class="host")
def all_reduce_correct(ctx: Any, group: Group) -> Iterator[Problem]:
    """
    What: Runs the all_reduce sweep (nccl-tests methodology: sizes doubling from --comm-min-bytes
    to --comm-max-bytes, warm-up, timed iterations, algbw and busbw) and checks every size's
    result element by element against the exact sum of known per-rank values; with more than
    one node it also sweeps each node's ranks (intra-node) and the ranks sharing a local rank
    (inter-node) apart, all inter-node groups at once (their entries say how many: `sharing`).
    Figures go to measurements.all_reduce (_intra, _inter).
    Why: A backend that connects but corrupts or drops data (a broken NCCL transport, a faulty
    GPU or NIC) makes training diverge silently instead of failing.
    Fix: Run `ddp-doctor bench-comm` to see which sizes fail; try NCCL_PROTO=simple and
    NCCL_ALGO=Ring, and check the GPUs and NICs of the ranks named (ECC errors, link state).
    """
    world = sweep.world_comm(group)
    cfg = sweep.sweep_config(getattr(ctx, "options", None) or {}, group.device)
    progress = _opt(ctx, "comm_progress", None)
    report = progress if callable(progress) and group.rank == 0 else None
    problems: list[Problem] = []
    entries = sweep.sweep_all_reduce(world, cfg, report)
    group.measurements["all_reduce"] = entries
    problems += wrong_result_problems("all_reduce(sum)", entries, group.backend)
    if _split_possible(ctx, group):
        lay = layout.layout(world, ctx)
        if len({node for node, _ in lay}) > 1:
            intra, inter = layout.split_comms(world, lay)
            sharing = layout.concurrent_inter_groups(lay)
            for sub, name in ((intra, "all_reduce_intra"), (inter, "all_reduce_inter")):
                got: list[dict[str, Any]] = []
                if sub is not None:
                    got = sweep.sweep_all_reduce(sub, cfg, report if sub.rank == 0 else None)
                    if sub.label == "inter-node":  # swept at once with the others: they share the NICs
                        for e in got:
                            e["sharing"] = sharing
                    group.measurements[name] = got
                    problems += wrong_result_problems("all_reduce(sum)", got, group.backend)
                # the next sweep starts together on every rank (groups of one skip theirs)
                world.wait(stragglers.barrier(world))
    yield from problems


@check("DDP402", category="communication", severity="error", stage="group",
       title="broadcast or all_gather gives a wrong result", timeout=120.0, cause_class="host")
def broadcast_all_gather_correct(ctx: Any, group: Group) -> Iterator[Problem]:
    """
    What: Broadcasts known values from rank 0 (small size) and from the last rank (1 MiB), and
    all_gathers known per-rank values, counting the elements that arrive wrong on every rank;
    the figures (busbw: broadcast x1, all_gather x(n-1)/n) go to measurements.broadcast and
    measurements.all_gather.
    Why: DDP broadcasts rank 0's parameters and buffers at construction, and samplers, metrics
    and checkpoints gather: a transport that corrupts these starts ranks from different weights.
    Fix: Run `NCCL_DEBUG=INFO ddp-doctor preflight --select DDP402` and compare the transports
    NCCL picks per rank; check the GPUs and NICs of the ranks named.
    """
    world = sweep.world_comm(group)
    lo = int(_opt(ctx, "comm_min_bytes", sweep.DEFAULT_MIN_BYTES))
    hi = max(lo, min(1 * arithmetic.MIB, int(_opt(ctx, "comm_max_bytes", 1 * arithmetic.MIB))))
    bc = [sweep.check_broadcast(world, lo, 0), sweep.check_broadcast(world, hi, group.world_size - 1)]
    if hi == lo:
        bc = bc[1:]
    ag = [sweep.check_all_gather(world, hi)]
    group.measurements["broadcast"] = bc
    group.measurements["all_gather"] = ag
    yield from wrong_result_problems("broadcast", bc, group.backend)
    yield from wrong_result_problems("all_gather", ag, group.backend)


def judge_bandwidth(entries: list[dict[str, Any]], scope: str, instance_type: str | None, backend: str,
                    device: str, env: Mapping[str, str], min_fraction: float = expected_bw.DEFAULT_MIN_FRACTION
                    ) -> Problem | None:
    """The verdict on one sweep: a warning when busbw at the largest size is below min_fraction
    of what the instance type reaches, an info when it cannot be judged with NCCL on GPUs, and
    nothing on CPU / gloo (no expectation exists there: report, don't judge).

    An inter-node sweep whose entries carry `sharing` (k groups swept at once, DDP401) is judged
    against its share of the node's figure E: E / max(k, GPUs of the type) (comm.expected)."""
    if not entries:
        return None
    big = max(entries, key=lambda e: e["bytes"])
    seen = f"{big['busbw_gbps']:.2f} GB/s busbw at {arithmetic.format_bytes(big['bytes'])} ({scope}, {backend})"
    if backend not in ("nccl", "smddp") or not device.startswith("cuda"):
        return None
    if big.get("nranks") == 1:  # busbw 0 (nccl-tests' factor): no link to judge, not a slow one
        return Problem(message=f"all_reduce over 1 rank at {arithmetic.format_bytes(big['bytes'])} ({scope}, "
                               f"{backend}): no link crossed, so no bandwidth is judged",
                       severity="info", evidence={"scope": scope, "nranks": 1})
    sharing = big.get("sharing") if scope == "inter-node" else None
    figures = expected_bw.expected_for(instance_type, scope, sharing)
    if figures is None:
        return Problem(message=f"{seen}; instance type {instance_type or 'unknown'} has no expected "
                               f"figure, so it is reported, not judged (--instance-type names it)",
                       severity="info", evidence={"scope": scope, "busbw_gbps": big["busbw_gbps"],
                                                  "instance_type": instance_type})
    if big["bytes"] < expected_bw.MIN_JUDGED_BYTES:
        return Problem(message=f"{seen}; not judged: the largest size is below "
                               f"{arithmetic.format_bytes(expected_bw.MIN_JUDGED_BYTES)} (--comm-max-bytes)",
                       severity="info", evidence={"scope": scope, "busbw_gbps": big["busbw_gbps"]})
    expected, node, divisor = figures
    if big["busbw_gbps"] >= min_fraction * expected:
        return None
    causes = expected_bw.likely_causes(scope, env, instance_type)
    if divisor > 1:
        k = int(sharing or 1)
        at_once = (f", swept at once with {k - 1} other group(s) over each node's network (together "
                   f"~{big['busbw_gbps'] * k:.1f} GB/s)" if k > 1 else "")
        what = (f"{seen} in a group of {big.get('nranks', '?')} ranks{at_once}, is "
                f"{big['busbw_gbps'] / expected:.0%} of its ~{expected:.3g} GB/s share (~{node:g} GB/s per "
                f"{instance_type} node / {divisor})")
    else:
        what = f"{seen} is {big['busbw_gbps'] / expected:.0%} of the ~{expected:g} GB/s a healthy " \
               f"{instance_type} reaches {scope}"
    return Problem(
        message=f"{what} (threshold {min_fraction:g}x). Likely causes: " + "; ".join(causes),
        evidence={"scope": scope, "busbw_gbps": big["busbw_gbps"], "expected_gbps": expected,
                  "node_expected_gbps": node, "share_divisor": divisor, "sharing": sharing,
                  "bytes": big["bytes"], "instance_type": instance_type, "min_fraction": min_fraction,
                  "causes": causes})


@check("DDP403", category="communication", severity="warning", stage="group",
       title="all_reduce bandwidth below what the instance type reaches", timeout=30.0, severities=("info",),
       cause_class="network", action="investigate")
def bandwidth_expected(ctx: Any, group: Group) -> Iterator[Problem]:
    """
    What: Compares the all_reduce busbw at the largest size of the sweep (DDP401) with what a
    healthy instance of the job's type reaches (a built-in table of ml.p3/p3dn/p4d/p4de/p5/g5
    figures from published nccl-tests runs), intra-node and inter-node apart; warns below
    --comm-min-fraction (default 0.5) of it. The inter-node groups are swept at once and share
    each node's network, so each is judged against its share: the node's figure / max(groups
    swept at once, GPUs of the type). The type comes from --instance-type or SageMaker. Unknown
    types are reported, not judged; CPU / gloo runs are not judged.
    Why: A job that runs at a fraction of the fabric's bandwidth trains, but slowly and
    expensively; the usual causes (EFA not in use, the wrong socket interface, peer-to-peer
    disabled) are settings, not hardware.
    Fix: Use EFA on EFA instances (FI_PROVIDER=efa with the aws-ofi-nccl plugin; NCCL_DEBUG=INFO
    must show NET/OFI), set NCCL_SOCKET_IFNAME to the instance's interface, unset
    NCCL_P2P_DISABLE, and check `nvidia-smi topo -m` for NVLink between the GPUs.
    Severity: a warning when bandwidth is below the expected fraction; info when it cannot be judged
    (no expected figure for the instance type, or the largest size swept is too small).
    """
    sm = getattr(ctx, "sagemaker", None)
    itype = _opt(ctx, "instance_type", None) or (sm.instance_type if sm is not None else None)
    frac = float(_opt(ctx, "comm_min_fraction", expected_bw.DEFAULT_MIN_FRACTION))
    m = group.measurements
    if m.get("all_reduce_intra") or m.get("all_reduce_inter"):
        sweeps = [("intra-node", m.get("all_reduce_intra") or []), ("inter-node", m.get("all_reduce_inter") or [])]
    else:  # one node: the world sweep is intra-node; several nodes without a split: the network bounds it
        nodes = ctx.nnodes or 1
        sweeps = [("inter-node" if nodes > 1 else "intra-node", m.get("all_reduce") or [])]
    for scope, entries in sweeps:
        p = judge_bandwidth(entries, scope, itype, group.backend, group.device, ctx.env, frac)
        if p is not None:
            yield p


@check("DDP404", category="communication", severity="info", stage="local",
       title="intra- and inter-node bandwidth not measured apart")
def split_unavailable(ctx: Any) -> Iterator[Problem]:
    """
    What: With more than one node on the smddp backend, says that the all_reduce sweep measures
    all ranks together only: smdistributed dataparallel supports no new_group(), so the
    node-local and cross-node groups cannot be created.
    Why: A single figure mixes NVLink and the network: a slow network hides behind fast
    NVLink figures and the other way round.
    Fix: To see the two apart, run `ddp-doctor bench-comm --backend nccl` on the same instances
    (NCCL is what smddp uses within a node).
    """
    if ctx.backend == "smddp" and (ctx.nnodes or 1) > 1:
        yield Problem(message=f"backend smddp on {ctx.nnodes} nodes: the sweep measures the {ctx.world_size} "
                              f"ranks together; intra-node and inter-node groups need new_group(), which "
                              f"smddp does not support",
                      evidence={"backend": ctx.backend, "nnodes": ctx.nnodes})


def _node_of(lay: list[tuple[int, int]]) -> dict[int, int]:
    """rank -> node index (0, 1, ... in order of the nodes' lowest rank)."""
    keys: dict[int, int] = {}
    for node, _ in lay:
        keys.setdefault(node, len(keys))
    return {r: keys[node] for r, (node, _) in enumerate(lay)}


def straggler_problems(rounds: Mapping[int, list[float]], loads: Mapping[int, host_load.LoadWindow],
                       node_of: Mapping[int, int], what: str, factor: float, min_s: float,
                       slow: Mapping[int, stragglers.Slow] | None = None) -> list[Problem]:
    """Name the ranks slower beyond doubt at `what` (`slow`: slow_ranks's, confirmed; computed
    from `rounds` when not given), weighed by the hosts' load, and the nodes markedly slower."""
    out = []
    slow = stragglers.slow_ranks(rounds, factor, min_s) if slow is None else slow
    medians = {r: stragglers.median(v) for r, v in rounds.items() if v}
    median = stragglers.median(list(medians.values())) if medians else 0.0
    load = host_busy.read(loads, node_of)
    if slow:
        listed = ", ".join(f"rank {r} {medians[r] * 1e3:.1f} ms ({x.ratio:.1f}x the others' median, slower in "
                           f"{x.slower} of {x.rounds} rounds)" for r, x in sorted(slow.items()))
        severity, said = _busy_verdict(load, tuple(sorted(slow)))
        out.append(Problem(
            message=f"{what}: median {median * 1e3:.1f} ms over {len(medians)} ranks; markedly slower: {listed}{said}",
            ranks=tuple(sorted(slow)), severity=severity,
            evidence={"seconds": {str(r): t for r, t in medians.items()}, "median_s": median,
                      "rounds": {str(r): [round(t, 6) for t in v] for r, v in rounds.items()},
                      "slow": {str(r): x.to_dict() for r, x in slow.items()}, "factor": factor, "min_s": min_s,
                      **load.evidence()}))
    nodes = stragglers.slow_nodes(medians, node_of, factor, min_s)
    if nodes and slow:  # a node is slow when its ranks are, beyond doubt
        ranks = tuple(sorted(r for r, n in node_of.items() if n in nodes))
        severity, said = _busy_verdict(load, ranks)
        out.append(Problem(
            message=f"{what}: node(s) {', '.join(str(n) for n in sorted(nodes))} markedly slower than the "
                    f"median node ({', '.join(f'{x:.1f}x' for _, x in sorted(nodes.items()))}){said}",
            ranks=ranks, severity=severity, evidence={"slow_nodes": {str(k): v for k, v in nodes.items()}}))
    return out


@check("DDP405", category="communication", severity="warning", stage="group", severities=("warning", "info"),
       title="a rank computes markedly slower than the others", timeout=120.0, cause_class="host")
def straggler_compute(ctx: Any, group: Group) -> Iterator[Problem]:
    """
    What: Every rank times the same fixed amount of compute (float32 matmuls; on the GPU when
    it has one) in up to 12 rounds (more past 8 ranks), each started together, and reads how busy
    its host was meanwhile (other processes' CPU on its CPUs, steal, load average). The rounds stop
    as soon as no rank can be named whatever the rest would measure (each rank was as fast as the
    others in more rounds than the sign test below allows). A rank is named when it is slower
    beyond doubt: its median round above
    --straggler-factor (1.5) x the others' median and --straggler-min-ms (10) more, that excess
    above 3 x the others' own spread from round to round (1.4826 x MAD), and slower than the
    others in so many rounds that chance would do it with a probability under 1% (a one-sided
    sign test, shared by the ranks: Bonferroni); then it is measured again and named only when
    it is slow both times (one burst of load is not a straggler). At least 8 rounds are needed.
    Why: DDP steps at the pace of its slowest rank: one throttled GPU, a host shared with other
    work or a rank with fewer CPU threads slows the whole job.
    Fix: On the ranks named, look for other processes (`nvidia-smi`, `top`), thermal or power
    throttling (`nvidia-smi -q -d PERFORMANCE`), CPU affinity and OMP_NUM_THREADS differences.
    Severity: warning; info when a host was busy (other processes used a quarter of its cores,
    the hypervisor stole 10% of its time, or its load average was above its cores) and the slow
    rank's CPUs were not busier with other work than the others': its pace was then the
    scheduler's as much as its own. A rank whose CPUs other processes used markedly more than
    the others' (a quarter of a core more) stays a warning that says so: that is its cause.
    """
    if group.world_size < 2:
        return
    world = sweep.world_comm(group)
    lay = layout.layout(world, ctx)
    factor = float(_opt(ctx, "straggler_factor", stragglers.DEFAULT_STRAGGLER_FACTOR))
    min_s = float(_opt(ctx, "straggler_min_s", stragglers.DEFAULT_STRAGGLER_MIN_S))
    n = stragglers.rounds_for(group.world_size)
    rounds, loads, slow = confirmed_slow(
        lambda: _timed_with_load(world, lambda: stragglers.fixed_work_rounds(world, n)), factor, min_s)
    # kept for the history: it compares a host's figures with its quiet runs only
    group.measurements["host_load"] = host_busy.read(loads, _node_of(lay)).summary()
    yield from straggler_problems(rounds, loads, _node_of(lay), "fixed compute", factor, min_s, slow)


def _timed_with_load(world: Any, timed: Any) -> tuple[dict[int, list[float]], dict[int, host_load.LoadWindow]]:
    """Every rank's rounds of `timed` and its host's load meanwhile, gathered (the same on every rank)."""
    start = host_load.read_cpu_times()
    mine = timed()
    load = host_load.window(start)
    got = world.gather_floats([*mine, *load.as_floats()])
    k = len(mine)
    return ({r: v[:k] for r, v in enumerate(got)},
            {r: host_load.LoadWindow.from_floats(v[k:k + host_load.FLOATS]) for r, v in enumerate(got)})


def confirmed_slow(measure: Any, factor: float, min_s: float) -> tuple[Any, Any, dict[int, stragglers.Slow]]:
    """Measure; when some rank is slow beyond doubt, measure again and keep the ranks slow both
    times (with the second measurement's figures). `measure` returns (rounds, loads), the same on
    every rank, so every rank takes the same branch."""
    rounds, loads = measure()
    slow = stragglers.slow_ranks(rounds, factor, min_s)
    if slow:
        rounds, loads = measure()
        again = stragglers.slow_ranks(rounds, factor, min_s)
        slow = {r: again[r] for r in slow if r in again}
    return rounds, loads, slow


def _busy_verdict(load: host_busy.Load, ranks: Iterator[int] | tuple[int, ...]) -> tuple[str | None, str]:
    """(severity override, what to add to the message) for slow `ranks` given the hosts' load."""
    shared = [r for r in ranks if load.shared(r)]
    if shared:
        rest = stragglers.median([v for r, v in load.others.items() if r not in shared])
        return None, ("; other processes used " + ", ".join(f"{load.others[r]:.2f} cores of rank {r}'s CPUs"
                                                            for r in shared) + f" (the other ranks' CPUs: {rest:.2f})")
    if load.busy:
        return "info", (f"; the host was busy while it was measured ({load.describe()}): a rank's pace on a busy "
                        f"host is the scheduler's as much as its own")
    return None, ""


@check("DDP406", category="communication", severity="warning", stage="group", severities=("warning", "info"),
       title="a send/recv link is markedly slower than the others", timeout=120.0,
       cause_class="network", action="investigate")
def straggler_link(ctx: Any, group: Group) -> Iterator[Problem]:
    """
    What: Sends 256 KiB around a ring (each rank sends to rank + 1 and receives from rank - 1 at
    once, isend/irecv), in 12 rounds (more past 8 ranks); the time each rank waits for its
    receive measures the link from its left neighbour. A link is named, with its two ranks, when
    it is slower beyond doubt, by the same test as DDP405 (median above --straggler-factor (1.5)
    x the others' and --straggler-min-ms (10) more, above 3 x the others' spread, a sign test
    across the rounds at 1%), in a first measurement and again in a second.
    Why: One slow path (a degraded NIC, a host on another network spine, traffic through a
    slow interface) paces every collective that crosses it.
    Fix: Check the interface both ranks use (NCCL_SOCKET_IFNAME, `ip -s link` errors), EFA on
    both hosts, and their placement; `ddp-doctor bench-comm` measures the groups apart.
    Severity: warning; info when a host was busy while it was measured (as DDP405 reads it):
    on a busy host a receive waits for the scheduler as much as for the link.
    """
    if group.world_size < 2:
        return
    world = sweep.world_comm(group)
    lay = layout.layout(world, ctx)
    n = group.world_size
    factor = float(_opt(ctx, "straggler_factor", stragglers.DEFAULT_STRAGGLER_FACTOR))
    min_s = float(_opt(ctx, "straggler_min_s", stragglers.DEFAULT_STRAGGLER_MIN_S))
    reps = stragglers.rounds_for(n)
    rounds, loads, slow = confirmed_slow(
        lambda: _timed_with_load(world, lambda: stragglers.ring_times(world, reps=reps)), factor, min_s)
    if slow:
        node_of = _node_of(lay)
        medians = {r: stragglers.median(v) for r, v in rounds.items()}
        links = ", ".join(f"rank {(r - 1) % n} (node {node_of[(r - 1) % n]}) -> rank {r} (node {node_of[r]}) "
                          f"{medians[r] * 1e3:.1f} ms ({x.ratio:.1f}x the others' median, slower in {x.slower} "
                          f"of {x.rounds} rounds)" for r, x in sorted(slow.items()))
        load = host_busy.read(loads, node_of)
        severity, said = _busy_verdict(host_busy.Load(load.busy, {}, load.read), tuple(slow))
        median = stragglers.median(list(medians.values()))
        yield Problem(message=f"send/recv ring of 256 KiB: median {median * 1e3:.1f} ms; markedly slower "
                              f"link(s): {links}{said}",
                      ranks=tuple(sorted({r for r in slow} | {(r - 1) % n for r in slow})), severity=severity,
                      evidence={"seconds": {str(r): t for r, t in medians.items()},
                                "rounds": {str(r): [round(t, 6) for t in v] for r, v in rounds.items()},
                                "slow": {str(r): x.to_dict() for r, x in slow.items()},
                                "slow_links": [[(r - 1) % n, r] for r in sorted(slow)], **load.evidence()})


# Rounds of DDP407: the offsets keep the round whose barrier waits were shortest; on a busy host
# (CPU shared with other jobs) three rounds left 20 ms of doubt, which hides a node's lag (DDP878).
CLOCK_ROUNDS = 8


@check("DDP407", category="communication", severity="warning", stage="group",
       title="node clocks disagree", timeout=60.0, cause_class="host", action="investigate")
def clock_skew(ctx: Any, group: Group) -> Iterator[Problem]:
    """
    What: Reads every rank's wall clock right after each of eight barriers and compares it with
    rank 0's, with the barrier's own duration as the uncertainty (the tightest round is kept);
    warns when a rank's clock is off by more than --max-clock-skew (1 s) beyond that uncertainty.
    Why: Skewed clocks make logs and traces of different nodes impossible to line up, break
    timestamp-based root-cause ordering, and can fail TLS and AWS request signing.
    Fix: Run a time service on every node (chrony or systemd-timesyncd; on EC2 the Amazon Time
    Sync Service at 169.254.169.123) and check `chronyc tracking`.
    """
    import time
    if group.world_size < 2:
        return
    world = sweep.world_comm(group)
    rows: list[float] = []
    for _ in range(CLOCK_ROUNDS):
        start = time.monotonic()
        world.wait(stragglers.barrier(world))
        wall = time.time()
        rows += [wall, time.monotonic() - start]
    gathered = world.gather_floats(rows)
    samples = {r: [(v[i], v[i + 1]) for i in range(0, len(v), 2)] for r, v in enumerate(gathered)}
    offsets = stragglers.clock_offsets(samples, ref=0)
    # kept for the training's verdict: nodes' arrivals at collectives compare on aligned clocks (DDP878)
    group.measurements["clock_offset_s"] = {str(r): round(o, 6) for r, (o, _) in offsets.items()}
    group.measurements["clock_uncertainty_s"] = {str(r): round(u, 6) for r, (_, u) in offsets.items()}
    limit = float(_opt(ctx, "max_clock_skew_s", stragglers.DEFAULT_MAX_CLOCK_SKEW_S))
    bad = stragglers.skewed(offsets, limit)
    if bad:
        listed = ", ".join(f"rank {r} {o:+.3f} s (+/- {u:.3f})" for r, (o, u) in sorted(bad.items()))
        yield Problem(message=f"wall clocks differ from rank 0's by more than {limit:g} s: {listed}",
                      ranks=tuple(sorted(bad)),
                      evidence={"offsets_s": {str(r): o for r, (o, _) in offsets.items()},
                                "uncertainty_s": {str(r): u for r, (_, u) in offsets.items()},
                                "max_skew_s": limit})
