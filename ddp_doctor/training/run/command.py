"""`ddp-doctor run [torchrun options] [ddp-doctor options] (SCRIPT | -m MODULE) [ARGS...]`.

- Under a launcher (torchrun, mpirun, SLURM, SageMaker): act as this rank (rank_run).
- No launcher and no --nproc-per-node / --nnodes: one process, in this process, as `python SCRIPT`
  would run (scripts that start their own ranks with torch.multiprocessing.spawn work).
- Otherwise: start the ranks through torch's elastic launcher (agent.py), watch their heartbeats
  for hangs, and merge what they left into one report.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, NoReturn

from ddp_doctor.training.run.target import Target

DOCTOR_OPTIONS = {"--report": 1, "--timeout": 1, "--hang-timeout": 1, "--select": 1, "--skip": 1,
                  "--backend": 1, "--run-dir": 1, "--trace": 1}
TORCHRUN_OPTIONS = {
    "--nnodes": 1, "--nproc-per-node": 1, "--nproc_per_node": 1, "--node-rank": 1, "--node_rank": 1,
    "--master-addr": 1, "--master_addr": 1, "--master-port": 1, "--master_port": 1,
    "--rdzv-backend": 1, "--rdzv_backend": 1, "--rdzv-endpoint": 1, "--rdzv_endpoint": 1,
    "--rdzv-id": 1, "--rdzv_id": 1, "--rdzv-conf": 1, "--rdzv_conf": 1, "--max-restarts": 1,
    "--max_restarts": 1, "--monitor-interval": 1, "--monitor_interval": 1, "--start-method": 1,
    "--start_method": 1, "--role": 1, "--log-dir": 1, "--log_dir": 1, "--redirects": 1, "-r": 1,
    "--tee": 1, "-t": 1, "--local-addr": 1, "--local_addr": 1, "--standalone": 0,
}
USAGE = ("ddp-doctor run [torchrun options] [--report PATH] [--timeout S] [--hang-timeout S] "
         "(SCRIPT | -m MODULE) [ARGS...]")


class RunUsageError(Exception):
    pass


def split_argv(argv: list[str]) -> tuple[list[str], list[str], Target]:
    """(torchrun options, ddp-doctor options, target): options end at the script or `-m MODULE`;
    everything after belongs to the script."""
    torchrun: list[str] = []
    doctor: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        name, has_value = a.split("=", 1)[0], "=" in a
        if a == "-m":
            if i + 1 >= len(argv):
                raise RunUsageError("-m needs a module name")
            return torchrun, doctor, Target(None, argv[i + 1], argv[i + 2:])
        if name in DOCTOR_OPTIONS or name in TORCHRUN_OPTIONS:
            n = DOCTOR_OPTIONS.get(name, TORCHRUN_OPTIONS.get(name, 0))
            dest = doctor if name in DOCTOR_OPTIONS else torchrun
            if n and not has_value:
                if i + 1 >= len(argv):
                    raise RunUsageError(f"{a} needs a value")
                dest += [a, argv[i + 1]]
                i += 2
            else:
                dest.append(a)
                i += 1
            continue
        if a.startswith("-"):
            raise RunUsageError(f"unknown option {a!r} before the script (usage: {USAGE})")
        return torchrun, doctor, Target(a, None, argv[i + 1:])
    raise RunUsageError(f"no script or -m MODULE given (usage: {USAGE})")


def _seconds(text: str) -> float:
    """--timeout / --hang-timeout: the CLI's one rule for a bound (ddp_doctor.time_limit.usable_timeout:
    above 0, finite, at most one day; torchrun's options take it in whole seconds)."""
    from ddp_doctor.time_limit import usable_timeout
    try:
        return usable_timeout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _DoctorParser(argparse.ArgumentParser):
    """argparse for the ddp-doctor options of `run`: a mistake is one RunUsageError line (main prints
    it and exits 2), never argparse's usage dump and exit."""

    def error(self, message: str) -> NoReturn:
        raise RunUsageError(f"bad ddp-doctor option: {message}")


def doctor_parser() -> argparse.ArgumentParser:
    p = _DoctorParser(prog="ddp-doctor run", add_help=False)
    p.add_argument("--report", default=None)
    p.add_argument("--timeout", type=_seconds, default=60.0)
    p.add_argument("--hang-timeout", type=_seconds, default=None)
    p.add_argument("--select", action="append")
    p.add_argument("--skip", action="append")
    p.add_argument("--backend", choices=("gloo", "nccl", "smddp", "mpi"))
    p.add_argument("--run-dir", default=None)  # keep the run directory (records, ledgers, stacks) in it
    p.add_argument("--trace", default=None)  # the ranks' timelines as a Chrome trace (run/trace_file.py)
    return p


NPROC_ACCEPTED = "a whole number of processes above 0, cpu, auto, or gpu / xpu where that device is present"


def check_nproc_per_node(torchrun: list[str]) -> None:
    """Every --nproc-per-node given for torchrun, judged as torch.distributed.run takes it
    (determine_local_world_size): a whole number as int() reads it, and above 0 (torchrun takes 0 or
    -3 and fails later with a bare AssertionError), or cpu or auto; another word (gpu, xpu, the
    privateuse1 device's name) is asked of torch's own function, which knows whether that device is
    here. RunUsageError, one line, otherwise."""
    names = ("--nproc-per-node", "--nproc_per_node")
    for i, a in enumerate(torchrun):
        key, eq, val = a.partition("=")
        if key not in names:
            continue
        value = val if eq else (torchrun[i + 1] if i + 1 < len(torchrun) else "")
        why = _nproc_problem(value)
        if why:
            raise RunUsageError(f"--nproc-per-node {value!r}: {why}; torchrun takes {NPROC_ACCEPTED}")


def _nproc_problem(value: str) -> str | None:
    try:
        n: int | None = int(value)
    except ValueError:
        n = None
    if n is not None:
        return None if n >= 1 else "no process would start"
    if value in ("cpu", "auto"):
        return None
    try:
        from torch.distributed.run import determine_local_world_size
        n = determine_local_world_size(value)
    except ImportError:
        return None  # no torch to ask here: the launcher says it
    except Exception as e:  # noqa: BLE001 - torch's answer for a word it does not take (ValueError, RuntimeError)
        said = (str(e).splitlines() or [type(e).__name__])[0]
        return f"torch says {said[:160]!r}"
    return None if isinstance(n, int) and n >= 1 else f"no {value} device on this host"


def torchrun_value(torchrun: list[str], *names: str) -> str | None:
    for i, a in enumerate(torchrun):
        key, _, val = a.partition("=")
        if key in names:
            return val if val else (torchrun[i + 1] if i + 1 < len(torchrun) else None)
    return None


def run_options(doctor: list[str], target: Target) -> Any:
    from ddp_doctor import checks as catalogue
    from ddp_doctor import registry
    from ddp_doctor.training.run.rank import RunOptions
    try:
        ns = doctor_parser().parse_args(doctor)
    except SystemExit:  # argparse's own exit (e.g. a handler that exits): still one usage line
        raise RunUsageError(f"bad ddp-doctor option in {' '.join(doctor)!r} (usage: {USAGE})") from None
    select, skip = registry.parse_selectors(ns.select), registry.parse_selectors(ns.skip)
    bad = catalogue.unknown_selectors(select + skip)
    if bad:
        raise RunUsageError(f"--select/--skip: {', '.join(bad)} match no check")
    return RunOptions(target=target, timeout=ns.timeout, hang_timeout=ns.hang_timeout,
                      select=select, skip=skip, backend=ns.backend, report_path=ns.report, run_dir=ns.run_dir,
                      trace_path=ns.trace)


def main(argv: list[str]) -> int:
    """Entry of `ddp-doctor run`; returns the exit status (the script's own after a preflight)."""
    if argv in (["-h"], ["--help"]):
        print(f"usage: {USAGE}\n\n{__doc__}")
        return 0
    torchrun, doctor, target = split_argv(argv)
    opts = run_options(doctor, target)
    check_nproc_per_node(torchrun)
    if target.path and not os.path.isfile(target.path):
        raise RunUsageError(f"no such script: {target.path}")
    from ddp_doctor.facts.launchers import launcher_name
    if launcher_name(os.environ) != "none" or not (
            torchrun_value(torchrun, "--nproc-per-node", "--nproc_per_node") or torchrun_value(torchrun, "--nnodes")):
        if torchrun and launcher_name(os.environ) != "none":
            sys.stderr.write("ddp-doctor run: warning: launcher options ignored under a launcher\n")
        from ddp_doctor.training.run.rank import run_training_rank
        return run_training_rank(opts)
    return launch(torchrun, doctor, target, opts)


# ---------------------------------------------------------------- the parent of local ranks

def agent_command(torchrun: list[str], doctor: list[str], target: Target) -> list[str]:
    args = list(torchrun)
    if torchrun_value(args, "--max-restarts", "--max_restarts") is None:
        args += ["--max-restarts", "0"]
    nnodes = torchrun_value(args, "--nnodes") or "1"
    given = any(torchrun_value(args, n) for n in ("--master-addr", "--master_addr", "--rdzv-endpoint",
                                                   "--rdzv_endpoint", "--master-port", "--master_port"))
    if nnodes == "1" and not given and "--standalone" not in args:
        args.append("--standalone")  # a free port for the store: no collisions between jobs
    # Several nodes: the launcher's own rendezvous waits for the others 900 s by default (static:
    # timeout, c10d: join_timeout): bound it by --timeout, as the preflight bounds the ranks' meeting.
    bound = str(max(1, math.ceil(float(torchrun_value(doctor, "--timeout") or 60))))
    conf = torchrun_value(args, "--rdzv-conf", "--rdzv_conf")
    keys = {kv.split("=", 1)[0].strip() for kv in (conf or "").split(",") if "=" in kv}
    more = [f"{k}={bound}" for k in ("timeout", "join_timeout") if k not in keys] if nnodes != "1" else []
    if more:
        args = [a for i, a in enumerate(args) if a.split("=", 1)[0] not in ("--rdzv-conf", "--rdzv_conf")
                and not (i and args[i - 1] in ("--rdzv-conf", "--rdzv_conf"))]
        args.append("--rdzv-conf=" + ",".join(([conf] if conf else []) + more))
    tail = ["-m", target.module] if target.module else [str(target.path)]
    return [sys.executable, "-m", "ddp_doctor.training.run.agent", *args, "-m", "ddp_doctor", "run",
            *doctor, *tail, *target.args]


def launch(torchrun: list[str], doctor: list[str], target: Target, opts: Any) -> int:
    from ddp_doctor.preflight_run.local_launch import terminate_tree
    from ddp_doctor.preflight_run.stop_signals import SignalCatcher
    from ddp_doctor.training import records
    from ddp_doctor.training.run.agent import RESULT_ENV
    from ddp_doctor.training.run.ledger import recorder_env
    from ddp_doctor.training.run.rank import PARENT_ENV, RUN_DIR_ENV

    keep_in = opts.run_dir  # --run-dir: the run directory is made inside it and kept
    try:
        if keep_in:
            os.makedirs(keep_in, mode=0o700, exist_ok=True)  # the user's directory: made private, never changed
        run_dir = tempfile.mkdtemp(prefix="ddp-doctor-run-", dir=keep_in)  # 0700
        records.make_private_dir(run_dir)
    except OSError as e:
        raise RunUsageError(f"--run-dir {keep_in}: cannot make the run directory there "
                            f"({e.strerror or e})") from None
    if keep_in:
        sys.stderr.write(f"ddp-doctor: run directory (records, ledgers, stacks): {run_dir}\n")
    env = dict(os.environ)
    env.update({RUN_DIR_ENV: run_dir, PARENT_ENV: "1", RESULT_ENV: os.path.join(run_dir, "agent.json")})
    env.setdefault("OMP_NUM_THREADS", "1")
    recorder_env(env, run_dir)  # ledgers of collectives, NCCL's dumps on timeout; never the user's values
    hang = None
    stuck_in_init = False
    slow: dict[str, Any] = {}  # the longest wait for a slow rank, not (yet) a hang
    with SignalCatcher() as stop:  # SIGTERM/SIGINT/SIGHUP: where the ranks were, then a report
        proc = subprocess.Popen(agent_command(torchrun, doctor, target), env=env, preexec_fn=_start_agent)
        launched = time.monotonic()
        try:
            while proc.poll() is None and stop.wait(0.5) is None:
                end_stuck_at_exit(run_dir, TEARDOWN_BOUND)
                hang = detect_hang(run_dir, opts.hang_timeout, slow)
                stuck_in_init = detect_bad_init(run_dir)
                if hang is not None or stuck_in_init:
                    break
                if nodes_never_met(run_dir, torchrun, opts, launched):  # ends the agent; finish reports it
                    break
            if stop.caught is not None and proc.poll() is None:
                sys.stderr.write(f"ddp-doctor: {stop.caught.describe()}: taking the ranks' stacks and ledgers, "
                                 f"then stopping them\n")
                hang = collect_stacks(run_dir, records.read_heartbeats(run_dir), reason="interrupted")
                terminate_tree(proc)
            elif hang is not None:
                nnodes = torchrun_value(torchrun, "--nnodes") or "1"
                hang = collect_stacks(run_dir, hang, across=nnodes not in ("1", "1:1"))
                terminate_tree(proc)
            else:
                terminate_tree(proc, grace=0.5)  # nothing may outlive the launcher
        except BaseException:
            terminate_tree(proc)
            raise
    try:
        return finish(run_dir, proc.returncode, hang, opts, torchrun, stuck_in_init=stuck_in_init,
                      interrupted=stop.caught, slow=slow)
    finally:
        from ddp_doctor.report.private_files import tighten_tree
        from ddp_doctor.training.run.nccl_dumps import dump_files
        if keep_in:  # the user's --run-dir: everything stays
            tighten_tree(run_dir)  # NCCL's dumps and log, written with the umask: 0600 as ours are
        elif dump_files(run_dir):  # NCCL's dumps are the evidence the report points to: keep them
            tighten_tree(run_dir)
            sys.stderr.write(f"ddp-doctor: NCCL flight recorder dumps kept in {run_dir}\n")
        else:
            import shutil
            shutil.rmtree(run_dir, ignore_errors=True)


NODES_GRACE = 20.0  # seconds past the rendezvous bound before the parent ends a waiting launcher


def nodes_never_met(run_dir: str, torchrun: list[str], opts: Any, launched: float) -> bool:
    """Several nodes, and no rank of this one started within the launcher's rendezvous bound
    (+ NODES_GRACE): the launcher still waits for a node that never came. Then the finding that
    names the missing node(s) is left where finish reads the preflight, and True is returned (the
    caller ends the launcher). The launcher's own bound (agent_command) normally ends it first.
    `launched`: time.monotonic() when the launcher was started."""
    from types import SimpleNamespace

    from ddp_doctor.training.run import agent
    nnodes = torchrun_value(torchrun, "--nnodes") or "1"
    if agent.nodes_of(SimpleNamespace(nnodes=nnodes))[0] <= 1:
        return False  # one node ("1", "1:1"): there is no other node to wait for
    from ddp_doctor.training import records
    if os.path.isdir(os.path.join(run_dir, "preflight")) or records.read_heartbeats(run_dir):
        return False  # a rank started: the nodes met
    value = torchrun_value
    args = SimpleNamespace(
        nnodes=nnodes, node_rank=value(torchrun, "--node-rank", "--node_rank") or "0",
        nproc_per_node=value(torchrun, "--nproc-per-node", "--nproc_per_node") or "1",
        master_addr=value(torchrun, "--master-addr", "--master_addr") or "127.0.0.1",
        master_port=value(torchrun, "--master-port", "--master_port") or "29500",
        rdzv_backend=value(torchrun, "--rdzv-backend", "--rdzv_backend") or "static",
        rdzv_endpoint=value(torchrun, "--rdzv-endpoint", "--rdzv_endpoint") or "",
        rdzv_conf=value(torchrun, "--rdzv-conf", "--rdzv_conf") or "")
    bound = max(float(opts.timeout), agent.rendezvous_bound(args) or 0.0)
    waited = time.monotonic() - launched
    if waited < bound + NODES_GRACE:
        return False
    agent.write_node_report(run_dir, agent.rendezvous_finding(
        args, TimeoutError(f"the launcher was still waiting after {waited:.0f} s"), bound))
    return True


def _start_agent() -> None:
    from ddp_doctor.preflight_run.local_launch import _die_with_parent
    from ddp_doctor.preflight_run.stop_signals import unblock_in_child
    unblock_in_child()
    _die_with_parent()


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


def detect_bad_init(run_dir: str) -> bool:
    """Whether processes wait inside init_process_group with arguments that cannot work (a rank
    taken twice, a world size the launcher did not start, a rank outside the world): then the job
    is ended at once. The bounded wait before judging is training/run/init_verdict.py's."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run.init_verdict import judge_waiting
    calls = records.read_init_calls(run_dir)
    return judge_waiting(calls, time.time(), launched=len(records.read_heartbeats(run_dir)))[0]


LEDGER_WAIT = 5.0  # seconds the parent waits for the ranks' ledgers on a hang (watchdogs poll each second)


def collect_stacks(run_dir: str, hbs: dict[int, dict[str, Any]], reason: str = "hang", *,
                   across: bool = False) -> dict[int, dict[str, Any]]:
    """Ask every rank for its stacks (SIGUSR2 -> faulthandler) and its ledger of collectives (a
    request file its watchdog thread polls), give them a bounded moment to write. `across`:
    several nodes; at a hang the ranks also fetch the other nodes' (training/run/endings.py)."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run import ledger
    from ddp_doctor.training.run.watchdog import STACK_SIGNAL
    asked = time.time()
    ledger.request(run_dir, reason=reason)
    for hb in hbs.values():
        try:
            os.kill(int(hb["pid"]), STACK_SIGNAL)
        except (OSError, KeyError, ValueError):
            pass
    time.sleep(1.0)
    ended = records.read_outcomes(run_dir)  # a rank whose script ended wrote its ledger then
    live = [r for r in hbs if r not in ended]
    ledger.wait_for(run_dir, live, asked, LEDGER_WAIT)
    if across and reason == "hang":
        from ddp_doctor.training.run.endings import HANG_SHARE_WAIT, wait_shared
        wait_shared(run_dir, live, asked, HANG_SHARE_WAIT + 3.0)
    return hbs


def finish(run_dir: str, agent_code: int | None, hang: dict[int, dict[str, Any]] | None, opts: Any,
           torchrun: list[str], *, stuck_in_init: bool = False, interrupted: Any = None,
           slow: dict[str, Any] | None = None) -> int:
    from ddp_doctor.checks.job import JobEvidence
    from ddp_doctor.exit_codes import EXIT_FAILED
    from ddp_doctor.preflight_run.local_launch import merge_launch_dir
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.report.publish import Output, platform_sinks, publish
    from ddp_doctor.training.job_report import job_report
    from ddp_doctor.training.run.endings import remote_hung
    from ddp_doctor.training.run.run_dir import read_run

    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True)
    pf_dir = os.path.join(run_dir, "preflight")
    run = read_run(run_dir)
    heartbeats = run.heartbeats
    nproc = len(heartbeats) or 1
    pf = (merge_launch_dir(pf_dir, nproc, agent_code, False, 0.0, expected=sorted(heartbeats) or None)
          if os.path.isdir(pf_dir) else None)
    if pf is not None and pf["status"] == "fail" and not run.outcomes:
        rep, code = pf, EXIT_FAILED
        if interrupted is not None:
            rep = reportlib.mark_interrupted(rep, interrupted.to_dict())
    else:
        try:
            with open(os.path.join(run_dir, "agent.json"), encoding="utf-8") as f:
                exits = {int(k): int(v) for k, v in json.load(f).items()}
        except (OSError, ValueError):
            exits = {}
        ranks = sorted(set(heartbeats) | set(run.outcomes) | set(exits))
        stopped_at = dict(hang or {})
        if hang is not None and interrupted is None:
            stopped_at = {**remote_hung(run_dir), **stopped_at}  # other nodes' ranks, copied at the hang
            ranks = sorted(set(ranks) | set(stopped_at))
        ev = JobEvidence(
            ranks=ranks, outcomes=run.outcomes, exits=exits if hang is None and interrupted is None else {},
            crashes=run.crashes, ledgers=run.ledgers, init_calls=run.init_calls, probes=run.probes,
            stopped_at=stopped_at, stacks=run.stacks(stopped_at), interrupted=interrupted,
            hung=hang is not None and interrupted is None, hang_timeout=float(opts.hang_timeout or 0.0),
            slow=slow or None, stuck_in_init=stuck_in_init, launcher_code=agent_code,
            world_size=len(ranks) or None, started=bool(heartbeats), launched_alone=True)
        rep, code = job_report(ev, world=(pf or {}).get("world") or {"launcher": "torchrun"},
                               ranks=(pf or {}).get("ranks") or [], earlier=reportlib.findings_of(pf) if pf else [],
                               measurements=(pf or {}).get("measurements") or {})
    if interrupted is not None:
        code = interrupted.exit_code
    from ddp_doctor.training.run.trace_file import write_trace_if_asked
    write_trace_if_asked(opts, run_dir, rep)
    publish(rep, out)
    if rep.get("status") in ("fail", "interrupted"):
        from ddp_doctor.context import current_context
        platform_sinks(rep, current_context())  # SageMaker's failure file, when on SageMaker
    return code
