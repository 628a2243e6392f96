"""One rank's preflight: local checks, bounded rendezvous, group checks, merged report.

    context -> local checks -> reach the master -> meet at the store -> process group -> group checks
            -> (reporting rank) cross-rank checks over every view -> report -> sinks

Every step has a deadline. Whatever happens, the rank ends with a report: the merged one from the
reporting rank, or its own when it could not reach the others.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

from ddp_doctor import check_runner
from ddp_doctor.checks import internal as events
from ddp_doctor.checks import rendezvous as ev
from ddp_doctor.checks.history_rules import BANDWIDTH, against_history
from ddp_doctor.checks.launcher_env import backend_missing_said, device_missing_said
from ddp_doctor.context import Group, RankContext, current_context
from ddp_doctor.exit_codes import EXIT_INTERNAL, EXIT_OK, FailOn
from ddp_doctor.facts import ports
from ddp_doctor.facts.launchers import address_problem
from ddp_doctor.findings import Finding
from ddp_doctor.preflight_ranks import bounded_rendezvous as rendezvous
from ddp_doctor.preflight_ranks import rank_view as views
from ddp_doctor.preflight_ranks.group_plan import group_plan, plans_differ
from ddp_doctor.processes.launch_dir import LAUNCH_DIR_ENV, LAUNCHED_AT_ENV, note_stage, rank_path
from ddp_doctor.processes.tcp_store import (
    connect_store,
    op_bound,
    prefixed,
    read_json_keys,
    store_call,
    wait_closed,
    wait_keys,
)
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.private_files import write_private
from ddp_doctor.report.publish import Output, apply_fail_on, deliver
from ddp_doctor.report.redact import redact_obj, redact_text
from ddp_doctor.time_limit import call_with_time_limit

HOST_CLOSE_WAIT_S = 5.0  # a rank's wait, after the verdict, for rank 0's preflight store to close


@dataclass
class PreflightOptions:
    timeout: float = 60.0
    select: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    backend: str | None = None
    output: Output = field(default_factory=Output)
    # Explicit rank layout (torch.multiprocessing.spawn users call the API with these).
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    entry_script: str | None = None
    keep_group: bool = False  # leave the process group up (not used by the CLI)
    check_options: dict[str, Any] = field(default_factory=dict)  # becomes RankContext.options
    launch_dir: str | None = None  # where a ddp-doctor parent collects rank files (default: env)
    trace_path: str | None = None  # --trace: the reporting rank writes the Chrome trace (no parent)
    fail_on: FailOn | None = None  # --fail-on / DDP_DOCTOR_FAIL_ON: applied to this rank's exit status


class RankPreflight:
    def __init__(self, ctx: RankContext, opts: PreflightOptions) -> None:
        self.ctx, self.opts = ctx, opts
        self.rank = ctx.rank if ctx.rank is not None else 0
        self.findings: list[Finding] = []
        self.measurements: dict[str, Any] = {}
        self._readers = 0  # how many ranks read the verdict from the store (set at the rendezvous)
        self._sent: str | None = None  # this rank's view as put (view_text)
        self.view: dict[str, Any] = {}
        self.launch_dir = opts.launch_dir or ctx.env.get(LAUNCH_DIR_ENV)
        self.failed = False  # ddp-doctor itself failed (exit code 1)
        self.job_token: str | None = None  # the reporting rank's, with its verdict (records name their job)
        self.verdict: dict[str, Any] | None = None  # the job's, as read from the reporting rank
        # Wall-clock records of this rank's stages and checks ({"name", "cat", "start", "end"}):
        # measurements.stage_seconds / check_seconds and the Chrome trace are made from them.
        self.timeline: list[dict[str, Any]] = []
        self.started = time.time()

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        start = time.time()
        note_stage(self.launch_dir, self.rank, name, start)  # the parent's progress line (stage_lines.py)
        try:
            yield
        finally:
            self.timeline.append({"name": name, "cat": "stage", "start": start, "end": time.time()})

    def _stage_measurements(self) -> None:
        """measurements.stage_seconds (per stage; `communication` is the part of group_checks
        spent in the communication checks, the all_reduce sweep DDP401 first) and check_seconds
        (per check ID) of this rank."""
        stages: dict[str, float] = {}
        checks: dict[str, float] = {}
        for t in self.timeline:
            into = checks if t["cat"] == "check" else stages
            into[t["name"]] = round(into.get(t["name"], 0.0) + t["end"] - t["start"], 6)
            if t.get("category") == "communication":  # the sweep (DDP401) and the other collectives
                stages["communication"] = round(stages.get("communication", 0.0) + t["end"] - t["start"], 6)
        if self.timeline:
            stages["total"] = round(max(t["end"] for t in self.timeline) - self.started, 6)
        self.measurements["stage_seconds"] = stages
        self.measurements["check_seconds"] = checks

    # ------------------------------------------------------------------ steps
    def run(self) -> dict[str, Any]:
        """The preflight of this rank; an unexpected error of ddp-doctor's own still ends in a
        report (with DDP005) rather than a traceback and no report."""
        self.started = time.time()
        launched = self.ctx.env.get(LAUNCHED_AT_ENV)
        try:  # from the parent's launch to here: the launcher, the interpreter, the imports
            if launched and 0 <= self.started - float(launched) < 3600:
                self.timeline.append({"name": "startup", "cat": "stage", "start": float(launched),
                                      "end": self.started})
        except ValueError:
            pass
        try:
            return self._run()
        except Exception as e:  # noqa: BLE001 - ddp-doctor itself failed: a finding, never a lost report
            self.failed = True
            self.findings.append(events.tool_failed(self.rank, e, traceback.format_exc()))
            return self._alone()

    def _run(self) -> dict[str, Any]:
        ctx, opts = self.ctx, self.opts
        with self._stage("local_checks"):
            self.findings += check_runner.run_stage("local", (ctx,), ctx.rank, select=opts.select, skip=opts.skip,
                                              timings=self.timeline)
        with self._stage("view"):
            self.view = views.collect_view(ctx)
        self._write_partial()
        ws = ctx.world_size
        if ws is None or ctx.rank is None or not (0 <= ctx.rank < ws):
            return self._alone()  # the launcher_env checks said why
        if ws == 1:
            import torch.distributed as dist
            return self._with_store(dist.HashStore(), hosting=True)
        addr, port = self._master()
        if addr is None or address_problem(addr) is not None:
            return self._alone()  # no address, or one that is none (DDP111 says so): no rendezvous
        hosting = self.rank == 0 and not ctx.launcher.agent_store
        if hosting:
            busy = rendezvous.port_in_use(port)
            if busy:
                return self._port_taken(addr, port, busy)
            local = rendezvous.is_local_host(addr)
            if local is None:
                reach = ev.Reach(False, "unresolvable", "the name does not resolve")
                self.findings.append(ev.unreachable_finding(reach, addr, port, opts.timeout, self.rank))
                return self._alone()
            if local is False:
                self.findings.append(ev.master_not_local_finding(addr, ctx.host.hostname, self.rank))
                return self._alone()
        else:
            with self._stage("reach_master"):
                reach = rendezvous.reach_master(addr, port, opts.timeout)
            if not reach.ok:
                self.findings.append(ev.unreachable_finding(reach, addr, port, opts.timeout, self.rank))
                return self._alone()
        try:
            with self._stage("store"):
                store = connect_store(addr, port, hosting=hosting, timeout=opts.timeout)
        except Exception as e:  # noqa: BLE001 - turned into a finding
            if hosting and "in use" in str(e).lower():  # another rank 0 bound it since port_in_use looked
                return self._port_taken(addr, port, str(e))
            self.findings.append(ev.store_lost_finding(str(e), self.rank, at=(addr, port), hosting=hosting))
            return self._alone()
        return self._with_store(store, hosting)

    def _prefix(self) -> str:
        """The preflight's keys in the store: one namespace per job attempt (torchrun's run id and
        restart count; hand-launched ranks of one MASTER_ADDR:MASTER_PORT share 'preflight/0')."""
        env = self.ctx.env
        return f"ddp_doctor/{env.get('TORCHELASTIC_RUN_ID', 'preflight')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

    def _port_taken(self, addr: str, port: int, error: str) -> dict[str, Any]:
        """Rank 0 cannot host the store: MASTER_PORT is taken. When another job's rendezvous holds
        it, this process is counted there (so that job fails too: two jobs at one port never pass)
        and the finding names that job's rank 0 (DDP846); otherwise the port in use, and who holds it
        (DDP313)."""
        host = self.ctx.host.hostname
        seen = rendezvous.announce(addr, port, self._prefix(), {
            "rank": self.rank, "pid": os.getpid(), "host": host, "why": ev.COULD_NOT_HOST},
            self.ctx.world_size or 1, min(self.opts.timeout, rendezvous.ANNOUNCE_S))
        if seen is not None:
            taken = ev.PortTaken(port, host, error)
            self.findings.append(ev.shared_rendezvous_finding(seen, addr, port, self.rank, taken))
        else:
            taken = ev.PortTaken(port, host, error, tuple(ports.port_holders(port)))
            self.findings.append(ev.port_in_use_finding(taken, self.rank))
        return self._alone()

    def _master(self) -> tuple[str | None, int]:
        ctx = self.ctx
        addr, port = ctx.master_addr, ctx.master_port or rendezvous.DEFAULT_PORT
        if addr is None and ctx.local_world_size == ctx.world_size:
            addr = "127.0.0.1"  # every rank is on this node (launcher_env says so, as info)
        return addr, port

    def _with_store(self, base_store: Any, hosting: bool) -> dict[str, Any]:
        ctx, opts = self.ctx, self.opts
        store = prefixed(base_store, self._prefix())
        ws = ctx.world_size or 1
        try:
            self.view["findings"] = [f.to_dict() for f in self.findings]
            text = rendezvous.view_text(self.view)  # the view as sent: made before the rank checks in
            self._sent = text
            addr, port = self._master()
            with self._stage("rendezvous"):
                meeting = rendezvous.meet(store, self.rank, ws, self.view, opts.timeout, text,
                                          (addr, port) if addr is not None else None)
        except Exception as e:  # noqa: BLE001 - whatever the store raises is STORE_LOST
            self.findings.append(ev.store_lost_finding(str(e), self.rank))
            return self._alone()
        self.findings += meeting.findings
        if any(f.id == ev.DUPLICATE_RANK.id for f in meeting.findings):
            # not one of this world's ranks (the first claimant is): its own report says why
            self._crowded(store, ws)
            return self._alone()
        if meeting.complete:
            self._group_stage(store, ws)
        try:
            self._stage_measurements()
            final = json.dumps({
                "findings": [f.to_dict() for f in self.findings], "measurements": self.measurements,
                **({"timeline": self.timeline} if opts.trace_path else {})})  # the reporter draws it
            store_call(lambda: store.set(f"final/{self.rank}", final), "final findings", op_bound(opts.timeout))
            if self.rank == meeting.reporter:
                with self._stage("report"):
                    rep = self._report(store, meeting, hosting)
                self._write_partial(final=True)
                return rep
            self._readers = len(meeting.arrived) - 1  # the ranks that read the verdict (all but the reporter)
            with self._stage("await_verdict"):
                rep = self._await_verdict(store)
            self._write_partial(final=True)
            return rep
        except Exception as e:  # noqa: BLE001 - whatever the store raises is STORE_LOST
            self.findings.append(ev.store_lost_finding(str(e), self.rank))
            return self._alone()

    def _group_stage(self, store: Any, ws: int) -> None:
        import torch.distributed as dist
        ctx, opts = self.ctx, self.opts
        backend = ctx.backend
        device = ctx.device
        if backend_missing_said(self.findings, backend, ctx.host.backends) or \
                device_missing_said(self.findings, device, ctx.host.visible_gpus):
            self._say_group_state(store, False)  # said why: an init attempt would only add a second,
            return                               # misleading finding
        try:
            if device.startswith("cuda"):
                import torch
                torch.cuda.set_device(int(device.split(":")[1]))
            if backend == "smddp":
                import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  (registers the backend)
            # init_process_group labels uncaught tracebacks "[rankN]: " (its sys.excepthook): put back
            # at teardown, so a script run next (`ddp-doctor run`) is labelled only by its own init
            hook = sys.excepthook
            with self._stage("init_process_group"):
                dist.init_process_group(backend=backend, store=prefixed(store, "pg/"),
                                        rank=self.rank, world_size=ws, timeout=timedelta(seconds=opts.timeout))
        except Exception as e:  # noqa: BLE001 - torch fails in many ways; PG_INIT_FAILED says which
            self.findings.append(ev.pg_init_failed_finding(backend, ws, self.rank, type(e).__name__, str(e)))
            self._say_group_state(store, False)
            return
        self._say_group_state(store, True)
        with self._stage("group_ready"):
            failed = self._group_failures(store)
        group = Group(rank=self.rank, world_size=ws, backend=backend, device=device, timeout=opts.timeout)
        try:
            if failed:  # a peer is not in the group (its own findings say why): a collective would wait for it
                return
            with self._stage("group_checks"):
                differ = plans_differ(group, group_plan(opts.select, opts.skip), self.rank)
                if differ is not None:  # a collective one rank calls and another never does: none run
                    self.findings.append(differ)
                else:
                    self.findings += check_runner.run_stage("group", (ctx, group), self.rank, select=opts.select,
                                                            skip=opts.skip, timings=self.timeline)
            self.measurements = group.measurements
        finally:
            if not opts.keep_group:
                with self._stage("teardown"):
                    call_with_time_limit(dist.destroy_process_group, 10.0)
                sys.excepthook = hook

    # Every rank says how its init ended, and waits (bounded) until every rank has said so, before
    # its first collective and before it destroys the group:
    # - a peer whose init failed is not in the group. NCCL's init is lazy, so the others' init
    #   returned, and their first collective would wait for that peer (in NCCL's bootstrap, which
    #   no group timeout bounds) until the launcher ends them: no collective is run then.
    # - init_process_group has no barrier at its end (torch's TORCH_DIST_INIT_BARRIER is off by
    #   default): a rank may return from it while a slower peer still completes its connections to
    #   it. Destroying the group then (no collective ran: `--skip communication`) closes them under
    #   that peer, whose init fails ("Gloo connectFullMesh failed ... Connection closed by peer"): a
    #   false DDP321.
    def _say_group_state(self, store: Any, up: bool) -> None:
        bound = op_bound(self.opts.timeout)
        try:
            if not up:  # counted before it is said: once every rank has said, the count is final
                store_call(lambda: store.add("group_failed", 1), "the group's state", bound)
            n = int(store_call(lambda: store.add("group_said", 1), "the group's state", bound))
            if n == (self.ctx.world_size or 1):  # the last to say it tells the others in one key
                store_call(lambda: store.set("group_said/all", "1"), "the group's state", bound)
        except Exception:  # noqa: BLE001 - a lost store is found (and said) by the next store step
            pass

    def _group_failures(self, store: Any) -> int | None:
        """How many ranks' init failed, once every rank has said how its init ended; None when not
        every rank said so in time (a rank that died is reported by the store's own findings)."""
        bound = op_bound(self.opts.timeout)
        try:
            wait_keys(store, ["group_said/all"], "every rank's init", time.monotonic() + bound)
            return int(store_call(lambda: store.add("group_failed", 0), "the group's state", bound))
        except Exception:  # noqa: BLE001 - as above: the group checks go on, bounded by the group's timeout
            return None

    # ------------------------------------------------------------------ endings
    def _report(self, store: Any, meeting: rendezvous.Meeting, hosting: bool) -> dict[str, Any]:
        ctx, opts = self.ctx, self.opts
        deadline = time.monotonic() + opts.timeout
        finals = read_json_keys(store, [f"final/{r}" for r in meeting.arrived], deadline)
        # rank 0 read the views at the meeting, as they came; a reporter standing in for a missing
        # rank 0 (or a rank 0 whose meeting was cut short) reads the others' now, and a record that
        # is no view (another ddp-doctor version's) is read once more, to be named (DDP325)
        views_by_rank = dict(meeting.views)
        unread = [r for r in meeting.arrived if r not in views_by_rank]
        reader = rendezvous.ViewReader(self._sent)
        if unread:
            views_by_rank.update(reader.read(store, unread, time.monotonic() + 1.0, present=True))
        from ddp_doctor.version import __version__
        unreadable = ev.unreadable_finding(reader.unreadable, self.rank, __version__)
        findings: list[Finding] = [unreadable] if unreadable else []
        measurements: dict[str, Any] = {}
        for r in meeting.arrived:
            final = finals.get(f"final/{r}")
            if final is None:
                view = views_by_rank.get(r, {})
                findings += [Finding.from_dict(d) for d in view.get("findings", [])]
                findings.append(events.checked_in_rank_lost(r, opts.timeout))
                continue
            findings += [Finding.from_dict(d) for d in final.get("findings", [])]
            merge_measurements(measurements, final.get("measurements") or {})
        with self._stage("cross_rank_checks"):
            findings += check_runner.run_stage("cross_rank", (ctx, views_by_rank), self.rank,
                                         select=opts.select, skip=opts.skip, timings=self.timeline)
        # the latest moment before the verdict: every process that met here by now is counted
        findings += self._crowded(store, ctx.world_size or 1, keep=False)
        crossed = self.timeline[-1]
        stage_seconds = measurements.setdefault("stage_seconds", {})
        stage_seconds["cross_rank_checks"] = round(crossed["end"] - crossed["start"], 6)
        world, ranks = reportlib.world_of(ctx), [reportlib.rank_entry(v) for v in views_by_rank.values()]
        findings += against_history({"phase": "preflight", "status": "pass", "world": world, "ranks": ranks,
                                     "measurements": measurements, "findings": []}, ctx.env, BANDWIDTH)
        rep = reportlib.build_report(world=world, ranks=ranks, findings=findings, measurements=measurements)
        code = reportlib.exit_code(rep)
        bound = op_bound(self.opts.timeout)
        # the job's token goes to the others with the verdict, which they read anyway: no request
        # of every rank for it (at 4,096 ranks, 4,096 more at the store right after the meeting)
        self.job_token = rendezvous.agree_job_token(store, bound)
        verdict = json.dumps({"status": rep["status"], "exit_code": code, "root_cause": rep["root_cause"],
                              "job_token": self.job_token})
        try:
            store_call(lambda: store.set("verdict", verdict), "the verdict", bound)
        except Exception:  # noqa: BLE001 - the others then report REPORTER_LOST; this report stands
            hosting = False
        deliver(rep, ctx, opts.output, reporter=True, launch_dir=self.launch_dir)
        if opts.trace_path and not self.launch_dir:  # self-launched: the parent writes the trace
            timelines = {r: (finals.get(f"final/{r}") or {}).get("timeline") or [] for r in meeting.arrived}
            timelines[self.rank] = self.timeline
            write_trace(opts.trace_path, timelines,
                        {r: v.get("hostname") for r, v in views_by_rank.items()}, rep)
        if hosting and len(meeting.arrived) > 1:  # the others read the verdict from our store: stay until they have
            try:
                wait_keys(store, ["done/all"], "the others' reading of the verdict", time.monotonic() + 10.0)
            except Exception:  # noqa: BLE001 - our own store stopped answering: nothing left to wait for
                pass
        return rep

    def _await_verdict(self, store: Any) -> dict[str, Any]:
        got = read_json_keys(store, ["verdict"], time.monotonic() + self.opts.timeout + 30.0)
        verdict = got.get("verdict")
        if verdict is None:
            self.findings.append(ev.reporter_lost_finding(self.rank, self.opts.timeout + 30))
            return self._alone()
        token = verdict.get("job_token")
        self.job_token = token if isinstance(token, str) and token else None
        # two jobs met here (one that met after the reporter counted included): this rank fails and
        # says why itself, whatever the verdict (read before "done", while the store is kept up)
        crowded = self._crowded(store, self.ctx.world_size or 1)
        try:
            n = int(store_call(lambda: store.add("done", 1), "the done count", op_bound(self.opts.timeout)))
            if n == self._readers:  # the last reader lets the store's host go
                store_call(lambda: store.set("done/all", "1"), "the done count", op_bound(self.opts.timeout))
        except Exception:  # noqa: BLE001 - the reporter may already be gone; nothing is lost
            pass
        if not self.ctx.launcher.agent_store and (self.ctx.world_size or 1) > 1 and not self.opts.keep_group:
            # rank 0's own store on MASTER_PORT: the script's init_process_group that may come next
            # must find rank 0's new store there, never this one about to close under it
            wait_closed(self._master()[1], HOST_CLOSE_WAIT_S)
        if crowded:
            return self._alone()
        rep = {"status": verdict["status"], "root_cause": verdict.get("root_cause"), "findings": []}
        deliver(rep, self.ctx, self.opts.output, reporter=False, launch_dir=self.launch_dir)
        self.verdict = {"status": rep["status"], "root_cause": rep["root_cause"]}
        self._write_partial(final=True)
        return rep

    def _crowded(self, store: Any, ws: int, keep: bool = True) -> list[Finding]:
        """DDP846 when more processes met at this store than the world has ranks (two jobs at one
        MASTER_ADDR:MASTER_PORT); added to this rank's findings with `keep`. Never raises."""
        try:
            seen = rendezvous.crowd(store, ws, op_bound(self.opts.timeout))
        except Exception:  # noqa: BLE001 - a store that stopped answering is said elsewhere
            return []
        if seen is None:
            return []
        addr, port = self._master()
        found = [ev.shared_rendezvous_finding(seen, addr or "?", port, self.rank)]
        if keep:
            self.findings += found
        return found

    def _alone(self) -> dict[str, Any]:
        """This rank could not join the others: it reports what it knows itself."""
        self._stage_measurements()
        rep = reportlib.build_report(world=reportlib.world_of(self.ctx),
                                     ranks=[reportlib.rank_entry(self.view)] if self.view else [],
                                     findings=self.findings, measurements=self.measurements)
        self._write_partial(final=True)
        deliver(rep, self.ctx, self.opts.output, reporter=False, alone=True, launch_dir=self.launch_dir)
        return rep

    def _write_partial(self, final: bool = False) -> None:
        """In a self-launched preflight, each rank leaves its findings for the parent; a rank that
        read the job's verdict from the reporting rank leaves it too (the parent of a node without
        the reporting rank shows it)."""
        if not self.launch_dir:
            return
        path = rank_path(self.launch_dir, self.rank)
        try:  # redacted, and readable by this user only (0600), as every record in a run directory
            write_private(path, json.dumps(redact_obj({
                "rank": self.rank, "final": final, "view": self.view,
                "findings": [x.to_dict() for x in self.findings], "timeline": self.timeline,
                **({"verdict": self.verdict} if self.verdict is not None else {})}), default=str))
        except (OSError, ValueError):
            pass


def merge_measurements(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Per size, a collective is as slow as its slowest rank and correct only if all ranks agree;
    a stage or a check (stage_seconds, check_seconds) takes as long as on its slowest rank; a flag
    holds when it holds on a rank; anything else (host_load's readings, made from figures every
    rank gathered) is the same on every rank: the first kept."""
    for name, entries in more.items():
        if isinstance(entries, dict):
            cur = into.setdefault(name, {})
            for key, value in entries.items():
                if isinstance(value, bool):
                    cur[key] = bool(cur.get(key)) or value
                elif isinstance(value, (int, float)):
                    cur[key] = max(float(cur.get(key, value)), float(value))
                else:
                    cur.setdefault(key, value)
            continue
        by_size = {e["bytes"]: e for e in into.setdefault(name, [])}
        for e in entries:
            cur = by_size.get(e["bytes"])
            if cur is None:
                by_size[e["bytes"]] = dict(e)
            elif e["time_us"] > cur["time_us"]:
                by_size[e["bytes"]] = {**e, "correct": cur["correct"] and e["correct"]}
            else:
                cur["correct"] = cur["correct"] and e["correct"]
        into[name] = sorted(by_size.values(), key=lambda e: e["bytes"])


def write_trace(path: str, timelines: dict[int, list[dict[str, Any]]], hosts: dict[int, Any],
                rep: dict[str, Any] | None) -> None:
    """The preflight's Chrome trace (one lane per rank: its stages and checks, its errors) to
    `path`; a trace that cannot be written is a warning, never a failure."""
    from ddp_doctor.report import chrome_trace as tracelib
    from ddp_doctor.report import sinks
    from ddp_doctor.report.publish import warn
    try:
        found = tracelib.finding_records(rep)
        lanes = {r: {"host": hosts.get(r), "records": tracelib.preflight_records(t) + found.get(r, [])}
                 for r, t in timelines.items()}
        err = sinks.write_trace_file(tracelib.chrome_trace(lanes), path)
    except Exception as e:  # noqa: BLE001 - a trace never takes the run down
        err = f"could not make the trace {path}: {type(e).__name__}: {e}"
    if err:
        warn(err)


def run_preflight_rank(opts: PreflightOptions) -> int:
    """Run this process's preflight as the rank its launcher says it is; returns the exit code."""
    try:
        ctx = current_context(backend=opts.backend, rank=opts.rank, world_size=opts.world_size,
                              local_rank=opts.local_rank, entry_script=opts.entry_script,
                              options=opts.check_options)
        pf = RankPreflight(ctx, opts)
        rep = pf.run()
    except Exception as e:  # noqa: BLE001 - ddp-doctor itself failed: say so, exit 1
        detail = traceback.format_exc() if os.environ.get("DDP_DOCTOR_DEBUG") else ""
        sys.stderr.write(redact_text(f"ddp-doctor: internal error: {type(e).__name__}: {e}\n"
                                     "(set DDP_DOCTOR_DEBUG=1 for the traceback)\n" + detail))
        return EXIT_INTERNAL
    if os.environ.get(LAUNCH_DIR_ENV):
        return EXIT_OK  # the parent that launched us decides the exit code
    return EXIT_INTERNAL if pf.failed else apply_fail_on(reportlib.exit_code(rep), rep, opts.fail_on)
