"""The end of a job the parent of local ranks watched (parent.py): what the ranks, the launcher and
any stop signal left is merged into the job's report, published, and turned into the exit status.
"""
from __future__ import annotations

import os
from typing import Any


def sent_to_launcher(stop: Any, launcher_pid: int) -> Any:
    """A stop signal the launcher passed on (agent.py) is one sent to the launcher: say so, and not
    that the launcher sent it."""
    if stop is None or stop.sender_pid != launcher_pid:
        return stop
    from dataclasses import replace
    return replace(stop, sender_pid=None, sender=None, to=f"the launcher (torch's elastic agent, pid {launcher_pid})")


def platform_files(rep: dict[str, Any]) -> None:
    """torchelastic's error file and, on SageMaker, its failure file, for a failed job's report. Read
    from the environment alone: the parent never imports torch (the host's facts would, for a GPU
    count: ~1.5 s of CPU before the verdict)."""
    from ddp_doctor.facts import sagemaker_env
    from ddp_doctor.report.publish import platform_sinks
    platform_sinks(rep, os.environ, sagemaker_env.read(os.environ))


def finish(run_dir: str, agent_code: int | None, hang: dict[int, dict[str, Any]] | None, opts: Any,
           torchrun: list[str], *, stuck_in_init: bool = False, interrupted: Any = None,
           slow: dict[str, Any] | None = None, signals: Any = None, launcher_pid: int | None = None,
           ended_here: bool = True) -> int:
    """Merge what the ranks left into the job's report, publish it, and return the exit status.
    `signals`: the parent's SignalCatcher, still blocking the stop signals: those pending now join
    the stop (or, after the job's own end, are noted: DDP811). `launcher_pid`: the launcher's pid;
    `ended_here`: this parent ended it. When it ended on its own, a stop it was sent (agent.py's
    record) is the job's stop, and a launcher killed or failed before its ranks ended is DDP810."""
    from ddp_doctor.checks.stops import late_stop_finding, launcher_exit_status
    from ddp_doctor.exit_codes import EXIT_FAILED
    from ddp_doctor.processes.launch_dir import merge_launch_dir
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.report.publish import Output, publish
    from ddp_doctor.training import records
    from ddp_doctor.training.run.run_dir import read_run

    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True, verdict_if_pass=True,
                 verbose=getattr(opts, "verbose", False))
    pf_dir = records.preflight_dir(run_dir)
    run = read_run(run_dir)
    heartbeats = run.heartbeats
    late: list[Any] = []
    if signals is not None:
        taken = [sent_to_launcher(x, launcher_pid or -1) for x in signals.drain()]
        signals.later[len(signals.later) - len(taken):] = taken
        interrupted = signals.stopped() or interrupted
        late = [] if signals.caught is not None else list(signals.later)
        from ddp_doctor.processes.stop_signals import note_later
        note_later(taken, "after the ranks had ended; noted in the report (DDP811)" if late
                   else "while the ranks were being stopped; noted in the report")
    if interrupted is None and launcher_pid is not None and not ended_here:
        interrupted = launcher_stop(run_dir, launcher_pid)  # torch's own handler took it (agent.py)
        if interrupted is not None and hang is None:
            hang = dict(heartbeats)  # where the ranks were: their last heartbeats
    if interrupted is not None:  # stopped during the preflight: where each rank was is its stage
        hang = preflight_positions(pf_dir, hang if hang is not None else dict(heartbeats),
                                   now=getattr(interrupted, "at", None))
    ended = (launcher_ended(run_dir, agent_code, launcher_pid, run)
             if interrupted is None and hang is None and not stuck_in_init and not ended_here else None)
    nproc = len(heartbeats) or 1
    pf = (merge_launch_dir(pf_dir, nproc, agent_code, False, 0.0, expected=sorted(heartbeats) or None)
          if os.path.isdir(pf_dir) else None)
    noted = late_stop_finding(late[0]) if late and interrupted is None else None  # the job had ended
    evidence = None
    if pf is not None and pf["status"] == "fail" and not run.outcomes:  # no rank trained: the preflight's verdict
        rep, code = pf, EXIT_FAILED
        if ended is not None:
            rep, code = _with_findings(rep, ended), launcher_exit_status(agent_code)
        if noted is not None:  # its verdict stands, the signal is noted
            rep = _with_findings(rep, noted)
        if interrupted is not None:
            from ddp_doctor.checks.stalls import interrupted_finding
            rep = _with_findings(rep, interrupted_finding(interrupted, hang or {}, run.stacks(hang or {})))
            rep, code = reportlib.mark_interrupted(rep, interrupted.to_dict()), interrupted.exit_code
    else:
        judged = _judge(run_dir, run, opts, pf, hang=hang, interrupted=interrupted, earlier=[ended] if ended else [],
                        more=[noted] if noted is not None else [], slow=slow, stuck_in_init=stuck_in_init,
                        agent_code=agent_code)
        rep, code, evidence = judged.report, judged.code, judged.evidence
    from ddp_doctor.training.run.trace_file import write_trace_if_asked
    write_trace_if_asked(opts, run_dir, rep)
    if signals is not None:  # the file first; a stop during the (bounded) upload makes it "interrupted"
        from ddp_doctor.preflight_ranks.local_launch import stopped_during_upload
        rep_out = [rep]

        def stopped_upload(done: dict[str, Any], caught: Any) -> dict[str, Any]:
            rep_out[0] = stopped_during_upload(done, caught, "training")
            return rep_out[0]

        publish(rep, out, stop=signals.wait_new, stopped=stopped_upload, evidence=evidence)
        if rep_out[0] is not rep:
            rep = rep_out[0]
            code = signals.first().exit_code
    else:
        publish(rep, out, evidence=evidence)
    if rep.get("status") in ("fail", "interrupted"):
        platform_files(rep)
    from ddp_doctor.report.publish import apply_fail_on
    return apply_fail_on(code, rep, getattr(opts, "fail_on", None))  # --fail-on: 0 -> 3 on such a finding


def _judge(run_dir: str, run: Any, opts: Any, pf: dict[str, Any] | None, *, hang: dict[int, dict[str, Any]] | None,
           interrupted: Any, earlier: list[Any], more: list[Any], slow: dict[str, Any] | None,
           stuck_in_init: bool, agent_code: int | None) -> Any:
    """The job judged (training/job_report.judge) from what its ranks, its launcher (agent.json:
    each rank's exit status) and the preflight (`pf`, its merged report) left."""
    from ddp_doctor.checks.arrivals import clock_offsets_of
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.training.job_report import judge
    from ddp_doctor.training.run.endings import remote_hung
    from ddp_doctor.training.run.run_dir import job_evidence, read_exits
    stopped_at = dict(hang or {})
    if hang is not None and interrupted is None:
        stopped_at = {**remote_hung(run_dir), **stopped_at}  # other nodes' ranks, copied at the hang
    ev = job_evidence(run, stopped_at=stopped_at, private=True, exits=read_exits(run_dir), interrupted=interrupted,
                      hung=hang is not None, hang_timeout=float(opts.hang_timeout or 0.0), slow=slow or None,
                      stuck_in_init=stuck_in_init, launcher_code=agent_code,
                      clock_offsets=clock_offsets_of((pf or {}).get("measurements")))
    return judge(ev, world=(pf or {}).get("world") or {"launcher": "torchrun"}, ranks=(pf or {}).get("ranks") or [],
                 earlier=[*(reportlib.findings_of(pf) if pf else []), *earlier], more=more,
                 measurements=(pf or {}).get("measurements") or {}, history_env=os.environ)


def preflight_positions(pf_dir: str, beats: dict[int, dict[str, Any]],
                        now: float | None = None) -> dict[int, dict[str, Any]]:
    """Where each rank was when a stop came during the preflight: the stage it was in (the
    stage-N.json files its preflight writes, launch_dir.read_stages) and for how long, in place
    of the heartbeat's line (ddp-doctor's own code then, not the script's). Ranks in training keep
    their heartbeat; a rank with a stage and no heartbeat yet is added."""
    import time

    from ddp_doctor.processes.launch_dir import read_stages
    try:
        stages = read_stages(pf_dir) if os.path.isdir(pf_dir) else {}
    except (OSError, ValueError):
        stages = {}
    now = time.time() if now is None else now
    out = dict(beats)
    for r, st in stages.items():
        hb = beats.get(r) or {}
        if hb.get("phase") == "training" or not st.get("stage"):
            continue
        since = st.get("since")
        took = f", for {max(0.0, now - float(since)):.0f} s" if isinstance(since, (int, float)) else ""
        kept = {k: v for k, v in hb.items() if k != "steps"}  # no "0 steps": the script never ran
        out[r] = {**kept, "where": f"in the preflight, stage {st['stage']}{took}", "in_collective": False,
                  "stage": st["stage"]}
    return out


def _with_findings(rep: dict[str, Any], *more: Any) -> dict[str, Any]:
    """`rep` rebuilt with `more` findings (status and root cause judged again); the keys the
    builder does not make (a training report's "preflight_status") are kept."""
    from ddp_doctor.report import build as reportlib
    new = reportlib.build_report(world=rep.get("world") or {}, ranks=rep.get("ranks") or [],
                                 findings=[*reportlib.findings_of(rep), *more],
                                 measurements=rep.get("measurements") or {}, phase=rep.get("phase") or "preflight")
    return {**rep, **new}


def launcher_stop(run_dir: str, launcher_pid: int) -> Any:
    """The stop signal the launcher recorded when it ended its ranks itself (agent.py: torch's own
    handler took the signal, or a second one came before this parent acted), as a stop of the job."""
    from ddp_doctor.processes.stop_signals import Interrupt
    from ddp_doctor.training.run.agent import read_stop
    signo = read_stop(run_dir)
    if signo is None:
        return None
    return Interrupt(signo, to=f"the launcher (torch's elastic agent, pid {launcher_pid})")


def launcher_ended(run_dir: str, agent_code: int | None, launcher_pid: int | None, run: Any) -> Any:
    """DDP810 when the launcher ended on its own before its ranks did: killed by a signal (it has
    no exit status to give for them), or exited with an error without recording any rank's failure
    (agent.json) while started ranks had no ending. None otherwise."""
    from ddp_doctor.checks.stops import launcher_ended_finding
    from ddp_doctor.training import records
    if launcher_pid is None or not agent_code:
        return None
    unended = {r: hb for r, hb in run.heartbeats.items() if r not in run.outcomes}
    if agent_code > 0 and (os.path.exists(records.agent_result_path(run_dir)) or not unended):
        return None  # the launcher's failure is its ranks' (agent.json), or it failed before any started
    phase = "training" if run.heartbeats else "preflight"
    return launcher_ended_finding(agent_code, launcher_pid, unended, phase=phase)
