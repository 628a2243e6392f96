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
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from ddp_doctor.training.run.target import Target

DOCTOR_OPTIONS = {"--report": 1, "--timeout": 1, "--hang-timeout": 1, "--select": 1, "--skip": 1,
                  "--backend": 1}
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


def _positive(text: str) -> float:
    v = float(text)
    if v <= 0:
        raise ValueError(text)
    return v


def doctor_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-doctor run", add_help=False)
    p.add_argument("--report", default=None)
    p.add_argument("--timeout", type=_positive, default=60.0)
    p.add_argument("--hang-timeout", type=_positive, default=None)
    p.add_argument("--select", action="append")
    p.add_argument("--skip", action="append")
    p.add_argument("--backend", choices=("gloo", "nccl", "smddp", "mpi"))
    return p


def torchrun_value(torchrun: list[str], *names: str) -> str | None:
    for i, a in enumerate(torchrun):
        key, _, val = a.partition("=")
        if key in names:
            return val if val else (torchrun[i + 1] if i + 1 < len(torchrun) else None)
    return None


def run_options(doctor: list[str], target: Target) -> Any:
    from ddp_doctor import checks as catalogue
    from ddp_doctor import registry
    from ddp_doctor.training.run.rank import DEFAULT_HANG_TIMEOUT, RunOptions
    try:
        ns = doctor_parser().parse_args(doctor)
    except SystemExit:
        raise RunUsageError(f"bad ddp-doctor option in {' '.join(doctor)!r} (usage: {USAGE})") from None
    select, skip = registry.parse_selectors(ns.select), registry.parse_selectors(ns.skip)
    bad = catalogue.unknown_selectors(select + skip)
    if bad:
        raise RunUsageError(f"--select/--skip: {', '.join(bad)} match no check")
    return RunOptions(target=target, timeout=ns.timeout, hang_timeout=ns.hang_timeout or DEFAULT_HANG_TIMEOUT,
                      select=select, skip=skip, backend=ns.backend, report_path=ns.report)


def main(argv: list[str]) -> int:
    """Entry of `ddp-doctor run`; returns the exit status (the script's own after a preflight)."""
    if argv in (["-h"], ["--help"]):
        print(f"usage: {USAGE}\n\n{__doc__}")
        return 0
    torchrun, doctor, target = split_argv(argv)
    opts = run_options(doctor, target)
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
    tail = ["-m", target.module] if target.module else [str(target.path)]
    return [sys.executable, "-m", "ddp_doctor.training.run.agent", *args, "-m", "ddp_doctor", "run",
            *doctor, *tail, *target.args]


def launch(torchrun: list[str], doctor: list[str], target: Target, opts: Any) -> int:
    from ddp_doctor.preflight_run.local_launch import _die_with_parent, terminate_tree
    from ddp_doctor.training.run.agent import RESULT_ENV
    from ddp_doctor.training.run.rank import PARENT_ENV, RUN_DIR_ENV

    run_dir = tempfile.mkdtemp(prefix="ddp-doctor-run-")
    env = dict(os.environ)
    env.update({RUN_DIR_ENV: run_dir, PARENT_ENV: "1", RESULT_ENV: os.path.join(run_dir, "agent.json")})
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(agent_command(torchrun, doctor, target), env=env, preexec_fn=_die_with_parent)
    hang = None
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            end_stuck_at_exit(run_dir, TEARDOWN_BOUND)
            hang = detect_hang(run_dir, opts.hang_timeout)
            if hang is not None:
                break
    except KeyboardInterrupt:
        terminate_tree(proc)
        raise
    if hang is not None:
        hang = collect_stacks(run_dir, hang)
        terminate_tree(proc)
    else:
        terminate_tree(proc, grace=0.5)  # nothing may outlive the launcher
    try:
        return finish(run_dir, proc.returncode, hang, opts, torchrun)
    finally:
        import shutil
        shutil.rmtree(run_dir, ignore_errors=True)


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


def detect_hang(run_dir: str, hang_timeout: float) -> dict[int, dict[str, Any]] | None:
    from ddp_doctor.training import records
    hbs = records.read_heartbeats(run_dir)
    now = time.time()
    done = records.read_outcomes(run_dir)
    training = {r: hb for r, hb in hbs.items() if hb.get("phase") == "training" and r not in done}
    if any(now - hb.get("last_progress", now) > hang_timeout for hb in training.values()):
        return hbs
    return None


def collect_stacks(run_dir: str, hbs: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Ask every rank for its stacks (SIGUSR2 -> faulthandler), give them a moment to write."""
    from ddp_doctor.training.run.watchdog import STACK_SIGNAL
    for hb in hbs.values():
        try:
            os.kill(int(hb["pid"]), STACK_SIGNAL)
        except (OSError, KeyError, ValueError):
            pass
    time.sleep(1.0)
    return hbs


def finish(run_dir: str, agent_code: int | None, hang: dict[int, dict[str, Any]] | None, opts: Any,
           torchrun: list[str]) -> int:
    from ddp_doctor.checks.training_probes import probe_findings
    from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_HANG
    from ddp_doctor.findings import Finding
    from ddp_doctor.preflight_run.local_launch import merge_launch_dir
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.report.publish import Output, platform_sinks, publish
    from ddp_doctor.training import records
    from ddp_doctor.training.run.diagnose import hang_finding, training_findings

    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True)
    pf_dir = os.path.join(run_dir, "preflight")
    heartbeats = records.read_heartbeats(run_dir)
    nproc = len(heartbeats) or 1
    pf = merge_launch_dir(pf_dir, nproc, agent_code, False, 0.0) if os.path.isdir(pf_dir) else None
    outcomes = records.read_outcomes(run_dir)
    if pf is not None and pf["status"] == "fail" and not outcomes:
        rep, code = pf, EXIT_FAILED
    else:
        try:
            with open(os.path.join(run_dir, "agent.json"), encoding="utf-8") as f:
                exits = {int(k): int(v) for k, v in json.load(f).items()}
        except (OSError, ValueError):
            exits = {}
        ranks = sorted(set(heartbeats) | set(outcomes) | set(exits))
        findings: list[Finding] = reportlib.findings_of(pf) if pf else []
        if hang is not None:
            stacks = {r: records.read_stack(run_dir, r) or "" for r in hang}
            findings.append(hang_finding(hang, stacks, opts.hang_timeout))
            code = EXIT_HANG
            more, _ = training_findings(outcomes, {}, ranks)
            findings += more
        else:
            more, code = training_findings(outcomes, exits, ranks, records.read_crashes(run_dir))
            findings += more
            if code == 0 and agent_code and not outcomes:
                code = agent_code  # the launcher itself failed
        failed = hang is not None or any(f.severity == "error" for f in findings)
        findings += probe_findings(records.read_probes(run_dir), failed=failed)
        rep = reportlib.build_report(world=(pf or {}).get("world") or {"launcher": "torchrun"},
                                     ranks=(pf or {}).get("ranks") or [], findings=findings,
                                     measurements=(pf or {}).get("measurements") or {}, phase="training")
    publish(rep, out)
    if rep.get("status") == "fail":
        from ddp_doctor.context import current_context
        platform_sinks(rep, current_context())  # SageMaker's failure file, when on SageMaker
    return code
