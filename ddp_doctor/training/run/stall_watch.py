"""What the parent of local ranks (parent.py) looks for each time it polls: a hang (no progress
past the bound, hang_bound.py), ranks stuck in interpreter teardown, processes waiting in
init_process_group with arguments that cannot work (init_verdict.py), a node that never came, and
the progress lines (--progress) as a stall nears the bound.
"""
from __future__ import annotations

import os
import time
from typing import Any

NODES_GRACE = 20.0  # seconds past the rendezvous bound before the parent ends a waiting launcher


def nodes_never_met(run_dir: str, torchrun: list[str], opts: Any, launched: float) -> bool:
    """Several nodes, and no rank of this one started within the launcher's rendezvous bound
    (+ NODES_GRACE): the launcher still waits for a node that never came. Then the finding that
    names the missing node(s) is left where finish (parent_report.py) reads the preflight, and True is returned (the
    caller ends the launcher). The launcher's own bound (agent_command) normally ends it first.
    `launched`: time.monotonic() when the launcher was started."""
    from types import SimpleNamespace

    from ddp_doctor.preflight_ranks.launcher_rendezvous import nodes_of, rendezvous_bound, rendezvous_finding
    from ddp_doctor.training.run import agent
    value = agent.torchrun_value
    nnodes = value(torchrun, "--nnodes") or "1"
    if nodes_of(SimpleNamespace(nnodes=nnodes))[0] <= 1:
        return False  # one node ("1", "1:1"): there is no other node to wait for
    from ddp_doctor.training import records
    if os.path.isdir(records.preflight_dir(run_dir)) or records.read_heartbeats(run_dir):
        return False  # a rank started: the nodes met
    args = SimpleNamespace(
        nnodes=nnodes, node_rank=value(torchrun, "--node-rank", "--node_rank") or "0",
        nproc_per_node=value(torchrun, "--nproc-per-node", "--nproc_per_node") or "1",
        master_addr=value(torchrun, "--master-addr", "--master_addr") or "127.0.0.1",
        master_port=value(torchrun, "--master-port", "--master_port") or "29500",
        rdzv_backend=value(torchrun, "--rdzv-backend", "--rdzv_backend") or "static",
        rdzv_endpoint=value(torchrun, "--rdzv-endpoint", "--rdzv_endpoint") or "",
        rdzv_conf=value(torchrun, "--rdzv-conf", "--rdzv_conf") or "")
    bound = max(float(opts.timeout), rendezvous_bound(args) or 0.0)
    waited = time.monotonic() - launched
    if waited < bound + NODES_GRACE:
        return False
    agent.write_node_report(run_dir, rendezvous_finding(
        args, TimeoutError(f"the launcher was still waiting after {waited:.0f} s"), bound))
    return True


TEARDOWN_BOUND = 60.0  # seconds a rank may take to exit after its script ended


def end_stuck_at_exit(run_dir: str, bound: float) -> list[int]:
    """Ranks whose script ended (outcome recorded) but whose process has not exited within
    `bound`: interpreter teardown hangs (seen with torch 2.13's gloo). End them; the script's own
    exit status stands and the report says so (DDP806)."""
    import signal

    from ddp_doctor.training import records
    now = time.time()
    ended = []
    for r, o in records.read_outcomes(run_dir).items():
        if now - float(o.get("time", now)) > bound:
            try:
                os.kill(int(o["pid"]), signal.SIGKILL)
                ended.append(r)
            except (OSError, KeyError, ValueError):
                pass
    return ended


def detect_hang(run_dir: str, hang_timeout: float | None,
                slow: dict[str, Any] | None = None) -> dict[int, dict[str, Any]] | None:
    """The heartbeats, when the job is hung (training/run/hang_bound.py), each with the bound that
    was applied ("bound"); None while it is not. A slow rank the others wait for (not yet a hang)
    is noted in `slow`: the longest such wait, who waited, who was working and where."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run.hang_bound import HangBound, judge
    hbs = records.read_heartbeats(run_dir)
    done = records.read_outcomes(run_dir)
    training = {r: hb for r, hb in hbs.items() if hb.get("phase") == "training" and r not in done}
    now = time.time()
    verdict = judge(training, now, HangBound(hang_timeout))
    if verdict is None:
        return None
    if not verdict.hung:
        waited = max(now - float(training[r].get("last_progress", now)) for r in verdict.stalled)
        if slow is not None and waited > float(slow.get("waited", 0)):
            slow.update(waited=round(waited, 1), waiting=verdict.stalled, working=verdict.moving,
                        where={str(r): training[r].get("where") for r in verdict.moving})
        return None
    return {r: {**hb, "bound": verdict.bound} for r, hb in hbs.items()}


def progress_lines(opts: Any) -> Any:
    """The rule of the hang progress lines (training/run/hang_lines.py), when they are asked for."""
    from ddp_doctor.processes.progress import enabled
    from ddp_doctor.training.run.hang_bound import HangBound
    from ddp_doctor.training.run.hang_lines import HangLines
    return HangLines(HangBound(opts.hang_timeout)) if enabled(getattr(opts, "progress", None)) else None


def say_progress(lines: Any, run_dir: str, stages: Any) -> None:
    """The hang progress line once the ranks train; before, the preflight's stage line."""
    from ddp_doctor.processes.launch_dir import read_stages
    from ddp_doctor.processes.progress import say
    from ddp_doctor.training import records
    from ddp_doctor.training.run.hang_lines import training_beats
    now = time.time()
    if any(hb.get("phase") != "preflight" for hb in records.read_heartbeats(run_dir).values()):
        say(lines.due(training_beats(run_dir), now))
    elif now - stages.launched >= stages.next_at:
        say(stages.due(read_stages(records.preflight_dir(run_dir)), now))


def detect_bad_init(run_dir: str) -> bool:
    """Whether processes wait inside init_process_group with arguments that cannot work (a rank
    taken twice, a world size the launcher did not start, a rank outside the world): then the job
    is ended at once. The bounded wait before judging is training/run/init_verdict.py's."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run.init_verdict import judge_waiting
    calls = records.read_init_calls(run_dir)
    return judge_waiting(calls, time.time(), launched=len(records.read_heartbeats(run_dir)))[0]


def ended_by_bad_init(run_dir: str) -> bool:
    """The launcher ended on its own after a rank of this node failed in init_process_group while a
    process on another node held its rank (the job's store went with the node whose verdict ended
    the job first): the job was ended for the duplicate, as if this node had judged it."""
    from ddp_doctor.checks.init_arguments import blocking, init_argument_findings, waiting_in_init
    from ddp_doctor.training import records
    calls = records.read_init_calls(run_dir)
    return (any(c.get("done") and waiting_in_init(c) for c in calls)
            and blocking(init_argument_findings(calls, settled=True), calls))


LAUNCHER_EXIT_BOUND = 30.0  # seconds the launcher has to exit once every local rank's process is gone
# several nodes: torch's launcher then waits for the other nodes at its exit barrier (torch's
# exit_barrier_timeout, 300 s), hosting their store meanwhile: it is left that long, and this bound
EXIT_BARRIER = 300.0


def launcher_exit_bound(torchrun: list[str]) -> float:
    """How long the launcher may go on after its ranks ended before the parent ends it."""
    from types import SimpleNamespace

    from ddp_doctor.preflight_ranks.launcher_rendezvous import nodes_of
    from ddp_doctor.training.run import agent
    nnodes = agent.torchrun_value(torchrun, "--nnodes") or "1"
    several = nodes_of(SimpleNamespace(nnodes=nnodes))[0] > 1
    return LAUNCHER_EXIT_BOUND + (EXIT_BARRIER if several else 0.0)


def ranks_gone(run_dir: str) -> bool:
    """Whether every rank this node started (a heartbeat, with its pid) has ended: its process is
    gone (a zombie its stopped or stuck launcher never reaped counts). A rank whose script ended
    but whose process lives on (teardown) is not gone: end_stuck_at_exit ends it at its bound."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run.ledger import process_gone
    hbs = records.read_heartbeats(run_dir)
    return bool(hbs) and all(hb.get("pid") is not None and process_gone(hb.get("pid")) for hb in hbs.values())


class LauncherExit:
    """The launcher's exit, watched once its ranks ended: `overdue()` is True when it has not
    exited `bound` seconds after every rank's process was seen gone (it was stopped with SIGSTOP,
    or is stuck in its own teardown): the parent then ends it and reports what the ranks left."""

    def __init__(self, run_dir: str, bound: float) -> None:
        self.run_dir, self.bound = run_dir, bound
        self.since: float | None = None  # time.monotonic() when the ranks were first seen gone

    def overdue(self) -> bool:
        if not ranks_gone(self.run_dir):
            self.since = None
            return False
        now = time.monotonic()
        if self.since is None:
            self.since = now
        return now - self.since >= self.bound
