"""init_process_group's arguments (DDP867-DDP869, DDP874, DDP875, DDP881): a rank or world size written
by hand, rendezvous variables the script changed before init, a world size of 0, a rank outside
the world, ranks that went to different rendezvous; and launched ranks that never formed a
process group at all (DDP876).

Pure functions over the init-PID.json records (training/probes/init_calls.py): each holds what
one process passed (rank=, world_size=, init_method, as values and as the source text at the
call), the rendezvous variables at the call, and, for a process the launcher started, the
launcher's RANK / WORLD_SIZE and the variables as they were when the script started; for a child
of torch.multiprocessing.spawn, how many processes that spawn started. Judged from what the
processes did, at once: these mistakes leave the ranks waiting inside init_process_group until
torch's timeout (30 minutes by default), or fail in it with torch's own words.

Processes the script starts itself (mp.spawn, multiprocessing, subprocess) have no launcher to
compare with: their world size is compared with the processes that called init for the same
rendezvous, only where no other process can join it (a loopback address) and once every process
that could call has called (`settled`: the caller waited; or every child of the spawn did).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

DUPLICATE_RANK = declare(
    "DDP867", category="init_order", severity="error", title="Several processes joined with the same rank",
    doc="""
    What: Two or more processes called init_process_group for the same rendezvous with the same
    rank (a `rank=0` written by hand, or RANK overwritten), while the launcher numbered them apart.
    The finding names the processes, the rank they passed, the launcher's RANK for each, and the line.
    Across nodes (`rank=LOCAL_RANK`, a wrong node_rank), judged from the claims each process puts in
    the job's store at init (torchrun's agent store): both hosts and pids, and the line that
    computed the rank; without a reachable store a duplicate across nodes cannot be told.
    After the fact (`ddp-doctor analyze`, no record of the calls): the process the launcher started
    as rank r was itself waiting in init for rank r's key when the group's timeout ended it.
    Why: The rendezvous waits until every rank from 0 to world_size-1 has joined; with a rank
    taken twice one is never filled and every process waits inside init_process_group until the
    timeout (30 minutes by default), with no error.
    Fix: Leave rank and world_size out (`init_process_group(backend)` reads RANK and WORLD_SIZE the
    launcher set), or pass `rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])`.
    """, cause_class="configuration")

WORLD_SIZE_DIFFERS = declare(
    "DDP868", category="init_order", severity="error", title="World size differs from the processes launched",
    doc="""
    What: init_process_group was asked for a world size other than the number of processes the
    launcher started: `world_size=` passed by hand, or WORLD_SIZE changed by the script before init.
    For processes the script started itself (torch.multiprocessing.spawn, multiprocessing), a world
    size larger than the processes that spawn started, or than the processes that called init for a
    rendezvous on a loopback address (no other host can join it). The finding quotes the value at
    init, where it came from and the call's line, and how many processes were started.
    After the fact (`ddp-doctor analyze`): the ranks' init waited for a rank the launcher never
    started (or the store for more processes than it started) when the group's timeout ended it.
    Why: With more ranks expected than started, the rendezvous waits for ranks that will never
    come until the timeout; with fewer, the extra ranks fail or join another job's numbering.
    ddp-doctor ends such a job once every process has called init (exit status 124).
    Fix: Take the world size from the launcher (leave world_size out, do not assign
    os.environ["WORLD_SIZE"]), and start as many processes as the job needs (`--nproc-per-node`
    x `--nnodes`); with torch.multiprocessing.spawn, pass `world_size=nprocs` (the same number
    you give spawn).
    """, cause_class="configuration")

RANK_DIFFERS = declare(
    "DDP869", category="init_order", severity="warning", title="Rank passed to init differs from the launcher's",
    doc="""
    What: A process the launcher started as RANK=r joined the process group as another rank (a
    `rank=` argument or a RANK the script changed), though no two processes took the same rank.
    Why: The launcher's RANK, LOCAL_RANK and the GPU each process uses agree; a renumbered rank
    breaks that (rank 0's duties such as checkpoints and logging move, data shards are assigned
    by the new number, and `LOCAL_RANK`-based device choice no longer matches).
    Fix: Use the launcher's RANK (leave rank out of init_process_group), or renumber on purpose
    and derive the device and data shard from the same number.
    """, cause_class="configuration")


WORLD_SIZE_NOT_POSITIVE = declare(
    "DDP874", category="init_order", severity="error", title="World size at init is zero or negative",
    doc="""
    What: init_process_group was given a world size of 0 or less: `world_size=` passed with such
    a value (often computed: a GPU count on a host without GPUs, `torch.cuda.device_count()` or
    Trainer's `n_gpu` on CPU), or WORLD_SIZE set to it. The finding names the argument, its value,
    the expression it came from and the line of the call, in launched ranks and in processes the
    script started itself (torch.multiprocessing.spawn).
    Why: A process group needs at least one process; torch refuses it with a bare "TCPStore world
    size cannot be 0" or "rank < size" deep inside the rendezvous, which names neither the
    argument nor the line that computed it.
    Fix: Pass the number of processes that take part: the launcher's WORLD_SIZE (leave world_size
    out), or the `nprocs` you give torch.multiprocessing.spawn; do not derive it from a GPU count
    on a CPU host.
    """, cause_class="configuration")

RANK_OUT_OF_RANGE = declare(
    "DDP875", category="init_order", severity="error", title="Rank at init outside the world",
    doc="""
    What: init_process_group was given a rank outside 0 to world_size-1 (a negative rank, or one
    equal to or above the world size): `rank=` passed by hand (an index offset by one, a global
    rank computed with the wrong number of nodes) or RANK set to it. The finding names the
    process, the rank, the world size, where each came from and the line of the call.
    Why: The rendezvous waits for the ranks 0 to world_size-1; a rank outside them never fills
    a place, so every process waits inside init_process_group until torch's timeout (30 minutes
    by default), or gloo aborts with "rank < size". ddp-doctor ends such a job (exit status 124).
    Fix: Number the processes 0 to world_size-1: with torch.multiprocessing.spawn the index it
    passes (the function's first argument), offset by node_rank x nprocs on several nodes, with
    world_size = nnodes x nprocs; under a launcher leave rank out (RANK is read).
    """, cause_class="configuration")

NO_PROCESS_GROUP = declare(
    "DDP876", category="init_order", severity="warning", title="Ranks trained without a process group",
    doc="""
    What: Several ranks were launched and ended well, but never called init_process_group (nor
    did anything they called form a process group): judged from what each rank left (its
    init_process_group record, its probe record and its ledger of collectives), not from the
    script's text. Only when more than one rank was launched. A rank that ended without a training
    step is named too (nothing ran distributed: a script that finds too few GPUs, prints so and
    returns ends well on every rank); ranks whose data were split by rank (a DistributedSampler given
    num_replicas and rank by hand) trained independent models on their shards, and the finding
    says so with the DataLoader's line.
    Why: Each rank then trains its own copy of the model on its own data: nothing is averaged,
    the job takes as long as one process and ends with as many different models, and rank 0's
    checkpoint holds one of them. No error is ever raised; a job that did nothing reads as a pass.
    Fix: Call `torch.distributed.init_process_group()` (backend "nccl" on GPUs, "gloo" on CPU)
    before wrapping the model in DistributedDataParallel. With a framework, let it see the
    launcher's variables: the Hugging Face Trainer (accelerate) trains distributed only when
    LOCAL_RANK is set (do not clear it) and, on a host without GPUs, only with `--use_cpu`;
    Lightning needs `strategy="ddp"` and devices / num_nodes matching the launcher.
    """)

SPLIT_RENDEZVOUS = declare(
    "DDP881", category="init_order", severity="error", title="Ranks went to different rendezvous",
    doc="""
    What: The processes of one job (the ranks one launcher started, or the children of one
    torch.multiprocessing.spawn) called init_process_group at different rendezvous (another
    MASTER_ADDR or MASTER_PORT at the call, another init_method), and at none of them can the whole
    world meet. Judged from what each process passed (its init record) while its init had not
    returned well; the finding names where each rank went and the line that set the variable,
    when the script set it.
    Why: A process group forms only where all of its ranks arrive. A port each process picks for
    itself (a free-port search run in every worker), a port computed from the rank, or a
    MASTER_PORT one rank overrides leaves every rank waiting at its own store until torch's
    timeout (30 minutes by default): torch then says only that a store wait timed out, or that
    1 of 2 clients joined.
    Fix: Give every rank the same rendezvous: under a launcher (torchrun, `ddp-doctor run`) leave
    MASTER_ADDR and MASTER_PORT as it set them; with torch.multiprocessing.spawn, choose the port
    once in the parent, before spawn, so every child inherits the same value.
    """)

NO_GROUP_HINT = ("Call torch.distributed.init_process_group() (\"nccl\" on GPUs, \"gloo\" on CPU) before "
                 "wrapping the model in DistributedDataParallel; with a framework, pass it the launcher's "
                 "environment: the Hugging Face Trainer trains distributed only when LOCAL_RANK is set, and on "
                 "a host without GPUs only with --use_cpu.")

LOOPBACK = ("127.", "localhost", "::1", "[::1]", "ip6-localhost")


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _passed(call: dict[str, Any], name: str) -> int | None:
    """The value passed for `name` (rank / world_size), torch's default -1 included; records
    written before the raw values were kept hold only the usable ones (rank_arg, world_size_arg)."""
    if f"{name}_passed" in call:
        v = call.get(f"{name}_passed")
    else:
        v = call.get(f"{name}_arg")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _scheme(call: dict[str, Any]) -> str:
    method = call.get("init_method")
    return str(method).split("://", 1)[0] if method and "://" in str(method) else "env"


def _query(call: dict[str, Any]) -> dict[str, str]:
    method = call.get("init_method")
    if not method:
        return {}
    try:
        return {k: v[-1] for k, v in parse_qs(urlsplit(str(method)).query).items() if v}
    except ValueError:
        return {}


def _value(call: dict[str, Any], name: str) -> tuple[int | None, str]:
    """The rank or world size init used, and where it came from: the argument (with its source
    text), init_method's query, or the environment (env:// reads RANK / WORLD_SIZE)."""
    passed = _passed(call, name)
    if passed is not None and passed != -1:  # -1: torch's default, "read it from the rendezvous"
        text = (call.get("arg_text") or {}).get(name)
        return passed, f"{name}={text if text and text != str(passed) else passed} passed"
    q = _query(call).get(name)
    if q is not None:
        return _int(q), f"{name}={q} in init_method {call.get('init_method')!r}"
    if _scheme(call) != "env":
        return None, ""
    key = name.upper()
    now = (call.get("env") or {}).get(key)
    before = ((call.get("launcher") or {}).get("env") or {}).get(key)
    if _launcher_world(call) is not None and before != now:
        return _int(now), f"{key}={now!r} in the environment (the launcher set {before!r}; the script changed it)"
    return _int(now), f"{key}={now!r} in the environment"


def _effective(call: dict[str, Any], name: str) -> int | None:
    return _value(call, name)[0]


def effective_rank(call: dict[str, Any]) -> int | None:
    """The rank init_process_group was asked for in `call` (the argument, init_method's query, or
    RANK at the call): the rank the process claims in the job's store (probes/rank_claims.py)."""
    return _effective(call, "rank")


def _identity(call: dict[str, Any]) -> tuple[Any, Any]:
    return call.get("host"), call.get("pid")


def other_claims(call: dict[str, Any]) -> list[dict[str, Any]]:
    """The claims of the same rank by other processes that this process found in the job's store
    (its record's `claims.others`, probes/rank_claims.py): each as a call record of its own,
    marked `claimed`. Its own earlier claims (a second init in the same process) are left out."""
    claims = call.get("claims")
    if not isinstance(claims, dict):
        return []
    out = []
    for other in claims.get("others") or []:
        if isinstance(other, dict) and _identity(other) != _identity(call) and other.get("pid") is not None:
            out.append({**other, "claimed": True, "done": False})
    return out


def waiting_in_init(call: dict[str, Any]) -> bool:
    """Whether the process waits inside init_process_group, or its init failed while another
    process on another host held its rank (the job's store went with the node whose verdict
    ended the job first: the failure is the duplicate's consequence)."""
    if not call.get("done"):
        return True
    return not call.get("ok") and any(o.get("host") != call.get("host") for o in other_claims(call))


def _how(call: dict[str, Any], name: str) -> str:
    """Where the value init used came from: the argument, or the variable the script changed."""
    return _value(call, name)[1]


def _rendezvous(call: dict[str, Any]) -> str | None:
    """Which rendezvous the call joins; None for a store the script built itself (not compared)."""
    if call.get("store_given"):
        return None
    method = call.get("init_method")
    if method and not str(method).startswith("env://"):
        return str(method).split("?", 1)[0]
    env = call.get("env") or {}
    return f"env://{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"


def _loopback(rendezvous: str) -> bool:
    """Whether only this host can join the rendezvous (tcp://127.0.0.1:P, env:// with a loopback
    MASTER_ADDR): its processes are all the processes it will ever have."""
    if not rendezvous.startswith(("tcp://", "env://")):
        return False  # file://: a shared file system may be reached from other hosts
    host = rendezvous.split("://", 1)[1].rsplit(":", 1)[0]
    return host.startswith(LOOPBACK)


def _launcher_rank(call: dict[str, Any]) -> int | None:
    return _int((call.get("launcher") or {}).get("rank"))


def _launcher_world(call: dict[str, Any]) -> int | None:
    return _int((call.get("launcher") or {}).get("world_size")) if call.get("launched_rank") else None


def _spawn(call: dict[str, Any]) -> dict[str, Any]:
    spawn = call.get("spawn")
    return spawn if isinstance(spawn, dict) else {}


def _spawn_index(call: dict[str, Any]) -> int | None:
    i = _spawn(call).get("index")
    return i if isinstance(i, int) else None


def process_number(call: dict[str, Any]) -> int | None:
    """The number a report gives the process: the launcher's rank, or its index among the children
    of torch.multiprocessing.spawn (as DDP805 numbers a failed child)."""
    r = _launcher_rank(call)
    return r if r is not None else _spawn_index(call)


def _site(call: dict[str, Any]) -> str:
    return f" at {call['site']}" if call.get("site") else ""


def _who(calls: list[dict[str, Any]]) -> tuple[str, list[int]]:
    ranks = [r for r in (_launcher_rank(c) for c in calls) if r is not None]
    if len(ranks) == len(calls):
        return (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"), sorted(ranks)
    spawned = [i for i in (_spawn_index(c) for c in calls) if i is not None]
    if len(spawned) == len(calls) and len(set(spawned)) == len(spawned):
        return (f"spawned process {spawned[0]}" if len(spawned) == 1
                else f"spawned processes {format_ranks(spawned)}"), sorted(spawned)
    if not ranks and not spawned:
        pids = ", ".join(str(c.get("pid")) for c in calls)
        if len(calls) == 1 and calls[0].get("launched_rank"):
            return f"the script's process (pid {pids})", []
        return (f"process {pids}" if len(calls) == 1 else f"processes {pids}"), []
    labels = []
    for c in calls:
        r, i = _launcher_rank(c), _spawn_index(c)
        labels.append(f"rank {r}" if r is not None else f"spawned process {i}" if i is not None
                      else f"the script's process (pid {c.get('pid')})" if c.get("launched_rank")
                      else f"process {c.get('pid')}")
    return ", ".join(labels), sorted(ranks or spawned)


def _order(c: dict[str, Any]) -> tuple[Any, ...]:
    n = process_number(c)
    return (n is None, _launcher_rank(c) is None, n or 0, c.get("pid") or 0)


def init_argument_findings(calls: list[dict[str, Any]], *, settled: bool = False) -> list[Finding]:
    """Findings over every init_process_group call recorded (one per process). `settled`: every
    process that will call init has called (the caller waited for them); without it a world size
    is compared with the processes that called only where every child of their spawn has called."""
    findings: list[Finding] = []
    # by the launcher's rank (or the spawn's index), not in the order the processes called init
    calls = sorted(calls, key=_order)

    # world_size 0 or negative: no rendezvous can form (torch fails at once, or gloo aborts)
    not_positive: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for c in calls:
        world, how = _value(c, "world_size")
        if world is not None and world <= 0:
            not_positive.setdefault((world, how, c.get("site")), []).append(c)
    bad_world = {c.get("pid") for same in not_positive.values() for c in same}
    for (world, how, site), same in not_positive.items():
        who, ranks = _who(same)
        findings.append(event_finding(
            WORLD_SIZE_NOT_POSITIVE, f"{who} called init_process_group with world_size={world} "
            f"({how}{' at ' + site if site else ''}): a process group needs at least one process",
            rank=None, ranks=ranks, phase="training",
            evidence={"world_size": world, "source": how, "site": site, "calls": [_evidence(c) for c in same]}))

    # a rank outside 0..world_size-1: it never fills a place of the rendezvous
    outside: dict[tuple[int, str, Any], list[dict[str, Any]]] = {}  # (world size, its source, site) -> calls
    for c in calls:
        if c.get("pid") in bad_world:
            continue
        rank, world = _effective(c, "rank"), _effective(c, "world_size")
        if rank is not None and world is not None and world > 0 and not 0 <= rank < world:
            outside.setdefault((world, _how(c, "world_size"), c.get("site")), []).append(c)
    out_of_range = {c.get("pid") for same in outside.values() for c in same}
    for (world, world_how, site), same in outside.items():
        who, ranks = _who(same)
        values = [_effective(c, "rank") for c in same]
        rank_how = _how(same[0], "rank")
        said = f"rank={values[0]}" if len(set(values)) == 1 else "ranks " + ", ".join(str(v) for v in values)
        findings.append(event_finding(
            RANK_OUT_OF_RANGE, f"{who} called init_process_group with {said} ({rank_how}"
            f"{' at ' + site if site else ''}), outside 0-{world - 1} for world_size={world} ({world_how})",
            rank=None, ranks=ranks, phase="training",
            evidence={"ranks_passed": values, "world_size": world, "rank_source": rank_how,
                      "world_size_source": world_how, "site": site, "calls": [_evidence(c) for c in same]}))

    by_rdzv: dict[str, list[dict[str, Any]]] = {}
    for c in calls:
        key = _rendezvous(c)
        if key is not None:
            by_rdzv.setdefault(key, []).append(c)

    duplicated: set[int | None] = set()  # pids (None: a record without one)
    for group in _with_claims(by_rdzv, calls).values():
        by_rank: dict[int, list[dict[str, Any]]] = {}
        for c in group:
            r = _effective(c, "rank")
            if r is not None and (c.get("claimed") or c.get("pid") not in bad_world | out_of_range):
                by_rank.setdefault(r, []).append(c)
        for r, same in sorted(by_rank.items()):
            if len(same) < 2:
                continue
            same = sorted(same, key=_order)
            duplicated |= {c.get("pid") for c in same if not c.get("claimed")}
            findings.append(_duplicate_finding(r, same))

    wrong_world: dict[tuple[Any, ...], list[dict[str, Any]]] = {}  # one finding per way it happened
    for c in calls:
        launcher_world = _launcher_world(c)
        if launcher_world is None or c.get("pid") in bad_world:
            continue  # a process the script started (mp.spawn) numbers its own world: below
        world = _effective(c, "world_size")
        if world is not None and world != launcher_world:
            way = (world, launcher_world, _how(c, "world_size"), c.get("site"))
            wrong_world.setdefault(way, []).append(c)
        rank, launcher_rank = _effective(c, "rank"), _launcher_rank(c)
        if (rank is not None and launcher_rank is not None and rank != launcher_rank
                and c.get("pid") not in duplicated | out_of_range):
            findings.append(event_finding(
                RANK_DIFFERS, f"rank {launcher_rank} joined as rank {rank} ({_how(c, 'rank')}"
                f"{_site(c)}); the launcher gave RANK={launcher_rank}", rank=launcher_rank, phase="training",
                evidence={"rank": rank, "launcher_rank": launcher_rank, "call": _evidence(c)}))
    for (world, launcher_world, how, site), same in wrong_world.items():
        who, ranks = _who(same)
        findings.append(event_finding(
            WORLD_SIZE_DIFFERS, f"{who} joined a world of {world} ({how}{' at ' + site if site else ''}); "
            f"the launcher started {launcher_world}", rank=None, ranks=ranks, phase="training",
            evidence={"world_size": world, "launcher_world_size": launcher_world,
                      "calls": [_evidence(c) for c in same]}))

    for rdzv, group in by_rdzv.items():
        found = _world_beyond_started(rdzv, group, bad_world, settled)
        if found is not None:
            findings.append(found)
    findings += _split_rendezvous(calls, bad_world | out_of_range | duplicated)
    return findings


def _cohort(call: dict[str, Any]) -> tuple[Any, ...] | None:
    """The processes that must meet at one rendezvous: the ranks one launcher started on this
    host, or the children of one torch.multiprocessing.spawn; None for any other process."""
    if _launcher_world(call) is not None:
        return ("launched", call.get("host"))
    parent = _spawn(call).get("parent")
    return ("spawn", call.get("host"), parent) if parent is not None else None


def _launcher_rendezvous(call: dict[str, Any]) -> str | None:
    """env://MASTER_ADDR:MASTER_PORT as the launcher set them, for a launched rank."""
    env = (call.get("launcher") or {}).get("env") or {}
    if _launcher_world(call) is None or not env.get("MASTER_PORT"):
        return None
    return f"env://{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"


def _split_rendezvous(calls: list[dict[str, Any]], judged: set[Any]) -> list[Finding]:
    """DDP881: a cohort whose processes, their init not returned well, went to two or more
    rendezvous, none of which can hold the whole world. A process whose init returned well met its
    group (a script that re-initialises on another port is not split): it is left out."""
    cohorts: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for c in calls:
        key = _cohort(c)
        if key is not None and _rendezvous(c) is not None and not (c.get("done") and c.get("ok")) \
                and c.get("pid") not in judged:
            cohorts.setdefault(key, []).append(c)
    findings = []
    for group in cohorts.values():
        by_rdzv: dict[str, list[dict[str, Any]]] = {}
        for c in sorted(group, key=_order):
            by_rdzv.setdefault(str(_rendezvous(c)), []).append(c)
        worlds = {_effective(c, "world_size") for c in group}
        if len(by_rdzv) < 2 or len(worlds) != 1 or None in worlds:
            continue
        world = int(next(iter(worlds)))  # type: ignore[arg-type]
        if any(len(at) >= world for at in by_rdzv.values()):
            continue  # a rendezvous that can form alone: two groups on purpose
        findings.append(_split_finding(by_rdzv, world))
    return findings


def _split_finding(by_rdzv: dict[str, list[dict[str, Any]]], world: int) -> Finding:
    everyone = [c for at in by_rdzv.values() for c in at]
    launcher = {_launcher_rendezvous(c) for c in everyone} - {None}
    given = next(iter(launcher)) if len(launcher) == 1 else None
    sizes = sorted(len(at) for at in by_rdzv.values())
    if given is not None and given in by_rdzv:  # the launcher's rendezvous, where the others wait
        odd = [c for rdzv, at in by_rdzv.items() if rdzv != given for c in at]
    elif given is None and sizes[-1] > sizes[-2]:  # a majority went to one: the others left it
        largest = max(by_rdzv.values(), key=len)
        odd = [c for at in by_rdzv.values() if at is not largest for c in at]
    else:  # none of them went where the launcher said, or each went its own way
        odd = everyone
    _, ranks = _who(odd)
    _, all_ranks = _who(everyone)
    mark = {given: " (the launcher's)"} if given is not None else {}
    where = "; ".join(f"{_who(at)[0]} at {rdzv}{mark.get(rdzv, '')}" for rdzv, at in by_rdzv.items())
    return event_finding(
        SPLIT_RENDEZVOUS, f"{_split_what(odd, everyone, len(by_rdzv))}, and no group of {world} can form at any "
        f"of them: {where}{_set_by(odd, everyone, given)}; each would wait at its own until torch's timeout",
        rank=None, ranks=ranks, phase="training",
        evidence={"rendezvous": {rdzv: _who(at)[1] for rdzv, at in by_rdzv.items()}, "world_size": world,
                  "launcher_rendezvous": given, "cohort": all_ranks, "calls": [_evidence(c) for c in everyone]})


def _split_what(odd: list[dict[str, Any]], everyone: list[dict[str, Any]], rendezvous: int) -> str:
    if len(odd) == len(everyone) and rendezvous == len(everyone):
        return "each went to its own rendezvous"
    if len(odd) == len(everyone):
        return f"{_who(odd)[0]} went to {rendezvous} rendezvous"
    return f"{_who(odd)[0]} went to another rendezvous than the others"


def _set_by(odd: list[dict[str, Any]], everyone: list[dict[str, Any]], given: str | None) -> str:
    """Where the script set the variables that differ between the ranks (MASTER_ADDR, MASTER_PORT),
    with the values it set there: "; the script set MASTER_PORT at train.py:18 (34559, 47137)"."""
    differ = [v for v in ("MASTER_ADDR", "MASTER_PORT") if len({(c.get("env") or {}).get(v) for c in everyone}) > 1]
    values: dict[tuple[str, str], set[str]] = {}
    for c in odd:
        for var, site in (c.get("env_set_at") or {}).items():
            if var in differ:
                values.setdefault((var, str(site)), set()).add(str((c.get("env") or {}).get(var)))
    if not values:
        return f"; the launcher gave {given}" if given is not None else ""
    said = [f"{var} at {site} ({', '.join(sorted(vs))})" for (var, site), vs in sorted(values.items())]
    more = f" and {len(said) - 3} more" if len(said) > 3 else ""
    return f"; the script set {', '.join(said[:3])}{more}"


CROSS_NODE_HINT = ("A rank is unique across every node, and LOCAL_RANK numbers the processes of one node only: "
                   "pass rank=int(os.environ['RANK']) (or leave rank and world_size out: init_process_group reads "
                   "RANK and WORLD_SIZE), or compute node_rank * nproc_per_node + local_rank with "
                   "node_rank = int(os.environ['GROUP_RANK']) (the launcher's --node-rank).")


def _with_claims(by_rdzv: dict[str, list[dict[str, Any]]],
                 calls: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The calls of each rendezvous, with the claims of other processes (other nodes') that the
    recorded processes found in the job's store, each process once (by host and pid)."""
    out = {k: list(v) for k, v in by_rdzv.items()}
    seen = {_identity(c) for c in calls}
    for c in calls:
        for other in other_claims(c):
            key = _rendezvous(other)
            if key is None or _identity(other) in seen:
                continue
            seen.add(_identity(other))
            out.setdefault(key, []).append(other)
    return out


def _duplicate_finding(r: int, same: list[dict[str, Any]]) -> Finding:
    who, ranks = _who(same)
    given = [f"RANK={_launcher_rank(c)}" for c in same if _launcher_rank(c) is not None]
    launcher = f"; the launcher gave {', '.join(given)}" if len(given) == len(same) else ""
    sites = sorted({site for c in same if (site := c.get("site"))})
    hosts = {c.get("host") for c in same if c.get("host")}
    where = ""
    if len(hosts) > 1:  # several nodes: which process on which host
        where = "; " + ", ".join(
            f"{_label(c)} on {c.get('host') or 'an unknown host'} (pid {c.get('pid')}, "
            f"claimed rank {_effective(c, 'rank')}{'' if _launcher_rank(c) is None else f', RANK={_launcher_rank(c)}'})"
            for c in same)
    computed = {(d.get("text"), d.get("site")) for c in same if isinstance(d := c.get("rank_computed"), dict)}
    origin = ""
    if len(computed) == 1 and _passed(same[0], "rank") not in (None, -1):  # the line that computed it
        text, at = next(iter(computed))
        origin = f", computed by `{text}` at {at}" if text and at else ""
    message = (f"{who} all joined with rank {r} ({_how(same[0], 'rank')}"
               f"{' at ' + sites[0] if len(sites) == 1 else ''}{origin}){launcher}{where}")
    return event_finding(
        DUPLICATE_RANK, message, rank=None, ranks=ranks, phase="training",
        hint=CROSS_NODE_HINT if len(hosts) > 1 else None,
        evidence={"rank": r, "hosts": sorted(hosts), "calls": [_evidence(c) for c in same]})


def _label(c: dict[str, Any]) -> str:
    r = _launcher_rank(c)
    return f"rank {r}" if r is not None else "a process"


def _world_beyond_started(rdzv: str, group: list[dict[str, Any]], bad_world: set[Any],
                          settled: bool) -> Finding | None:
    """Processes the script started itself (no launcher's count to compare with) that ask for a
    larger world than can ever meet: more than their spawn started, or than called init for a
    rendezvous no other host can join."""
    own = [c for c in group if _launcher_world(c) is None and c.get("pid") not in bad_world]
    if not own or len(own) != len(group) or not _loopback(rdzv):
        return None
    worlds = {_effective(c, "world_size") for c in own}
    if len(worlds) != 1 or None in worlds:
        return None  # different world sizes: the other rules, or torch, say it
    world = int(next(iter(worlds)))  # type: ignore[arg-type]
    spawns: dict[Any, dict[str, Any]] = {}
    children: dict[Any, int] = {}
    unknown = 0
    for c in own:
        s = _spawn(c)
        if _int(s.get("nprocs")) is not None:
            spawns[s.get("parent")] = s
            children[s.get("parent")] = children.get(s.get("parent"), 0) + 1
        else:
            unknown += 1
    started = sum(int(s["nprocs"]) for s in spawns.values()) + unknown
    every_child = all(children[p] >= int(s["nprocs"]) for p, s in spawns.items())
    if world <= started or not (settled or (every_child and not unknown)):
        return None
    who, ranks = _who(own)
    how, site = _how(own[0], "world_size"), own[0].get("site")
    if len(spawns) == 1 and not unknown:
        [s] = spawns.values()
        spawn_site = f" at {s['site']}" if s.get("site") else ""
        started_text = f"torch.multiprocessing.spawn started {started}{spawn_site}"
    else:
        n = len(own)
        started_text = f"only {n} process{'es' if n > 1 else ''} called init_process_group for it"
    return event_finding(
        WORLD_SIZE_DIFFERS, f"{who} joined a world of {world} ({how}{' at ' + site if site else ''}); "
        f"{started_text}, and no other host can join {rdzv} (a loopback address)",
        rank=None, ranks=ranks, phase="training",
        evidence={"world_size": world, "started": started, "called": len(own), "rendezvous": rdzv,
                  "spawns": list(spawns.values()), "calls": [_evidence(c) for c in own]})


def _evidence(call: dict[str, Any]) -> dict[str, Any]:
    keys = ("pid", "host", "site", "rank_arg", "world_size_arg", "rank_passed", "world_size_passed", "arg_text",
            "init_method", "env", "env_set_at", "launcher", "spawn", "done", "ok", "claimed", "rank_computed")
    return {k: call[k] for k in keys if k in call}


def blocking(findings: list[Finding], calls: list[dict[str, Any]]) -> bool:
    """Whether the findings leave processes waiting inside init for nothing: an error while some
    call has not returned (the job is ended and reported at once rather than at the timeout)."""
    return any(f.severity == "error" for f in findings) and any(waiting_in_init(c) for c in calls)


def _formed_group(probe: dict[str, Any] | None) -> bool:
    if not probe:
        return False
    ended = probe.get("ended") or {}
    return bool(probe.get("pg") or ended.get("pg_initialized")
                or any(e.get("kind") == "init_process_group" for e in probe.get("events") or []))


def no_process_group_finding(launched: list[int], outcomes: dict[int, dict[str, Any]],
                             calls: list[dict[str, Any]], probes: list[dict[str, Any]],
                             ledgers: dict[int, dict[str, Any]]) -> Finding | None:
    """DDP876: launched ranks (more than one) that ended well without ever forming a process group.
    A rank is named only on positive evidence: it ended with exit status 0 and no exception, its
    probe record (written at the script's end) shows no process group and no init call, no init
    record carries its pid, and its ledger holds no collective."""
    if len(set(launched)) < 2:
        return None
    init_pids = {c.get("pid") for c in calls}
    by_pid = {p.get("pid"): p for p in probes if isinstance(p, dict)}
    alone: list[int] = []
    steps: dict[str, Any] = {}
    for r in sorted(set(launched)):
        o = outcomes.get(r) or {}
        if o.get("exit_code") != 0 or o.get("exception") or o.get("pid") is None or o.get("pid") in init_pids:
            continue
        probe = by_pid.get(o.get("pid"))
        if probe is None or not probe.get("ended") or _formed_group(probe):
            continue  # the recorder did not see the script's end, or saw a group
        if (ledgers.get(r) or {}).get("entries"):
            continue
        alone.append(r)
        steps[str(r)] = probe.get("steps")
    if not alone:
        return None
    every = len(alone) == len(set(launched))
    who = f"rank {alone[0]}" if len(alone) == 1 else f"ranks {format_ranks(alone)}"
    probes_of = {r: by_pid.get((outcomes.get(r) or {}).get("pid")) or {} for r in alone}
    shard = _shard_site(probes_of)
    others = sorted(set(launched) - set(alone))
    with_others = "" if every else f" with {'rank' if len(others) == 1 else 'ranks'} {format_ranks(others)}"
    one = len(alone) == 1
    idle = not any(probes_of[r].get("steps") for r in alone)
    if idle:
        what = ("nothing ran distributed: no optimizer step and no collective on any of them, each script "
                "ended on its own with exit status 0 (a script that checks for GPUs or arguments and returns "
                "early ends well this way: read what it printed)")
    elif shard:
        what = (f"the ranks trained independent models on their shards of the data (the DataLoader made at "
                f"{shard} splits the data by rank, yet no gradients were synchronised{with_others}): each "
                f"shard trained its own model, and rank 0's checkpoint holds one of them") if not one else (
                f"it trained an independent model on its shard of the data (the DataLoader made at {shard} "
                f"splits the data by rank, yet no gradients were synchronised{with_others})")
    elif every:
        what = "each trained alone (no gradients were synchronised)"
    else:
        what = (f"{'it' if one else 'each'} trained alone (no gradients were synchronised{with_others})")
    return event_finding(
        NO_PROCESS_GROUP, f"{who} ended without calling init_process_group: {what}", rank=None, ranks=alone,
        hint=NO_GROUP_HINT, phase="training",
        evidence={"ranks": alone, "launched": sorted(set(launched)), "optimizer_steps": steps,
                  "nothing_ran": idle, "sharded_loader": shard})


def _shard_site(probes: dict[int, dict[str, Any]]) -> str | None:
    """Where the DataLoader was made that split the data by rank while the ranks trained alone: a
    loader drawn during optimizer steps through a sampler sharded by rank (a DistributedSampler
    given num_replicas and rank by hand, which needs no process group) on every rank; None if none."""
    sites: dict[str, set[int]] = {}
    for r, probe in probes.items():
        for ld in probe.get("loaders") or []:
            if ld.get("distributed") and any(it.get("training") for it in ld.get("iterations") or []):
                sites.setdefault(str(ld.get("site")), set()).add(r)
    every = [site for site, rs in sites.items() if rs == set(probes)]
    return every[0] if every else None


def init_verdict(findings: list[Finding], calls: list[dict[str, Any]], *, settled: bool = False) -> list[Finding]:
    """`findings` plus what init's arguments show, dated from the first call (the cause of
    whatever followed: a wait in init, a timeout, torch's own error); an error on a process whose
    init call did not succeed, and which an init finding names, becomes its consequence (torch's
    "TCPStore world size cannot be 0" relayed from a spawned child is the symptom, world_size=0
    passed at the user's line the cause). `settled`: as for init_argument_findings (the job was
    ended because processes waited in init: every process that would call had called)."""
    found = init_argument_findings(calls, settled=settled)
    first = min((float(c.get("time") or 0) for c in calls), default=0.0)
    for f in found:
        if first:
            f.time = first
    causes = [f for f in found if f.severity == "error"]
    if not causes:
        return findings + found
    failed_init = {process_number(c) for c in calls if not (c.get("done") and c.get("ok"))} - {None}
    own = {f.id for f in found}
    for f in findings:
        if f.phase != "training" or f.severity != "error" or f.id in own or not f.ranks:
            continue
        cause = next((c for c in causes if set(f.ranks) <= _covered(c) & failed_init), None)
        if cause is not None:
            f.caused_by = cause.id
    return findings + found


def _covered(cause: Finding) -> set[int]:
    """The processes whose init failure `cause` explains: the ranks it names, and for a split
    rendezvous every process of the cohort (the ones that stayed waited for the ones that left)."""
    return set(cause.ranks) | set(cause.evidence.get("cohort") or []) if cause.id == SPLIT_RENDEZVOUS.id \
        else set(cause.ranks)
