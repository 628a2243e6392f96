"""What the bounded rendezvous observes (DDP310-DDP329; DDP846, two jobs at one store): the catalogue
entries, and the wording of each finding.

The machinery gathers the facts (preflight_ranks/: a rank's probe of the master, its meeting at
the store; training/run/agent.py: torch's launcher's own rendezvous under `ddp-doctor run`) into
the small dataclasses below and calls the functions here, so that the preflight's ranks and the
launcher say the same thing of the same observation; where their situations differ (a rank or a
launcher, ranks or nodes), that is a parameter.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.facts.ports import PortHolder
from ddp_doctor.findings import ROOT_CAUSE, Finding, Problem, brief_ranks, format_ranks
from ddp_doctor.registry import declare

SG_HINT = ("If the ranks are on different hosts, check that the network lets them talk: on AWS the "
           "security group needs a self-referencing rule allowing all traffic inbound AND outbound "
           "(SageMaker's documented requirement for multi-node jobs; EFA needs both directions).")

MASTER_UNRESOLVABLE = declare(
    "DDP310", category="network", severity="error", title="MASTER_ADDR does not resolve",
    doc="""
    What: The host name in MASTER_ADDR could not be resolved to an address on this rank.
    Why: Every rank connects to the rendezvous store on MASTER_ADDR:MASTER_PORT; a name that does
    not resolve fails at once or, with some resolvers, hangs until torch's 30-minute timeout.
    Fix: Set MASTER_ADDR to a name every node can resolve (or an IP address). On SageMaker use the
    master host the toolkit picks (SM_TRAINING_ENV master_hostname), never a hard-coded algo-1.
    """, cause_class="configuration")

MASTER_REFUSED = declare(
    "DDP311", category="network", severity="error", title="Rendezvous master refuses connections",
    doc="""
    What: MASTER_ADDR:MASTER_PORT answered, but nothing listened on the port for the whole bound.
    Why: The rank that should host the store (rank 0, or torchrun's agent on the master node) is
    not running, crashed, or listens on another port or host.
    Fix: Start rank 0 / the master node's launcher, and give every node the same --master-addr and
    --master-port; check that MASTER_ADDR names the host where rank 0 runs.
    """)

MASTER_TIMEOUT = declare(
    "DDP312", category="network", severity="error", title="Rendezvous master unreachable (timeout)",
    doc=f"""
    What: Connecting to MASTER_ADDR:MASTER_PORT timed out (no answer at all) for the whole bound.
    Why: Packets to the master are dropped: a firewall or security group blocks the port, or the
    address routes nowhere. Left alone, torch waits 30 minutes before failing.
    Fix: {SG_HINT}
    """, cause_class="network", action="investigate")

PORT_IN_USE = declare(
    "DDP313", category="network", severity="error", title="MASTER_PORT already in use",
    doc="""
    What: The process that hosts the rendezvous store (rank 0, or under `ddp-doctor run` the
    launcher on node 0) could not listen on MASTER_PORT because another process holds it; the
    finding names that process (pid and command line) when this host lets it be seen.
    Why: torch fails with "Address already in use" (EADDRINUSE, errno 98: often a previous job, a
    hung test or a dev server that still holds the port); no rank starts, and the other nodes
    wait for a master that never comes. No node is missing: this node could not host the meeting.
    Fix: Stop the process holding the port (`ss -ltnp 'sport = :PORT'`), or choose a free
    MASTER_PORT (torchrun --master-port, the same on every node), or for a single-node job leave
    --master-port out (`ddp-doctor run` then passes --standalone, which picks a free port).
    """)

MASTER_NOT_LOCAL = declare(
    "DDP314", category="network", severity="error", title="Rank 0 does not run on MASTER_ADDR",
    doc="""
    What: Rank 0 hosts the rendezvous store, but MASTER_ADDR resolves to no address of rank 0's host.
    Why: The other ranks connect to MASTER_ADDR and find no store there: they hang or are refused.
    Fix: Set MASTER_ADDR to the host where rank 0 runs (under mpirun: the first host of the host list).
    """, cause_class="configuration")

NOT_A_STORE = declare(
    "DDP315", category="network", severity="error", title="MASTER_PORT answers, but not as a torch store",
    doc="""
    What: MASTER_ADDR:MASTER_PORT accepts connections, but torch's store handshake fails or gets no
    answer there; the finding quotes what the peer sent (a banner, an HTTP reply) or that it
    stayed silent.
    Why: Another service holds the port on the master host (a web server, a notebook, a leftover
    process that accepts and never answers), so rank 0 could not host the store there (its own
    report says DDP313, MASTER_PORT already in use). Left alone, torch's store client waits for an
    answer without any timeout: the rank hangs forever.
    Fix: Give every rank a free MASTER_PORT (torchrun --master-port, the same on every node), or
    stop the service that holds it (`ss -ltnp 'sport = :PORT'` on the master host).
    """, cause_class="configuration")

RANKS_MISSING = declare(
    "DDP320", category="network", severity="error", title="Ranks missing at rendezvous",
    doc="""
    What: Not every rank of WORLD_SIZE checked in at the rendezvous store within the bound; the
    finding names the ranks that arrived and those that did not.
    Why: WORLD_SIZE is larger than the ranks launched (a node not started, --nnodes or
    --nproc-per-node wrong on one node), or the missing ranks cannot reach the master.
    Fix: Make WORLD_SIZE equal the ranks you launch (nodes x processes per node), start every node,
    and read the missing ranks' own reports for why they could not connect.
    """, cause_class="unknown")

PG_INIT_FAILED = declare(
    "DDP321", category="communication", severity="error", title="init_process_group failed",
    doc="""
    What: Every rank reached the store, but creating the process group failed or timed out.
    Why: The backend could not connect the ranks to each other (ports between the nodes blocked,
    a wrong network interface), or the backend is broken on this machine. When the error is CUDA's
    (the rank's GPU does not exist or cannot be used), the GPU is the cause and the hint says so.
    Fix: Check NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME and the network between the nodes; run with
    NCCL_DEBUG=INFO to see which connection fails.
    """, cause_class="network", action="investigate")

DUPLICATE_RANK = declare(
    "DDP322", category="launcher_env", severity="error", title="Two processes claim the same rank",
    doc="""
    What: More than one process checked in at the rendezvous with the same RANK. A later claimant
    says which process holds the rank (its host and pid) and how many claimed it.
    Why: The launcher gave two processes the same RANK (a node started twice, NODE_RANK repeated,
    a hand-written launch script with a fixed RANK), so another rank is missing and the job hangs.
    Fix: Give every node a distinct --node-rank and let the launcher set RANK.
    """, cause_class="configuration")

STORE_LOST = declare(
    "DDP323", category="network", severity="error", title="Lost the rendezvous store",
    doc="""
    What: The rendezvous store stopped answering while the ranks were exchanging their views.
    Why: The process hosting it (rank 0 or torchrun's agent) died or its host became unreachable.
    Fix: Read the hosting rank's report and stderr; it holds the first failure.
    """)

REPORTER_LOST = declare(
    "DDP324", category="network", severity="error", title="No verdict from the reporting rank",
    doc="""
    What: This rank handed its findings over but never received the merged verdict.
    Why: The reporting rank (rank 0) died or hung while merging; this rank wrote its own report.
    Fix: Read rank 0's stderr and the per-rank report files (PATH.rankN.json).
    """, cause_class="unknown")

VIEW_UNREADABLE = declare(
    "DDP325", category="consistency", severity="error", title="A rank's view could not be read",
    doc="""
    What: A rank checked in at the rendezvous, but what it put in the store is not a view the
    reporting rank's ddp-doctor can read, so the checks across ranks left that rank out.
    Why: The ranks run different ddp-doctor versions (the way a rank's view is put in the store
    changed between versions; a node with an older install or image), or another program wrote
    under ddp-doctor's keys in the store.
    Fix: Install one ddp-doctor version on every node (`pip show ddp-doctor` on each, or one image
    for all), then run the preflight again.
    """, cause_class="unknown")

PLANS_DIFFER = declare(
    "DDP326", category="consistency", severity="error", title="The ranks would run different group checks",
    doc="""
    What: Before the checks that run collectives (bandwidth, correctness, clocks), every rank sends
    the others a digest of its ddp-doctor version and the group checks it would run, in their
    order (one all_gather, bounded by the preflight's timeout). When the digests differ, or the
    exchange itself fails, no group check runs: the finding lists the ranks of each plan, and
    each plan (its checks and its ddp-doctor version) is in the finding's evidence, by rank. A
    failed exchange is a consequence of what failed first (a rank whose process group failed).
    Why: The group checks are collectives: every rank must call them in the same order, or one
    rank's check waits for a collective that another rank never calls until the timeout (and then
    reads as a crashed check). Ranks plan differently when their nodes have different ddp-doctor
    versions (an older install or image on one node) or were given different --select / --skip.
    Fix: Install one ddp-doctor version on every node (`pip show ddp-doctor` on each, or one image
    for all) and give every rank the same --select / --skip, then run the preflight again.
    """, cause_class="configuration")

SHARED_RENDEZVOUS = declare(
    "DDP846", category="launcher_env", severity="error",
    title="Two jobs share one rendezvous (MASTER_ADDR:MASTER_PORT)",
    doc="""
    What: More processes met at the rendezvous store than its world has ranks: a rank claimed by
    two processes, the ranks of a larger world (another job's, from rank WORLD_SIZE on), or a
    rank 0 that could not host the store because another job's rendezvous holds MASTER_PORT.
    The finding names every process it saw (rank, pid, host) and how many checked in for
    WORLD_SIZE.
    Why: Two jobs (or one job started twice) were given the same MASTER_ADDR and MASTER_PORT, as
    hand-written launch scripts with a fixed port do. Their processes meet in one store and form
    one group from parts of both: a job could train with another job's ranks while its own wait
    or fail. Every process that met there fails its preflight instead, so neither job reports a
    pass.
    Fix: Give each job its own MASTER_PORT (a free one: `torchrun --standalone` picks one for a
    one-node job; otherwise the same --master-port on every node of that job, and another for the
    next job), start each rank once, and end the extra processes the finding names.
    """, cause_class="configuration")


# ---------------------------------------------------------------- the facts the machinery gathers

MAX_NAMED = 16  # processes a crowd finding names (the count says how many more)
COULD_NOT_HOST = "could not host"  # why a rank 0 is among a store's extras (bounded_rendezvous.announce)


@dataclass
class Reach:
    """How a try to reach MASTER_ADDR:MASTER_PORT went (bounded_rendezvous.reach_master)."""
    ok: bool
    kind: str = ""        # "" | unresolvable | refused | timeout | unreachable | not_store
    detail: str = ""
    attempts: int = 0
    elapsed_s: float = 0.0
    answer: str = ""      # not_store: what the peer sent ("" when it stayed silent)


@dataclass(frozen=True)
class LauncherRendezvous:
    """The rendezvous of torch's elastic launcher under `ddp-doctor run` (training/run/agent.py), as
    its options give it, and torch's error when it failed: nodes meet there, not ranks, and while
    it fails no rank is started."""
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str  # or the --rdzv-endpoint's host
    master_port: int
    backend: str = "static"  # --rdzv-backend
    bound_s: float | None = None  # --rdzv-conf timeout / join_timeout
    error: str = ""  # torch's error, its first line

    @property
    def within(self) -> str:
        return f"within {self.bound_s:g} s" if self.bound_s else "in time"

    @property
    def node(self) -> str:
        """This node among the others, as a message starts."""
        return "one node" if self.nnodes <= 1 else f"node {self.node_rank} of --nnodes {self.nnodes}"

    def evidence(self) -> dict[str, Any]:
        return {"nnodes": self.nnodes, "node_rank": self.node_rank, "nproc_per_node": self.nproc_per_node,
                "master_addr": self.master_addr, "master_port": self.master_port, "rdzv_backend": self.backend,
                "bound_s": self.bound_s, "error": self.error}


@dataclass(frozen=True)
class PortTaken:
    """The process that hosts the rendezvous store could not listen on its port."""
    port: int
    hostname: str  # the host where it tried
    error: str  # the error that said so
    holders: tuple[PortHolder, ...] = ()  # who holds the port, where this host lets it be seen (facts/ports.py)
    launcher: LauncherRendezvous | None = None  # the launcher's store (`ddp-doctor run`); None: the preflight's rank 0


@dataclass(frozen=True)
class Missing:
    """Who did not come to a rendezvous by its bound. `launcher` None: the preflight's store, where
    each rank checks in by name (`arrived`, of `world_size`; `master_addr`/`master_port` when
    known). Else the launcher's own rendezvous (`ddp-doctor run`), which gives the world, bound and
    address: nodes meet there, and torch's store counts those that joined (`joined`, None when its
    error does not say) but names none."""
    world_size: int = 0
    arrived: tuple[int, ...] = ()
    bound_s: float | None = None
    master_addr: str | None = None
    master_port: int | None = None
    launcher: LauncherRendezvous | None = None
    joined: int | None = None


@dataclass
class Crowd:
    """More processes met at one store than its world has ranks: two jobs (or one job started
    twice) share MASTER_ADDR:MASTER_PORT."""
    world_size: int
    members: int  # processes that checked in as a rank nobody had claimed
    extra: int  # processes beyond them: second claimants, a rank 0 that could not host
    named: list[dict[str, Any]]  # up to MAX_NAMED of the extras, and the first claimant of each rank they claim

    @property
    def processes(self) -> int:
        return self.members + self.extra


@dataclass(frozen=True)
class PlanExchange:
    """What the ranks' exchange of their group checks' plans gave (preflight_ranks/group_plan.py)."""
    plan: tuple[str, ...]  # this rank's group checks, in their order
    version: str  # this rank's ddp-doctor
    digests: tuple[int, ...] | None = None  # every rank's plan digest, by rank; None: the exchange failed
    error_type: str = ""  # the failed exchange's exception
    error: str = ""


# ---------------------------------------------------------------- reaching the master

# the ID a failed reach is, by its kind; any other (timeout, unreachable: packets go nowhere) is DDP312
_REACH_ENTRIES = {"unresolvable": MASTER_UNRESOLVABLE, "refused": MASTER_REFUSED, "not_store": NOT_A_STORE}


def launcher_reaches_out(launcher: LauncherRendezvous) -> bool:
    """Whether the launcher's failed rendezvous means it could not reach (or set up) the store at
    MASTER_ADDR:MASTER_PORT (on a node other than node 0 of a static rendezvous, or in a one-node
    job: the machinery then probes it, for unreachable_finding), rather than that nodes never
    came to the one it hosts (ranks_missing_finding)."""
    return (launcher.node_rank != 0 and launcher.backend == "static") or launcher.nnodes <= 1


def _master(host: str, port: int, launcher: LauncherRendezvous | None) -> str:
    if launcher is not None and launcher.backend != "static":
        return f"--rdzv-endpoint {host}:{port}"
    return f"MASTER_ADDR={host} MASTER_PORT={port}"


def _reach_said(reach: Reach, bound_s: float) -> str:
    if reach.ok:  # only after the launcher's failure: the store answers by the time ddp-doctor looks
        return (f"a torch store answers there now ({reach.attempts} attempt(s)): it came too late, or the "
                "rendezvous failed once reached")
    if reach.kind == "unresolvable":
        return f"the name does not resolve on this host ({reach.detail})"
    if reach.kind == "refused":
        return f"connection refused for {bound_s:g} s ({reach.attempts} attempts): nothing listens there"
    if reach.kind == "not_store":
        return (f"the port accepts connections but no torch store answers there: {reach.detail}; expected the "
                "rendezvous store of rank 0 or of the launcher on the master node")
    return f"no connection within {bound_s:g} s ({reach.attempts} attempts; {reach.detail})"


def unreachable_finding(reach: Reach, host: str, port: int, bound_s: float, rank: int | None,
                        launcher: LauncherRendezvous | None = None) -> Finding:
    """DDP310 / DDP311 / DDP312 / DDP315: the rendezvous at host:port could not be reached, or no
    torch store answers there, as `reach` (a probe bounded by `bound_s`) found. `launcher`: the
    launcher's own rendezvous failed (`ddp-doctor run`) and `reach` is ddp-doctor's probe after
    it; None: a rank of the preflight tried."""
    entry = _REACH_ENTRIES.get(reach.kind, MASTER_TIMEOUT)
    said = f"{_master(host, port, launcher)}: {_reach_said(reach, bound_s)}"
    evidence: dict[str, Any] = {"master_addr": host, "master_port": port, "attempts": reach.attempts,
                                "elapsed_s": round(reach.elapsed_s, 3), "bound_s": bound_s, "detail": reach.detail}
    if reach.kind == "not_store":
        evidence.update(answer=reach.answer, silent=not reach.answer)
    hint: str | None = None  # the entry's Fix
    if reach.kind == "not_store":
        hosted_by = "rank 0" if launcher is None else "node 0"
        hint = (f"Another service holds port {port} on {host} ({hosted_by}'s own report says MASTER_PORT already "
                f"in use, {PORT_IN_USE.id}, when it runs there): give every rank a free MASTER_PORT (torchrun "
                f"--master-port), or stop that service (`ss -ltnp 'sport = :{port}'` on {host}).")
    if launcher is not None:
        evidence = {**evidence, "probe_bound_s": bound_s, **launcher.evidence()}
        if launcher.nnodes <= 1:
            tried = f"the launcher could not set up its rendezvous at {host}:{port}"
            hint = hint or (f"In a one-node job the launcher hosts the rendezvous itself: check that --master-addr "
                            f"{host} is an address of this host (or leave out --master-addr and --master-port: "
                            "`ddp-doctor run` then passes --standalone, which picks a free port).")
        else:
            tried = f"the launcher could not join the rendezvous of node 0 at {host}:{port}"
            hint = hint or ("Start node 0 first (or at about the same time), with the same --master-addr and "
                            f"--master-port as this node; check that {host} is node 0's address. {SG_HINT}")
        said = (f"{launcher.node}: {tried} {launcher.within} (torch: {launcher.error}); no rank was started on "
                f"this node; ddp-doctor's probe after it: {said}")
    return event_finding(entry, said, rank=rank, evidence=evidence, hint=hint)


def master_not_local_finding(master_addr: str, hostname: str, rank: int | None) -> Finding:
    """DDP314: rank 0 would host the store, but MASTER_ADDR is no address of its host."""
    return event_finding(MASTER_NOT_LOCAL, f"MASTER_ADDR={master_addr} is not an address of rank 0's host "
                         f"{hostname}", rank=rank, evidence={"master_addr": master_addr})


# ---------------------------------------------------------------- a store that cannot listen

def _cannot_listen(taken: PortTaken) -> str:
    launcher = taken.launcher
    if launcher is None:
        return f"rank 0 cannot listen on MASTER_PORT={taken.port} on host {taken.hostname}"
    name = f"MASTER_PORT={taken.port}" if launcher.backend == "static" else f"port {taken.port} of --rdzv-endpoint"
    return f"{launcher.node}: the launcher's rendezvous store cannot listen on {name} on host {taken.hostname}"


def port_in_use_finding(taken: PortTaken, rank: int | None) -> Finding:
    """DDP313: the store's host could not listen on its port, held by another process. Names the
    port and that process (pid and command line, or "an unknown process" when this host does not
    let it be seen), and the way out."""
    holders, launcher, port = taken.holders, taken.launcher, taken.port
    held_by = "; ".join(h.describe() for h in holders) if holders else PortHolder(None).describe()
    pids = [h.pid for h in holders if h.pid is not None]
    stop = f"stop that process (`kill {pids[0]}`)" if len(pids) == 1 else (
        f"stop the processes holding it (`kill {' '.join(map(str, pids))}`)" if pids
        else f"stop the process holding it (`ss -ltnp 'sport = :{port}'` names it, as root if need be)")
    evidence: dict[str, Any] = {**(launcher.evidence() if launcher else {}), "master_port": port,
                                "error": taken.error, "holders": [h.to_dict() for h in holders],
                                "hostname": taken.hostname}
    if launcher is None:
        message = f"{_cannot_listen(taken)}: the port is already in use, held by {held_by} ({taken.error})"
        hint = (f"Pick a free MASTER_PORT and give it to every rank (torchrun --master-port, the same on every node), "
                f"or {stop} on {taken.hostname}; a one-node job can leave the port to `torchrun --standalone`, "
                "which picks a free one.")
    else:
        message = (f"{_cannot_listen(taken)}: the port is already in use, held by {held_by}; no rank was started "
                   f"(torch: {taken.error})")
        option = "--master-port" if launcher.backend == "static" else "--rdzv-endpoint"
        if launcher.nnodes <= 1:
            leave = "--master-port (and --master-addr)" if launcher.backend == "static" else "--rdzv-endpoint"
            hint = (f"Pick a free port ({option} with another port), or {stop}, or leave out {leave}: on one "
                    f"node `ddp-doctor run` then passes --standalone, which picks a free port.")
        else:
            hint = (f"Pick a free port and give it to every node ({option}, the same on each), or {stop} "
                    f"on {taken.hostname}.")
    return event_finding(PORT_IN_USE, message, rank=rank, evidence=evidence, hint=hint)


def shared_rendezvous_finding(crowd: Crowd, host: str, port: int, rank: int | None,
                              taken: PortTaken | None = None) -> Finding:
    """DDP846: more processes met at the store than its world has ranks. `taken`: this rank 0
    could not host the store, and found another job's rendezvous on its port."""
    by_rank: dict[Any, list[str]] = {}
    for p in crowd.named:
        note = " (could not host the store: the port was taken)" if p.get("why") == COULD_NOT_HOST else ""
        by_rank.setdefault(p.get("rank"), []).append(f"pid {p.get('pid')} on host {p.get('host')}{note}")
    said = "; ".join(f"rank {r}: {', '.join(who)}" for r, who in sorted(by_rank.items(), key=lambda i: str(i[0])))
    more = crowd.extra - min(crowd.extra, MAX_NAMED)
    ranks = sorted(r for r in by_rank if isinstance(r, int))
    evidence: dict[str, Any] = {"master_addr": host, "master_port": port, "world_size": crowd.world_size,
                                "members": crowd.members, "extra": crowd.extra, "processes": crowd.named}
    if taken is not None:
        evidence["error"] = taken.error
    return event_finding(
        SHARED_RENDEZVOUS,
        (f"{_cannot_listen(taken)}: {taken.error}; another job's rendezvous holds it: " if taken else "")
        + f"{crowd.processes} processes met at the rendezvous on MASTER_ADDR={host} MASTER_PORT={port} for "
        f"WORLD_SIZE={crowd.world_size} ({crowd.members} as distinct ranks, {crowd.extra} more)"
        + (f": {said}" if said else "") + (f"; and {more} more not named" if more > 0 else "")
        + ": two jobs, or one job started twice, share this MASTER_ADDR:MASTER_PORT; every process "
        "there fails its preflight", rank=rank, ranks=ranks or None, evidence=evidence)


# ---------------------------------------------------------------- the meeting

def _missing_nodes(launcher: LauncherRendezvous, joined: int | None) -> tuple[list[int], str]:
    """(the nodes known missing, the words for those missing): torch's store counts the nodes that
    joined but does not name them, so only a count that leaves out every other node names them."""
    others = [n for n in range(launcher.nnodes) if n != launcher.node_rank]
    nodes = f"node{'s' if len(others) > 1 else ''} {format_ranks(others)}"
    if len(others) == 1 or (joined is not None and launcher.nnodes - joined == len(others)):
        return others, nodes
    if joined is not None:
        return [], (f"{launcher.nnodes - joined} of {nodes} (the launcher's store counts the nodes that arrived, "
                    "it does not name them)")
    return [], f"at least one of {nodes}"


def ranks_missing_finding(missing: Missing, rank: int | None) -> Finding:
    """DDP320: not every rank (or node, at the launcher's rendezvous) came by the bound. The hint is
    the same for both: start them all, and check that the missing ones can reach the master."""
    launcher = missing.launcher
    host: str | None = launcher.master_addr if launcher is not None else missing.master_addr
    port: int | None = launcher.master_port if launcher is not None else missing.master_port
    known = host is not None and port is not None
    master = f"{host}:{port}" if known else "MASTER_ADDR:MASTER_PORT"
    if launcher is None:
        arrived = sorted(missing.arrived)
        came = set(arrived)
        gone = [r for r in range(missing.world_size) if r not in came]
        at = f" at the rendezvous on MASTER_ADDR={host} MASTER_PORT={port}" if known else ""
        bound = f"within {missing.bound_s:g} s" if missing.bound_s is not None else "in time"
        message = (f"WORLD_SIZE={missing.world_size} but only {len(arrived)} rank(s) checked in{at} {bound}: "
                   f"arrived {brief_ranks(arrived) or 'none'}; missing {brief_ranks(gone) or 'none'}")
        hint = ("Make WORLD_SIZE equal the ranks you launch (nodes x processes per node) and start every node; "
                "check that the missing ranks started at all (their own reports say why they could not connect), "
                f"and that they can reach {master}. {SG_HINT}")
        evidence: dict[str, Any] = {"world_size": missing.world_size, "arrived": arrived, "missing": gone,
                                    "check_ins": len(arrived), "timeout_s": missing.bound_s}
        if known:
            evidence.update(master_addr=host, master_port=port)
        return event_finding(RANKS_MISSING, message, rank=rank,
                             ranks=gone or ([rank] if rank is not None else None), evidence=evidence, hint=hint)
    nodes, which = _missing_nodes(launcher, missing.joined)
    ranks = [n * launcher.nproc_per_node + i for n in nodes for i in range(launcher.nproc_per_node)]
    arrived_said = (f"{missing.joined} of {launcher.nnodes} nodes arrived" if missing.joined is not None
                    else f"{launcher.backend} rendezvous")
    message = (f"--nnodes {launcher.nnodes}: {which} never joined the launcher's rendezvous at {master} "
               f"{launcher.within} ({arrived_said}; torch: {launcher.error}); no rank was started, on this node "
               f"(node {launcher.node_rank}) or any other")
    hint = ("Start every node with the same --nnodes, --master-addr and --master-port and a distinct --node-rank; "
            "check that the missing node started at all (its own log or report), and that it can reach "
            f"{master}. {SG_HINT}")
    evidence = {**launcher.evidence(), "missing_nodes": nodes, "joined": missing.joined, "missing_ranks": ranks}
    return event_finding(RANKS_MISSING, message, rank=rank, ranks=ranks or None, evidence=evidence, hint=hint)


def duplicate_rank_finding(rank: int, claims: int, hostname: Any, pid: Any,
                           first: dict[str, Any] | None) -> Finding:
    """DDP322: this process claimed a rank another process holds (`first`: its host and pid, when
    its record says)."""
    return event_finding(
        DUPLICATE_RANK, f"RANK={rank} was claimed by {claims} processes (this one on host {hostname}, pid {pid}"
        + (f"; the first on host {first['host']}, pid {first['pid']})" if first else ")"), rank=rank,
        evidence={"rank": rank, "claims": claims, **({"first": first} if first else {})})


# CUDA's own errors at a group's creation (NCCL sets the rank's device up first): the GPU, not the
# network. A device index beyond the visible ones is the launch's configuration; another CUDA error
# (a GPU in exclusive-process mode held by another process, a GPU fallen off the bus) is the host's.
_NO_SUCH_GPU = re.compile(r"invalid device ordinal|no CUDA GPUs are available|no CUDA-capable device", re.I)
_CUDA_ERROR = re.compile(r"\bCUDA error\b|cudaError|CUDA driver", re.I)
GPU_HINT = ("The error is the rank's GPU's, not the network's: check that each rank's device exists "
            "(one process per visible GPU, torch.cuda.device_count(), CUDA_VISIBLE_DEVICES) and can be used "
            "(`nvidia-smi`: compute mode Default, not held by another process, no Xid errors).")


def pg_init_failed_finding(backend: str | None, world_size: int, rank: int, error_type: str,
                           error: str) -> Finding:
    """DDP321: every rank met at the store, and init_process_group raised on this one; a CUDA
    error is worded as the GPU's (configuration for a device that does not exist, else the host)."""
    message = f"init_process_group(backend={backend!r}, world_size={world_size}) failed on rank {rank}: " \
              f"{error_type}: {error}"
    evidence = {"backend": backend, "error": error}
    no_gpu = _NO_SUCH_GPU.search(error) is not None
    if no_gpu or _CUDA_ERROR.search(error):
        kind = ("configuration", "fix_configuration") if no_gpu else ("host", "investigate")
        problem = Problem(message=message, hint=GPU_HINT, evidence={**evidence, "gpu": True},
                          cause_class=kind[0], action=kind[1])
        return PG_INIT_FAILED.finding(problem, rank, "preflight")
    return event_finding(PG_INIT_FAILED, message, rank=rank, evidence=evidence)


def store_lost_finding(error: str, rank: int | None, *, at: tuple[str, int] | None = None,
                       hosting: bool = False) -> Finding:
    """DDP323: the store could not be set up (`at`: its address; `hosting`: this rank was to host
    it), or it stopped answering while in use."""
    if at is not None:
        message = f"could not {'host' if hosting else 'connect to'} the store at {at[0]}:{at[1]}: {error}"
    else:
        message = f"the rendezvous store stopped answering: {error}"
    return event_finding(STORE_LOST, message, rank=rank, evidence={"error": error})


def reporter_lost_finding(rank: int, waited_s: float) -> Finding:
    """DDP324: this rank handed its findings over and waited `waited_s` for a verdict in vain."""
    return event_finding(REPORTER_LOST, f"rank {rank} got no verdict from the reporting rank within "
                         f"{waited_s:g} s", rank=rank)


def unreadable_finding(unreadable: dict[int, str], rank: int | None, version: str) -> Finding | None:
    """DDP325 for the ranks whose record in the store is no view this reader (of ddp-doctor
    `version`) reads, with why; None when there are none."""
    if not unreadable:
        return None
    ranks = sorted(unreadable)
    first = ranks[0]
    return event_finding(
        VIEW_UNREADABLE, f"rank(s) {brief_ranks(ranks)} checked in at the rendezvous, but what they put in the "
        f"store is no view this ddp-doctor ({version}) reads (rank {first}: {unreadable[first]}): the checks "
        f"across ranks left them out", rank=rank, ranks=ranks,
        evidence={"ranks": ranks, "why": {str(r): unreadable[r] for r in ranks[:16]}, "ddp_doctor": version})


def plans_differ_finding(exchange: PlanExchange, rank: int | None) -> Finding | None:
    """None when every rank would run this rank's group checks with its ddp-doctor version; else
    DDP326 (the same message on every rank, each rank's plan in its evidence). A failed exchange is
    a consequence of what failed first."""
    evidence: dict[str, Any] = {"plan": list(exchange.plan), "ddp_doctor": exchange.version}
    if exchange.digests is None:  # a rank whose init failed never comes to the exchange
        return event_finding(
            PLANS_DIFFER, "the ranks could not compare the group checks they would run before running "
            f"them ({exchange.error_type}: {exchange.error}): none ran; a rank whose process group failed, or "
            "one of another ddp-doctor version calling other collectives, leaves the others waiting here",
            rank=rank, evidence={**evidence, "error": exchange.error}, caused_by=ROOT_CAUSE)
    if len(set(exchange.digests)) == 1:
        return None
    by_digest: dict[int, list[int]] = {}
    for r, digest in enumerate(exchange.digests):
        by_digest.setdefault(digest, []).append(r)
    plans = sorted(by_digest.values())
    return event_finding(
        PLANS_DIFFER, f"the ranks would run different group checks ({len(plans)} plans: "
        + "; ".join(f"rank(s) {brief_ranks(rs)}" for rs in plans)
        + "), which are collectives every rank must call in the same order: none ran (each plan, its "
        "checks and its ddp-doctor version, is in the evidence by rank)", rank=rank, evidence=evidence)
