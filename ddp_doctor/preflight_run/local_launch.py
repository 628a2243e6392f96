"""With no launcher around it, `ddp-doctor preflight` starts local ranks itself through torch's
own elastic launcher (`python -m torch.distributed.run --standalone`), then merges what the ranks
left in a private directory into one report.

The parent never imports torch (fast start) and bounds the whole launch: on overrun it ends the
launcher's process group, so no rank survives it.
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

from ddp_doctor.checks import internal as events
from ddp_doctor.findings import Finding
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.publish import Output, publish

CPU_DEFAULT_RANKS = 2


def default_nproc(env: dict[str, str] | None = None) -> int:
    """One rank per visible GPU, or 2 gloo ranks on CPU."""
    from ddp_doctor.facts.host import visible_gpu_count
    return visible_gpu_count(env) or CPU_DEFAULT_RANKS


def _die_with_parent() -> None:
    # Runs in the child before exec: its own process group (so we can end the whole tree) and
    # SIGTERM when this parent dies, which torchrun forwards to its workers.
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def launcher_command(nproc: int, rank_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--max-restarts", "0", "-m", "ddp_doctor", *rank_args]


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil
        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone
        return []


def terminate_tree(proc: subprocess.Popen[Any], grace: float = 5.0) -> None:
    """End the launcher and everything under it. torch's launcher starts each worker in a session
    of its own, so the launcher's process group does not hold them: remember them first."""
    workers = _descendants(proc.pid)
    try:
        _terminate_group(proc, grace)
    finally:
        for w in workers:
            try:
                w.kill()
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


def launch_local(nproc: int, rank_args: list[str], *, timeout: float, out: Output) -> int:
    """Run `ddp_doctor <rank_args>` on `nproc` local ranks; merge, show and write the report."""
    with tempfile.TemporaryDirectory(prefix="ddp-doctor-") as tmp:
        env = dict(os.environ)
        env["DDP_DOCTOR_LAUNCH_DIR"] = tmp
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, set here to silence its banner
        bound = 3 * timeout + 60  # probe, meet and group stages each have `timeout`; plus start-up
        proc = subprocess.Popen(launcher_command(nproc, rank_args), env=env, preexec_fn=_die_with_parent)
        timed_out = False
        try:
            rc = proc.wait(bound)
        except subprocess.TimeoutExpired:
            timed_out = True
            terminate_tree(proc)
            rc = proc.returncode if proc.returncode is not None else -9
        except KeyboardInterrupt:
            terminate_tree(proc)
            raise
        else:
            terminate_tree(proc, grace=0.5)  # stragglers of an abnormal exit, if any
        rep = merge_launch_dir(tmp, nproc, rc, timed_out, bound)
    publish(rep, out)
    return reportlib.exit_code(rep)


def merge_launch_dir(tmp: str, nproc: int, rc: int | None, timed_out: bool, bound: float) -> dict[str, Any]:
    """The reporting rank's report, plus what ranks that never joined it left behind."""
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
    for r in range(nproc):
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
