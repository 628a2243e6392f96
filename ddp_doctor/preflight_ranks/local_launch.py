"""With no launcher around it, `ddp-doctor preflight` starts local ranks itself through torch's
own elastic launcher (torchrun's code, `--standalone`, run by preflight_ranks/launcher.py, which
turns a failed rendezvous of the launcher into a finding), then merges what the ranks left in a
private directory into one report.

In a pod that Kubeflow's operator configured for torchrun (PET_NNODES, PET_NPROC_PER_NODE, ...;
facts/launchers.torchrun_pod) the launcher is started as the pod's torchrun would be: it takes the
job's layout from those variables itself (nodes, node rank, master), so the preflight spans every
pod of the job (`pod_layout`). Its rendezvous of several pods is bounded by --timeout. The pod of
the reporting rank shows the job's report; every other pod shows the job's verdict as its ranks
read it, with what its own ranks found.

The parent never imports torch (fast start) and bounds the whole launch: on overrun it ends the
launcher's process group, so no rank survives it. While the launch runs it adopts orphans (a rank
whose launcher was killed is reparented to it, not to init), and ends every process the launch
left (processes/tree.py). A stop signal is reported once, in a report written whole, whatever its
timing (processes/stop_signals.py). The ranks' files and their merge: processes/launch_dir.py.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ddp_doctor.checks.stalls import lost_to_the_stop, preflight_interrupted_finding
from ddp_doctor.exit_codes import FailOn
from ddp_doctor.facts.efa import nccl_log_env
from ddp_doctor.preflight_ranks.launcher import FIRST_RANK_ENV
from ddp_doctor.processes.launch_dir import LAUNCH_DIR_ENV, LAUNCHED_AT_ENV, launch_timelines, merge_launch_dir
from ddp_doctor.processes.stop_signals import SignalCatcher, note_later
from ddp_doctor.processes.tree import adopting, launcher_preexec, terminate_tree
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.publish import Output, apply_fail_on, publish

CPU_DEFAULT_RANKS = 2


def default_nproc(env: dict[str, str] | None = None) -> int:
    """One rank per visible GPU, or 2 gloo ranks on CPU."""
    from ddp_doctor.facts.host import visible_gpu_count
    return visible_gpu_count(env) or CPU_DEFAULT_RANKS


@dataclass(frozen=True)
class Layout:
    """How the local launcher is started: its options, this node's ranks (0..nproc-1 on one node)
    and the world when no report of the reporting rank is here (another pod's)."""
    nproc: int
    options: tuple[str, ...] = ("--standalone", "--nnodes", "1")
    first_rank: int = 0
    world: dict[str, Any] = field(default_factory=dict)

    @property
    def expected(self) -> list[int]:
        return list(range(self.first_rank, self.first_rank + self.nproc))


def bounded_rdzv_conf(conf: str | None, timeout: float) -> str | None:
    """torchrun's --rdzv-conf with its wait for the other nodes bounded by `timeout` (static:
    `timeout`, c10d: `join_timeout`, 900 s each by default) where `conf` leaves them unset; None
    when it sets both."""
    keys = {kv.split("=", 1)[0].strip() for kv in (conf or "").split(",") if "=" in kv}
    bound = str(max(1, math.ceil(timeout)))
    more = [f"{k}={bound}" for k in ("timeout", "join_timeout") if k not in keys]
    return ",".join(([conf] if conf else []) + more) if more else None


def pod_layout(env: Mapping[str, str], nproc_given: int | None, timeout: float) -> Layout:
    """In a pod the operator configured through torchrun's PET_* variables: the launcher reads the
    nodes, node rank, master and rendezvous from them; the processes per pod are given (--nproc-per-
    node, else PET_NPROC_PER_NODE when it is a number, else one per GPU or 2 on CPU), and the
    launcher's rendezvous of several pods waits at most `timeout` (timeout, join_timeout), as
    `run`'s does, unless PET_RDZV_CONF says otherwise."""
    from ddp_doctor.facts.env_values import as_int, env_int
    pet = (env.get("PET_NPROC_PER_NODE") or "").strip()
    nproc = nproc_given or (int(pet) if pet.isdigit() and int(pet) > 0 else default_nproc(dict(env)))
    options: list[str] = []
    conf = bounded_rdzv_conf(env.get("PET_RDZV_CONF"), timeout)
    if (env.get("PET_NNODES") or "1").strip() != "1" and conf is not None:
        options.append("--rdzv-conf=" + conf)
    node_rank = as_int(env_int(env, "PET_NODE_RANK")) or 0
    pods = as_int(env_int(env, "PET_NNODES"))
    world = {"launcher": "torchrun", "backend": None, "world_size": pods * nproc if pods else None,
             "nnodes": pods, "nproc_per_node": nproc, "master_addr": env.get("PET_MASTER_ADDR"),
             "master_port": as_int(env_int(env, "PET_MASTER_PORT"))}
    return Layout(nproc, tuple(options), node_rank * nproc, world)


def launcher_command(layout: Layout, rank_args: list[str], log_dir: str | None = None) -> list[str]:
    """torch's launcher of the local ranks; `log_dir`: its log tree (the ranks' error files), in the
    launch directory, which is removed (without it torch makes a /tmp/torchelastic_* that stays)."""
    return [sys.executable, "-m", "ddp_doctor.preflight_ranks.launcher", *layout.options,
            "--nproc-per-node", str(layout.nproc), "--max-restarts", "0",
            *(("--log-dir", log_dir) if log_dir else ()), "-m", "ddp_doctor", *rank_args]


def launch_local(layout: Layout | int, rank_args: list[str], *, timeout: float, out: Output,
                 trace_path: str | None = None, fail_on: FailOn | None = None, progress: bool | None = None) -> int:
    """Run `ddp_doctor <rank_args>` on local ranks (`layout`: an int, that many ranks of a
    standalone launch, or a pod's Layout); merge, show and write the report
    (and the Chrome trace of the ranks' stages with `trace_path`). `fail_on`: --fail-on, applied to
    the exit status the report gives. `progress`: --progress / --no-progress (stage_lines.py): a
    line on stderr, at growing steps, naming the stage each rank is in."""
    if isinstance(layout, int):
        layout = Layout(layout)
    nproc = layout.nproc
    # SIGTERM/SIGINT/SIGHUP: a report that says so, then 128+N; blocked from here to the exit
    with SignalCatcher(hold=True) as stop, tempfile.TemporaryDirectory(prefix="ddp-doctor-") as tmp:
        env = dict(os.environ)
        from ddp_doctor.facts.own_env import quiet_missing_numpy
        quiet_missing_numpy(env)  # the launcher and every rank: no "Failed to initialize NumPy" x3
        env[LAUNCH_DIR_ENV] = tmp
        env[FIRST_RANK_ENV] = str(layout.first_rank)  # the launcher's ranks, should none of them start
        launched = time.time()
        env[LAUNCHED_AT_ENV] = repr(launched)  # the ranks' "startup" stage begins here
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, set here to silence its banner
        nccl_log_env(env, tmp)  # into the launch directory, not the output (DDP335 reads it)
        bound = 3 * timeout + 60  # probe, meet and group stages each have `timeout`; plus start-up
        timed_out = False
        deadline = time.monotonic() + bound
        from ddp_doctor.preflight_ranks.stage_lines import StageLines
        from ddp_doctor.processes.launch_dir import read_stages
        from ddp_doctor.processes.progress import enabled, say
        lines = StageLines(launched, bound, nproc, first_rank=layout.first_rank) if enabled(progress) else None
        with adopting() as since:
            proc = subprocess.Popen(launcher_command(layout, rank_args, os.path.join(tmp, "elastic")), env=env,
                                    preexec_fn=launcher_preexec)
            try:
                while proc.poll() is None and stop.wait(0.2) is None:
                    if time.monotonic() > deadline:
                        timed_out = True
                        break
                    if lines is not None and time.time() - launched >= lines.next_at:
                        say(lines.due(read_stages(tmp), time.time()))
                terminate_tree(proc, grace=0.5 if proc.poll() is not None else 5.0, since=since)
            except BaseException:  # Ctrl-C or a bug in the loop: the ranks are still ended, then it goes on up
                terminate_tree(proc, since=since)
                raise
        rep = _launch_report(tmp, layout, proc, timed_out, bound, stop, launched, trace_path)
        rep_out: list[dict[str, Any]] = [rep]

        def stopped_upload(done: dict[str, Any], caught: Any) -> dict[str, Any]:
            rep_out[0] = stopped_during_upload(done, caught, "preflight")
            return rep_out[0]

        publish(rep, out, stop=stop.wait_new, stopped=stopped_upload)  # the file first, then a bounded upload
        rep = rep_out[0]
        note_later(stop.drain(), "while the report was written; it was written first")
    first = stop.first()  # the exit status a stop signal asks for, whenever it came
    return first.exit_code if first is not None else apply_fail_on(reportlib.exit_code(rep), rep, fail_on)


def stopped_during_upload(rep: dict[str, Any], caught: Any, phase: str) -> dict[str, Any]:
    """The report a stop signal makes of a finished one while its S3 upload was awaited: the
    verdict's findings kept, the stop noted (DDP811), status "interrupted" (never a "pass" for a
    process that was stopped)."""
    if rep.get("status") == "interrupted":
        return rep
    from ddp_doctor.checks.stops import late_stop_finding
    kept = {k: v for k, v in rep.items() if k not in ("status", "findings", "root_cause", "summary")}
    new = reportlib.build_report(world=rep.get("world") or {}, ranks=rep.get("ranks") or [],
                                 measurements=rep.get("measurements") or {}, phase=rep.get("phase") or phase,
                                 findings=[*reportlib.findings_of(rep), late_stop_finding(caught, phase)])
    return reportlib.mark_interrupted({**kept, **new}, caught.to_dict())


def _launch_report(tmp: str, layout: Layout, proc: subprocess.Popen[Any], timed_out: bool, bound: float,
                   stop: SignalCatcher, launched: float, trace_path: str | None) -> dict[str, Any]:
    """The merged report of a local launch, with the stop that ended it (DDP808, with any stop
    signal that came after it), or a stop signal that came after the ranks ended (DDP811)."""
    from ddp_doctor.checks.stops import late_stop_finding
    rc = proc.returncode if proc.returncode is not None else -9
    rep = merge_launch_dir(tmp, layout.nproc, rc, timed_out, bound, expected=layout.expected,
                           world=layout.world or None)
    more = stop.drain()
    caught = stop.stopped()
    note_later(more, "while the ranks were being stopped; noted in the report" if caught is not None
               else "after the ranks had ended; noted in the report (DDP811)")
    if caught is not None:
        stopped = preflight_interrupted_finding(caught)  # dated before the ranks it ended went missing
        rep = reportlib.mark_interrupted(reportlib.build_report(
            world=rep["world"], ranks=rep["ranks"],
            findings=[*lost_to_the_stop(reportlib.findings_of(rep), stopped), stopped],
            measurements=rep["measurements"]), caught.to_dict())
    elif more:  # the ranks had ended: their verdict stands, the signal is noted
        rep = reportlib.build_report(world=rep["world"], ranks=rep["ranks"], measurements=rep["measurements"],
                                     findings=[*reportlib.findings_of(rep), late_stop_finding(more[0], "preflight")])
    rep["measurements"].setdefault("stage_seconds", {})["launch"] = round(time.time() - launched, 6)
    if trace_path:
        write_launch_trace(tmp, rep, trace_path)
    return rep


def write_launch_trace(tmp: str, rep: dict[str, Any], path: str) -> None:
    """The Chrome trace of a self-launched preflight: every rank's stages and checks."""
    from ddp_doctor.preflight_ranks.one_rank import write_trace
    timelines, hosts = launch_timelines(tmp)
    for r in rep.get("ranks") or []:
        if r.get("rank") is not None:
            timelines.setdefault(int(r["rank"]), [])
            hosts[int(r["rank"])] = hosts.get(int(r["rank"])) or r.get("host")
    write_trace(path, timelines, hosts, rep)
