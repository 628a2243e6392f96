"""With no launcher around it, `ddp-doctor preflight` starts local ranks itself through torch's
own elastic launcher (`python -m torch.distributed.run --standalone`), then merges what the ranks
left in a private directory into one report.

The parent never imports torch (fast start) and bounds the whole launch: on overrun it ends the
launcher's process group, so no rank survives it. While the launch runs it adopts orphans (a rank
whose launcher was killed is reparented to it, not to init), and ends every process the launch
left (terminate_tree). A stop signal is reported once, in a report written whole, whatever its
timing (stop_signals.py).
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

from ddp_doctor.checks import internal as events
from ddp_doctor.checks.training_failures import INTERRUPTED
from ddp_doctor.exit_codes import FailOn
from ddp_doctor.facts.efa import nccl_log_env
from ddp_doctor.findings import Finding
from ddp_doctor.preflight_run.stop_signals import (
    SignalCatcher,
    adopt_orphans,
    die_with_parent,
    note_later,
    unblock_in_child,
)
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.publish import Output, apply_fail_on, publish

CPU_DEFAULT_RANKS = 2


def default_nproc(env: dict[str, str] | None = None) -> int:
    """One rank per visible GPU, or 2 gloo ranks on CPU."""
    from ddp_doctor.facts.host import visible_gpu_count
    return visible_gpu_count(env) or CPU_DEFAULT_RANKS


def _die_with_parent() -> None:
    # Runs in the child before exec: its own process group (so we can end the whole tree) and
    # SIGTERM when this parent dies, which torchrun forwards to its workers.
    os.setsid()
    die_with_parent(signal.SIGTERM)


def _start_launcher() -> None:
    unblock_in_child()
    _die_with_parent()


def launcher_command(nproc: int, rank_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--max-restarts", "0", "-m", "ddp_doctor", *rank_args]


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil
        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone
        return []


def _launched(since: float | None) -> list[Any]:
    """This process's descendants started at `since` (time.time()) or later: the launcher's tree,
    and the ranks adopted here when their launcher died (adopting)."""
    if since is None:
        return []
    try:
        import psutil
        return [p for p in psutil.Process().children(recursive=True) if p.create_time() >= since - 1.0]
    except Exception:  # noqa: BLE001 - psutil missing, or a process gone while looked at
        return []


@contextlib.contextmanager
def adopting() -> Iterator[float]:
    """While the launch runs, this process is a child subreaper: a rank whose launcher was killed
    is reparented here, where terminate_tree (given the launch's start, yielded) finds and ends it.
    After it, the adopted processes that ended are reaped and the process is an ordinary one again."""
    since = time.time()
    adopted = adopt_orphans(True)
    try:
        yield since
    finally:
        if adopted:
            adopt_orphans(False)
            _reap_adopted(since)


def _reap_adopted(since: float) -> None:
    """Wait for (reap) the adopted processes that ended: they are this process's children now,
    and no Popen of ours waits for them."""
    try:
        import psutil
        kids = [p.pid for p in psutil.Process().children() if p.create_time() >= since - 1.0
                and p.status() == psutil.STATUS_ZOMBIE]
    except Exception:  # noqa: BLE001 - psutil missing, or a process gone while looked at
        return
    for pid in kids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


def terminate_tree(proc: subprocess.Popen[Any], grace: float = 5.0, since: float | None = None) -> None:
    """End the launcher and everything under it. torch's launcher starts each worker in a session
    of its own, so the launcher's process group does not hold them: remember them first. `since`
    (from `adopting`): also end every process started here since then, those the launcher lost
    when it was killed included."""
    workers = _descendants(proc.pid) + [p for p in _launched(since) if p.pid != proc.pid]
    try:
        _terminate_group(proc, grace)
    finally:
        for w in workers:
            try:
                w.kill()  # psutil checks the process is the one seen (not a reused pid)
            except Exception:  # noqa: BLE001 - already gone
                pass


def _terminate_group(proc: subprocess.Popen[Any], grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            # torchrun is gone; make sure none of its workers outlived it
            os.killpg(proc.pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def launch_local(nproc: int, rank_args: list[str], *, timeout: float, out: Output,
                 trace_path: str | None = None, fail_on: FailOn | None = None, progress: bool | None = None) -> int:
    """Run `ddp_doctor <rank_args>` on `nproc` local ranks; merge, show and write the report
    (and the Chrome trace of the ranks' stages with `trace_path`). `fail_on`: --fail-on, applied to
    the exit status the report gives. `progress`: --progress / --no-progress (progress.py): a
    line on stderr, at growing steps, naming the stage each rank is in."""
    # SIGTERM/SIGINT/SIGHUP: a report that says so, then 128+N; blocked from here to the exit
    with SignalCatcher(hold=True) as stop, tempfile.TemporaryDirectory(prefix="ddp-doctor-") as tmp:
        env = dict(os.environ)
        from ddp_doctor.facts.own_env import quiet_missing_numpy
        quiet_missing_numpy(env)  # the launcher and every rank: no "Failed to initialize NumPy" x3
        env["DDP_DOCTOR_LAUNCH_DIR"] = tmp
        launched = time.time()
        env["DDP_DOCTOR_LAUNCHED_AT"] = repr(launched)  # the ranks' "startup" stage begins here
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, set here to silence its banner
        nccl_log_env(env, tmp)  # into the launch directory, not the output (DDP335 reads it)
        bound = 3 * timeout + 60  # probe, meet and group stages each have `timeout`; plus start-up
        timed_out = False
        deadline = time.monotonic() + bound
        from ddp_doctor.preflight_run.progress import StageLines, enabled, read_stages, say
        lines = StageLines(launched, bound, nproc) if enabled(progress) else None
        with adopting() as since:
            proc = subprocess.Popen(launcher_command(nproc, rank_args), env=env, preexec_fn=_start_launcher)
            try:
                while proc.poll() is None and stop.wait(0.2) is None:
                    if time.monotonic() > deadline:
                        timed_out = True
                        break
                    if lines is not None and time.time() - launched >= lines.next_at:
                        say(lines.due(read_stages(tmp), time.time()))
                terminate_tree(proc, grace=0.5 if proc.poll() is not None else 5.0, since=since)
            except BaseException:
                terminate_tree(proc, since=since)
                raise
        rep = _launch_report(tmp, nproc, proc, timed_out, bound, stop, launched, trace_path)
        publish(rep, out)
        note_later(stop.drain(), "while the report was written; it was written first")
    first = stop.first()  # the exit status a stop signal asks for, whenever it came
    return first.exit_code if first is not None else apply_fail_on(reportlib.exit_code(rep), rep, fail_on)


def _launch_report(tmp: str, nproc: int, proc: subprocess.Popen[Any], timed_out: bool, bound: float,
                   stop: SignalCatcher, launched: float, trace_path: str | None) -> dict[str, Any]:
    """The merged report of a local launch, with the stop that ended it (DDP808, with any stop
    signal that came after it), or a stop signal that came after the ranks ended (DDP811)."""
    from ddp_doctor.checks.stops import late_stop_finding
    rc = proc.returncode if proc.returncode is not None else -9
    rep = merge_launch_dir(tmp, nproc, rc, timed_out, bound)
    more = stop.drain()
    caught = stop.stopped()
    note_later(more, "while the ranks were being stopped; noted in the report" if caught is not None
               else "after the ranks had ended; noted in the report (DDP811)")
    if caught is not None:
        stopped = events.event_finding(INTERRUPTED, f"stopped by {caught.describe()} during the preflight",
                                       rank=None, evidence=caught.to_dict())
        stopped.time = caught.at  # before the ranks it ended went missing
        rep = reportlib.mark_interrupted(reportlib.build_report(
            world=rep["world"], ranks=rep["ranks"], findings=[*reportlib.findings_of(rep), stopped],
            measurements=rep["measurements"]), caught.to_dict())
    elif more:  # the ranks had ended: their verdict stands, the signal is noted
        rep = reportlib.build_report(world=rep["world"], ranks=rep["ranks"], measurements=rep["measurements"],
                                     findings=[*reportlib.findings_of(rep), late_stop_finding(more[0], "preflight")])
    rep["measurements"].setdefault("stage_seconds", {})["launch"] = round(time.time() - launched, 6)
    if trace_path:
        write_launch_trace(tmp, rep, trace_path)
    return rep


def merge_launch_dir(tmp: str, nproc: int, rc: int | None, timed_out: bool, bound: float,
                     expected: list[int] | None = None) -> dict[str, Any]:
    """The reporting rank's report, plus what ranks that never joined it left behind. `expected`:
    the ranks started here (default 0..nproc-1; on one node of several, that node's ranks)."""
    merged: dict[str, Any] | None = None
    try:
        with open(os.path.join(tmp, "report.json"), encoding="utf-8") as f:
            merged = json.load(f)
    except (OSError, ValueError):
        merged = None
    partials: dict[int, dict[str, Any]] = {}
    for p in glob.glob(os.path.join(tmp, "rank-*.json")):
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
            partials[int(d["rank"])] = d
        except (OSError, ValueError, KeyError):
            continue
    findings: list[Finding] = reportlib.findings_of(merged) if merged else []
    ranks: list[dict[str, Any]] = list(merged["ranks"]) if merged else []
    covered = {r["rank"] for r in ranks}
    for r, d in sorted(partials.items()):
        if r in covered:
            continue
        findings += [Finding.from_dict(x) for x in d.get("findings", [])]
        if d.get("view"):
            ranks.append(reportlib.rank_entry(d["view"]))
    reported = covered | {r for r, d in partials.items() if d.get("final")}
    for r in (expected if expected is not None else range(nproc)):
        if r not in reported:
            how = (f"the launch was stopped after {bound:g} s" if timed_out
                   else f"the launcher exited with status {rc}")
            findings.append(events.event_finding(
                events.RANK_LOST, f"local rank {r} ended without a report ({how})", rank=r,
                evidence={"launcher_exit": rc, "timed_out": timed_out}))
    world = dict(merged["world"]) if merged else {
        "launcher": "torchrun", "backend": None, "world_size": nproc, "nnodes": 1,
        "nproc_per_node": nproc, "master_addr": None, "master_port": None}
    world["launched_by"] = "ddp-doctor"
    return reportlib.build_report(world=world, ranks=ranks, findings=findings,
                                  measurements=(merged or {}).get("measurements") or {})


def launch_timelines(tmp: str) -> tuple[dict[int, list[dict[str, Any]]], dict[int, Any]]:
    """(rank -> preflight timeline, rank -> host) from what the ranks left in a launch directory."""
    timelines: dict[int, list[dict[str, Any]]] = {}
    hosts: dict[int, Any] = {}
    for p in glob.glob(os.path.join(tmp, "rank-*.json")):
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
            r = int(d["rank"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        timeline, view = d.get("timeline"), d.get("view")
        timelines[r] = [e for e in timeline if isinstance(e, dict)] if isinstance(timeline, list) else []
        hosts[r] = view.get("hostname") if isinstance(view, dict) else None
    return timelines, hosts


def write_launch_trace(tmp: str, rep: dict[str, Any], path: str) -> None:
    """The Chrome trace of a self-launched preflight: every rank's stages and checks."""
    from ddp_doctor.preflight_run.rank import write_trace
    timelines, hosts = launch_timelines(tmp)
    for r in rep.get("ranks") or []:
        if r.get("rank") is not None:
            timelines.setdefault(int(r["rank"]), [])
            hosts[int(r["rank"])] = hosts.get(int(r["rank"])) or r.get("host")
    write_trace(path, timelines, hosts, rep)
