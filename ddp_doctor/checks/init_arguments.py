"""init_process_group's arguments against the launcher (DDP867-DDP869): a rank or world size
written by hand, or rendezvous variables the script changed before init.

Pure functions over the init-PID.json records (training/probes/init_arguments.py): each holds what
one process passed (rank=, world_size=, init_method), the rendezvous variables at the call, and,
for a process the launcher started, the launcher's RANK / WORLD_SIZE and the variables as they
were when the script started. Judged from what the processes did, at once: these mistakes leave
the ranks waiting inside init_process_group until torch's timeout (30 minutes by default).
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

DUPLICATE_RANK = declare(
    "DDP867", category="init_order", severity="error", title="Several processes joined with the same rank",
    doc="""
    What: Two or more processes called init_process_group for the same rendezvous with the same
    rank (a `rank=0` written by hand, or RANK overwritten), while the launcher numbered them apart.
    The finding names the processes, the rank they passed, the launcher's RANK for each, and the line.
    Why: The rendezvous waits until every rank from 0 to world_size-1 has joined; with a rank
    taken twice one is never filled and every process waits inside init_process_group until the
    timeout (30 minutes by default), with no error.
    Fix: Leave rank and world_size out (`init_process_group(backend)` reads RANK and WORLD_SIZE the
    launcher set), or pass `rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])`.
    """)

WORLD_SIZE_DIFFERS = declare(
    "DDP868", category="init_order", severity="error", title="World size differs from the processes launched",
    doc="""
    What: init_process_group was asked for a world size other than the number of processes the
    launcher started: `world_size=` passed by hand, or WORLD_SIZE changed by the script before init.
    The finding quotes the value at init and the launcher's, and where it came from.
    Why: With more ranks expected than started, the rendezvous waits for ranks that will never
    come until the timeout; with fewer, the extra ranks fail or join another job's numbering.
    Fix: Take the world size from the launcher (leave world_size out, do not assign
    os.environ["WORLD_SIZE"]), and start as many processes as the job needs (`--nproc-per-node`
    x `--nnodes`).
    """)

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
    """)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _effective(call: dict[str, Any], key: str, arg: str) -> int | None:
    v = call.get(arg)
    return v if isinstance(v, int) else _int((call.get("env") or {}).get(key))


def _rendezvous(call: dict[str, Any]) -> str | None:
    """Which rendezvous the call joins; None for a store the script built itself (not compared)."""
    if call.get("store_given"):
        return None
    method = call.get("init_method")
    if method and not str(method).startswith("env://"):
        return str(method)
    env = call.get("env") or {}
    return f"env://{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"


def _launcher_rank(call: dict[str, Any]) -> int | None:
    return _int((call.get("launcher") or {}).get("rank"))


def _how(call: dict[str, Any], key: str, arg: str) -> str:
    """Where the value init used came from: the argument, or the variable the script changed."""
    if isinstance(call.get(arg), int):
        return f"{arg.removesuffix('_arg')}={call[arg]} passed"
    before = ((call.get("launcher") or {}).get("env") or {}).get(key)
    now = (call.get("env") or {}).get(key)
    if call.get("launched_rank") and before != now:
        return f"{key}={now!r} in the environment (the launcher set {before!r}; the script changed it)"
    return f"{key}={now!r} in the environment"


def _site(call: dict[str, Any]) -> str:
    return f" at {call['site']}" if call.get("site") else ""


def _who(calls: list[dict[str, Any]]) -> tuple[str, list[int]]:
    ranks = [r for r in (_launcher_rank(c) for c in calls) if r is not None]
    if len(ranks) == len(calls):
        return (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"), sorted(ranks)
    pids = ", ".join(str(c.get("pid")) for c in calls)
    return f"processes {pids}", sorted(ranks)


def init_argument_findings(calls: list[dict[str, Any]]) -> list[Finding]:
    """Findings over every init_process_group call recorded (one per process)."""
    findings: list[Finding] = []
    # by the launcher's rank, not in the order the processes happened to call init
    calls = sorted(calls, key=lambda c: (_launcher_rank(c) is None, _launcher_rank(c) or 0, c.get("pid") or 0))
    by_rdzv: dict[str, list[dict[str, Any]]] = {}
    for c in calls:
        key = _rendezvous(c)
        if key is not None:
            by_rdzv.setdefault(key, []).append(c)

    duplicated: set[int] = set()  # pids
    for group in by_rdzv.values():
        by_rank: dict[int, list[dict[str, Any]]] = {}
        for c in group:
            r = _effective(c, "RANK", "rank_arg")
            if r is not None:
                by_rank.setdefault(r, []).append(c)
        for r, same in sorted(by_rank.items()):
            if len(same) < 2:
                continue
            duplicated |= {c.get("pid") for c in same}
            who, ranks = _who(same)
            given = [f"RANK={_launcher_rank(c)}" for c in same if _launcher_rank(c) is not None]
            launcher = f"; the launcher gave {', '.join(given)}" if len(given) == len(same) else ""
            sites = sorted({c.get("site") for c in same if c.get("site")})
            message = (f"{who} all joined with rank {r} ({_how(same[0], 'RANK', 'rank_arg')}"
                       f"{' at ' + sites[0] if len(sites) == 1 else ''}){launcher}")
            findings.append(event_finding(
                DUPLICATE_RANK, message, rank=None, ranks=ranks, phase="training",
                evidence={"rank": r, "calls": [_evidence(c) for c in same]}))

    wrong_world: dict[tuple[Any, ...], list[dict[str, Any]]] = {}  # one finding per way it happened
    for c in calls:
        if not c.get("launched_rank"):
            continue  # a process the script started (mp.spawn) numbers its own world
        launcher_world = _int((c.get("launcher") or {}).get("world_size"))
        world = _effective(c, "WORLD_SIZE", "world_size_arg")
        if launcher_world is not None and world is not None and world != launcher_world:
            key = (world, launcher_world, _how(c, "WORLD_SIZE", "world_size_arg"), c.get("site"))
            wrong_world.setdefault(key, []).append(c)
        rank, launcher_rank = _effective(c, "RANK", "rank_arg"), _launcher_rank(c)
        if (rank is not None and launcher_rank is not None and rank != launcher_rank
                and c.get("pid") not in duplicated):
            findings.append(event_finding(
                RANK_DIFFERS, f"rank {launcher_rank} joined as rank {rank} ({_how(c, 'RANK', 'rank_arg')}"
                f"{_site(c)}); the launcher gave RANK={launcher_rank}", rank=launcher_rank, phase="training",
                evidence={"rank": rank, "launcher_rank": launcher_rank, "call": _evidence(c)}))
    for (world, launcher_world, how, site), same in wrong_world.items():
        who, ranks = _who(same)
        findings.append(event_finding(
            WORLD_SIZE_DIFFERS, f"{who} joined a world of {world} ({how}{' at ' + site if site else ''}); "
            f"the launcher started {launcher_world}", rank=None, ranks=ranks, phase="training",
            evidence={"world_size": world, "launcher_world_size": launcher_world,
                      "calls": [_evidence(c) for c in same]}))
    return findings


def _evidence(call: dict[str, Any]) -> dict[str, Any]:
    keys = ("pid", "site", "rank_arg", "world_size_arg", "init_method", "env", "launcher", "done", "ok")
    return {k: call[k] for k in keys if k in call}


def blocking(findings: list[Finding], calls: list[dict[str, Any]]) -> bool:
    """Whether the findings leave processes waiting inside init for nothing: an error while some
    call has not returned (the job is ended and reported at once rather than at the timeout)."""
    return any(f.severity == "error" for f in findings) and any(not c.get("done") for c in calls)
