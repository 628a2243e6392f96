"""The artifacts read (postmortem/inputs.py) as the evidence `ddp-doctor run` gathers live
(checks/job.JobEvidence): each rank's ending as an outcome record (its last traceback), the exit
statuses the launcher's summary gives, faulthandler's dumps as crashes, flight-recorder dumps as
ledgers; and the post-mortem's own findings on what was missing (checks/post_mortem.py).

Which rank is which comes from the artifacts only: torch's `[rankN]` prefix, the launcher's
summary (rank and local rank), a rank's file; torchrun's local rank stands for the rank only when
the artifacts hold a single node's output. Times: torchelastic's error file has the moment a rank
raised; otherwise the order of their lines in the console that interleaves them (a line's
position in its source), from the earliest time the artifacts give (the launcher's summary, else
the files' modification times).
"""
from __future__ import annotations

import bisect
import signal
from dataclasses import dataclass, field
from typing import Any, Callable

from ddp_doctor.checks import post_mortem
from ddp_doctor.checks.efa import nccl_network_finding
from ddp_doctor.checks.job import JobEvidence
from ddp_doctor.checks.wrapped_errors import parse_traceback
from ddp_doctor.facts.efa import NcclNetwork, nccl_network
from ddp_doctor.facts.launchers import MAX_RANKS
from ddp_doctor.findings import Finding
from ddp_doctor.postmortem.artifacts import Artifacts
from ddp_doctor.postmortem.launcher_text import RankExit
from ddp_doctor.postmortem.nccl_lines import op_name
from ddp_doctor.postmortem.rank_text import RankText

ORDER_STEP = 1e-3  # seconds between two ranks' endings: their order, on the artifacts' clock
# Ranks the artifacts imply (below the largest rank or world size they name) but hold nothing of
# are listed one by one up to this many; past it they are counted, never made one by one.
MAX_LISTED_ABSENT = 4096
MAX_EXIT_STATUS = 255  # an exit status outside -255..255 (a signal is negative) is no process's


def _believed(art: Artifacts) -> list[dict[str, Any]]:
    """Drop from `art` what no real job says: a rank or local rank outside 0..MAX_RANKS-1, a world
    size past MAX_RANKS; an exit status outside -255..255 is read as unknown. Returns what was
    dropped, for measurements.post_mortem.unplaced."""
    def ok(n: Any) -> bool:
        return isinstance(n, int) and 0 <= n < MAX_RANKS

    why = f"rank beyond any real job (0 to {MAX_RANKS - 1:,}): not believed"
    dropped: list[dict[str, Any]] = []
    for r in [r for r in art.texts if not ok(r)]:
        del art.texts[r]
        dropped.append({"output": f"rank {str(r)[:40]}", "why": why})
    for key in [k for k in art.local_texts if not ok(k[1])]:
        del art.local_texts[key]
        dropped.append({"output": str(key[0])[:200], "local_rank": None, "why": why})
    for key in [k for k, r in art.local_to_rank.items() if not (ok(k[1]) and ok(r))]:
        del art.local_to_rank[key]
    for key in [k for k in art.error_files if not ok(k[1] if isinstance(k, tuple) else k)]:
        dropped.append({"output": str(art.error_files.pop(key).path)[:200], "why": why})
    for r in [r for r in art.ledgers if not ok(r)]:
        dropped.append({"output": str(art.ledgers.pop(r).get("path"))[:200], "why": why})
    for r in [r for r in art.launcher.exits if not ok(r)]:
        del art.launcher.exits[r]
        dropped.append({"output": f"the launcher's summary of rank {str(r)[:40]}", "why": why})
    for e in art.launcher.exits.values():
        if e.local_rank is not None and not ok(e.local_rank):
            e.local_rank = None
        if e.exit_code is not None and not -MAX_EXIT_STATUS <= e.exit_code <= MAX_EXIT_STATUS:
            e.exit_code = None
    art.launcher.world_sizes = {n for n in art.launcher.world_sizes if 1 <= n <= MAX_RANKS}
    return dropped


@dataclass
class PostMortem:
    evidence: JobEvidence
    findings: list[Finding] = field(default_factory=list)
    world: dict[str, Any] = field(default_factory=dict)
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # per rank: how it ended, from what
    unplaced: list[dict[str, Any]] = field(default_factory=list)  # output whose global rank is unknown


def _resolve_local(art: Artifacts) -> tuple[list[tuple[str, int]], bool]:
    """Output known by torchrun's local rank only, given its global rank: from a line that carried
    both, from the launcher's summary (a single node), or the local rank itself when the artifacts
    hold one node's. Returns the outputs left without a rank, and whether the artifacts are one node's."""
    by_local = {e.local_rank: e.rank for e in art.launcher.exits.values() if e.local_rank is not None}
    # one node unless the artifacts say otherwise: the summary names several hosts, or one local
    # rank is two ranks (a console and a log tree of one node are two sources, one node)
    hosts = {e.host for e in art.launcher.exits.values() if e.host}
    hosts |= {h for t in art.local_texts.values() for h in t.hosts}  # files named after their host
    seen: dict[int, set[int]] = {}
    for (_, local), rank in art.local_to_rank.items():
        seen.setdefault(local, set()).add(rank)
    one_node = len(hosts) <= 1 and all(len(r) == 1 for r in seen.values())
    by_local = {**{local: next(iter(r)) for local, r in seen.items()}, **by_local} if one_node else by_local
    left = []
    for (node, local), text in art.local_texts.items():
        rank = art.local_to_rank.get((node, local))
        if rank is None and one_node:
            rank = by_local.get(local, local)
        if rank is None:
            left.append((node, local))
            continue
        art.rank_text(rank).merge(text)
    for key in list(art.error_files):
        if isinstance(key, tuple):
            rank = art.local_to_rank.get(key)
            if rank is None and one_node:
                rank = by_local.get(key[1], key[1])
            art.error_files[rank if rank is not None else key] = art.error_files.pop(key)
    for e in art.launcher.exits.values():  # the summary names each failed rank's error file
        for key in [k for k, ef in art.error_files.items() if e.error_file and ef.path == e.error_file]:
            art.error_files[e.rank] = art.error_files.pop(key)
    return left, one_node


def _position(ev: JobEvidence, rank: int) -> str:
    """Where a rank's dump leaves it, as the live ledger says it: "failed" (it raised),
    "finished" (its script ended well), else "hung" (stopped by a signal, or its ending unknown:
    the dump is its last record)."""
    o = ev.outcomes.get(rank)
    if o is not None and o.get("exception"):
        return "failed"
    if o is not None and o.get("exit_code") == 0:
        return "finished"
    return "hung"


def _entry(seq: int, pg: str, name: str | None, *, op: str | None = None, numel: int | None = None,
           pending: bool = False, created_ns: int | None = None) -> dict[str, Any]:
    """A collective as a flight-recorder entry (checks/collectives.py reads this shape)."""
    e: dict[str, Any] = {"record_id": seq, "collective_seq_id": seq, "profiling_name": op,
                         "process_group": [pg, name or ""], "retired": not pending, "is_p2p": False}
    if numel is not None:
        e.update(input_sizes=[[numel]], output_sizes=[[numel]])
    if created_ns is not None:
        e["time_created_ns"] = created_ns
    return e


def _watchdog_ledgers(texts: dict[int, RankText], ranks: list[int], when: Any, *,
                      have: set[int]) -> dict[int, dict[str, Any]]:
    """Ledgers from NCCL's watchdog lines (postmortem/nccl_lines.py), for ranks without a dump:
    a rank that timed out waits in its collective, after the group's last completed one; a rank
    of the job whose output shows no wait in that group completed the group's last completed
    collective (a collective completes on every rank or none) and issued no later one its log
    shows: where it is, its output's last line says."""
    waiting: dict[int, tuple[str, str | None, dict[str, Any], int]] = {}
    for r in ranks:
        t = texts.get(r)
        if t is None or r in have:
            continue
        waits = [w for w in t.waits if w["kind"] == "wait"]
        if not waits:
            continue
        w = max(waits, key=lambda x: x["seq"])
        p = next((x for x in t.waits if x["kind"] == "progress" and x["at"] == w["seq"]), None)
        pg, name = (p["pg"], p["pg_name"]) if p else ("0", None)
        waiting[r] = (pg, name, w, p["completed"] if p else w["seq"] - 1)
    out: dict[int, dict[str, Any]] = {}
    for r, (pg, name, w, done) in waiting.items():
        issued = int((when(r, w["position"]) - w["ran_ms"] / 1000.0) * 1e9)  # the wait began then
        entries = [_entry(done, pg, name)] if done > 0 else []
        entries.append(_entry(w["seq"], pg, name, op=op_name(w["op"]), numel=w["numel"], pending=True,
                              created_ns=issued))
        out[r] = {"rank": r, "source": "nccl_log", "position": "hung", "steps": None, "where": None,
                  "complete": False, "entries": entries, "pg_config": {}}
    for pg in {v[0] for v in waiting.values()}:
        done = min(v[3] for v in waiting.values() if v[0] == pg)
        name = next((v[1] for v in waiting.values() if v[0] == pg and v[1]), None)
        for r in ranks:
            t = texts.get(r)
            if r in waiting or r in have or t is None or not t.lines or done <= 0:
                continue
            last = t.tail[-1] if t.tail else None
            out[r] = {"rank": r, "source": "nccl_log", "position": "hung", "steps": None, "inferred": True,
                      "where": f"its output's last line: {last!r}" if last else None, "complete": False,
                      "entries": [_entry(done, pg, name)], "pg_config": {}}
    return out


def _known_ranks(art: Artifacts, exits: dict[int, RankExit]) -> tuple[dict[int, str], int, int]:
    """(rank -> what tells of it, the world size, the ranks implied but too many to list): every rank
    the artifacts name or their world size implies, with its source, so each can be judged and a rank
    of which nothing is here is still named (counted instead past MAX_LISTED_ABSENT)."""
    known_from: dict[int, str] = {}
    for r in exits:
        known_from[r] = "the launcher's summary"
    for r in art.ledgers:
        known_from.setdefault(r, "a flight-recorder dump")
    for r in art.texts:
        known_from.setdefault(r, "its output")
    world = max([*known_from, *[n - 1 for n in art.launcher.world_sizes]], default=-1) + 1
    absent = world - sum(1 for r in known_from if r < world)  # ranks the world implies, of which nothing is here
    unlisted = absent if absent > MAX_LISTED_ABSENT else 0
    if not unlisted:
        for r in range(world):
            known_from.setdefault(r, f"the world size ({world})")
    return known_from, world, unlisted


def _ending_clock(art: Artifacts, base: float) -> Callable[[int, int | None], float]:
    """when(rank, position): the time a rank's line at `position` is taken to have come, for the order
    of the ranks' endings: the error file's time when torchelastic wrote one, else `base` plus
    ORDER_STEP per line position (a line's place in its source) that comes before it."""
    order = sorted({p for t in art.texts.values() for p in (t.ending_position(), t.dump and t.dump[1], t.last_seq)
                    if p is not None})

    def when(rank: int, seq: int | None) -> float:
        ef = art.error_files.get(rank)
        if ef is not None and ef.time is not None:
            return ef.time
        return base + bisect.bisect_left(order, seq or 0) * ORDER_STEP

    return when


def _exception_of(art: Artifacts, r: int, text: RankText | None, ex: RankExit | None) -> dict[str, Any] | None:
    """The Python error rank `r` raised ({type, message, traceback}), or None: from its output, else
    from torchelastic's error file or the launcher's summary that quotes it (the first that parses)."""
    exc = text.exception() if text is not None else None
    quoted = [art.error_files[r].text] if r in art.error_files else []
    quoted += [ex.traceback] if ex is not None and ex.traceback else []
    for given in quoted:
        if exc is None:  # the error file, or the summary that quotes it
            err = parse_traceback(given)
            exc = {"type": err.type, "message": err.message, "traceback": given} if err is not None else None
    return exc


def _aborted_at_exit(text: RankText, ex: RankExit) -> bool:
    """Whether the rank aborted while its interpreter exited: no Python error, then "terminate called
    without an active exception" and SIGABRT (torch's gloo aborts in its static destructors), so its
    script had ended itself; the status it asked for is lost to the abort."""
    return (ex.exit_code in (-signal.SIGABRT, 128 + signal.SIGABRT) and text.abort_at_exit is not None
            and (text.dump is None or text.dump[2] == -signal.SIGABRT))


def _read_ending(ev: JobEvidence, art: Artifacts, r: int, ex: RankExit | None,
                 when: Callable[[int, int | None], float], one_node: bool) -> dict[str, Any]:
    """How rank `r` ended, from what (measurements.post_mortem.ranks); what a live run would have
    recorded of it goes into `ev` as it would have (an outcome record, an exit status, a crash), so
    the checks judge a post-mortem as they judge `ddp-doctor run`."""
    text = art.texts.get(r)
    exc = _exception_of(art, r, text, ex)
    host = (ex.host if ex else None) or (sorted(text.hosts)[0] if text is not None and text.hosts else None)
    record = {"host": host, "local_rank": ex.local_rank if ex else None, "phase": "training"}
    last_line = text.tail[-1] if text is not None and text.tail else None
    if exc is not None:
        t = when(r, text.ending_position() if text is not None else None)
        code = ex.exit_code if ex is not None and ex.exit_code and ex.exit_code > 0 else 1
        ev.outcomes[r] = {"exit_code": code, "exception": {**exc, "time": t}, "time": t, **record}
        ending: dict[str, Any] = {"ended": "raised", "error": f"{exc['type']}: {str(exc['message'])[:200]}"}
    elif ex is not None and text is not None and _aborted_at_exit(text, ex):
        t = when(r, text.last_seq)
        ev.outcomes[r] = {"exit_code": 128 + signal.SIGABRT, "exception": None, "time": t, **record,
                          "exited": {"time": t, "from_output": True, "aborted_at_exit": True, "last_line": last_line}}
        ending = {"ended": "exited", "exit_status": ex.exit_code, "aborted_at_exit": True}
    elif text is not None and text.dump is not None:
        dump, dseq, status = text.dump
        code = ex.exit_code if ex is not None and ex.exit_code is not None else status
        ev.exits[r] = code
        ev.crashes[r] = (dump, when(r, dseq))
        ending = {"ended": "crashed", "exit_status": code}
    elif ex is not None and ex.exit_code is not None and 0 < ex.exit_code < 128 and text is not None \
            and text.lines:
        # a status of its own (not 128 + a signal) and no Python error in the rank's output:
        # its script ended itself, as run's probe would have recorded it (DDP814)
        t = when(r, text.last_seq)
        ev.outcomes[r] = {"exit_code": ex.exit_code, "exception": None, "time": t, **record,
                          "exited": {"time": t, "from_output": True, "last_line": last_line}}
        ending = {"ended": "exited", "exit_status": ex.exit_code}
    elif ex is not None and ex.exit_code is not None:
        ev.exits[r] = ex.exit_code
        ending = {"ended": "killed" if ex.exit_code < 0 else "exited", "exit_status": ex.exit_code}
    elif one_node and art.launcher.summaries and (text is not None or r in art.ledgers):
        # torchrun's summary lists every rank of its node that did not exit 0, the ones it
        # stopped included: a rank of that node absent from it ended well, before the others
        ev.outcomes[r] = {"exit_code": 0, "exception": None, "time": when(r, text.last_seq if text else None),
                          **record}
        ending = {"ended": "exited", "exit_status": 0, "from": "absent from the launcher's summary"}
    else:
        ending = {"ended": "unknown"}
    ending.update(host=host, lines=text.lines if text is not None else 0, last_line=last_line)
    return ending


def _note_interruption(ev: JobEvidence, art: Artifacts, stopped: tuple[int, int | None], ranks: list[int],
                       per_rank: dict[int, dict[str, Any]], base: float) -> None:
    """Record in `ev` that the launcher was stopped by a signal (a stopped SageMaker job, a time limit,
    Ctrl-C) and stopped the ranks: the job was interrupted, as run reports it (DDP808), each rank where
    its output last left it."""
    from ddp_doctor.processes.stop_signals import Interrupt
    signo, pid = stopped
    agent = f"{art.launcher.launcher or 'the launcher'}'s agent" + (f" (pid {pid})" if pid else "")
    ev.interrupted = Interrupt(signo=signo, to=agent, at=max(art.mtimes.values(), default=base))
    if not ranks and art.launcher.unplaced_lines:
        ev.unplaced_output = {"lines": art.launcher.unplaced_lines, "last": art.launcher.last_unplaced}
    for r in ranks:
        last = per_rank[r].get("last_line")
        ev.stopped_at[r] = {"where": f"its output's last line {str(last).strip()[:160]!r}" if last and
                            str(last).strip() else "no output"}


def _place_ledgers(ev: JobEvidence, art: Artifacts, ranks: list[int], per_rank: dict[int, dict[str, Any]],
                   when: Callable[[int, int | None], float]) -> None:
    """Complete `ev`'s ledgers as a live run's: add those NCCL's watchdog lines give for ranks without
    a dump, and give each dump the rank's position (failed, finished, hung), where its output left it,
    and the entry a failed rank's error came from, which a dump alone does not say."""
    for r, led in _watchdog_ledgers(art.texts, ranks, when, have=set(ev.ledgers)).items():
        ev.ledgers[r] = led
    for r, led in ev.ledgers.items():
        if led.get("source") == "nccl_log":
            continue  # where the watchdog left it: waiting, or past the group's last collective
        led["position"] = _position(ev, r)
        last = per_rank.get(r, {}).get("last_line")
        if not led.get("where") and last and str(last).strip():  # a dump says nothing of where the rank is
            led["where"] = f"its output's last line: {str(last).strip()[:160]!r}"
        if led["position"] == "failed":
            from ddp_doctor.training.run.ledger import from_exception
            if from_exception(ev.outcomes[r].get("exception"))[0] and led.get("entries"):
                max(led["entries"], key=lambda e: int(e.get("time_created_ns") or 0))["failed_here"] = True


def _post_mortem_findings(art: Artifacts, ev: JobEvidence, ranks: list[int], per_rank: dict[int, dict[str, Any]],
                          known_from: dict[int, str], when: Callable[[int, int | None], float], world: int,
                          unlisted: int) -> list[Finding]:
    """The post-mortem's own findings (checks/post_mortem.py), on what the artifacts lack: ranks
    without output, ranks with no ending while others failed, no failure or nothing read at all,
    inputs left unread, several jobs or consoles of which one was read."""
    found: list[Finding] = []
    failed = bool(ev.outcomes or any(c for c in ev.exits.values()) or ev.crashes)
    missing = sorted(ev.unlogged)
    if missing or unlisted:
        empty = [r for r in missing if art.texts.get(r) is not None]
        # a rank that printed nothing but whose ending the launcher gives (killed, crashed without
        # faulthandler, or ended well) is said so, but its ending is known: no warning
        unknown = [r for r in missing if per_rank[r]["ended"] not in ("killed", "crashed")
                   and per_rank[r].get("exit_status") != 0]
        found.append(post_mortem.log_missing_finding(missing, known_from, empty, ending_known=not unknown
                                                     and not unlisted, unlisted=unlisted, world=world))
    if ev.interrupted is not None:
        pass  # stopped: DDP808 says where each rank was, neither a failure to find nor a rank still at work
    elif failed:
        for r in ranks:
            if per_rank[r]["ended"] == "unknown" and r not in ev.unlogged:
                text = art.texts[r]
                found.append(post_mortem.still_running_finding(r, per_rank[r]["last_line"],
                                                               when(r, text.last_seq)))
    elif ranks or art.read:
        found.append(post_mortem.no_failure_finding(ranks, len(art.read)))
    else:  # nothing could be read: a report that passed would judge no evidence at all
        found.append(post_mortem.nothing_read_finding(len(art.skipped)))
    if art.skipped:
        found.append(post_mortem.unread_input_finding(art.skipped))
    if art.jobs_left and art.job is not None:
        found.append(post_mortem.several_jobs_finding(art.job, art.jobs_left))
    if art.consoles_left:
        found.append(post_mortem.several_consoles_finding(art.consoles_read, art.consoles_left))
    return found


def _network_finding(art: Artifacts, platform: dict[str, Any] | None, hosts: list[str],
                     net: NcclNetwork | None) -> Finding | None:
    """The finding on the network NCCL chose (sockets where the instance type has EFA), or None: it
    needs the job's NCCL INFO lines and the instance type the platform or --instance-type gives."""
    itype = (platform or {}).get("instance_type")
    if net is None or not itype:
        return None
    nodes = max(int((platform or {}).get("instance_count") or 0), len(hosts))
    given_by = (platform or {}).get("instance_type_from") or "the platform"
    return nccl_network_finding(art.nccl_lines, itype, "the job's NCCL INFO lines", nodes=nodes, given_by=given_by)


def build(art: Artifacts, platform: dict[str, Any] | None = None) -> PostMortem:
    """The evidence of the job in `art`; `platform`: what the platform knows of it (the SageMaker
    job's instance type and count, or --instance-type), for the rules that need the hardware."""
    doubted = _believed(art)
    unplaced, one_node = _resolve_local(art)
    exits: dict[int, RankExit] = dict(art.launcher.exits)
    texts = art.texts
    known_from, world, unlisted = _known_ranks(art, exits)
    ranks = sorted(known_from)
    for r in ranks:
        if (r not in texts or not texts[r].lines) and art.printed_in_scanned(r):
            art.rank_text(r).lines += 1  # it printed, in the middle of a large console
    base = min([e.time for e in exits.values() if e.time is not None], default=None)
    if base is None:
        base = min(art.mtimes.values(), default=0.0)
    when = _ending_clock(art, base)

    ev = JobEvidence(ranks=ranks, world_size=world or None, started=bool(texts), ledgers=dict(art.ledgers))
    per_rank = {r: _read_ending(ev, art, r, exits.get(r), when, one_node) for r in ranks}
    if art.launcher.stopped is not None:
        _note_interruption(ev, art, art.launcher.stopped, ranks, per_rank, base)
    _place_ledgers(ev, art, ranks, per_rank, when)
    ev.unlogged = {r for r in ranks if texts.get(r) is None or not texts[r].lines}
    # what the ranks' init waits are judged against (checks/init_waits.py)
    ev.launched_known = "stated" if art.launcher.world_sizes else "one node" if one_node and not ev.unlogged else ""
    found = _post_mortem_findings(art, ev, ranks, per_rank, known_from, when, world, unlisted)
    hosts = sorted({h for r in per_rank.values() for h in [r.get("host")] if h})
    net = nccl_network(art.nccl_lines) if art.nccl_lines else None
    sockets = _network_finding(art, platform, hosts, net)
    found += [sockets] if sockets is not None else []
    world_info = {"launcher": art.launcher.launcher or ("torchrun" if art.local_texts else None),
                  "backend": art.backend(),
                  **({"nccl_network": net.name} if net is not None and net.name else {}),
                  "world_size": world or None,
                  "nnodes": len(hosts) or None, "hosts": hosts, "source": "post-mortem",
                  **({"run_id": art.job, "attempts": art.attempts} if art.job is not None else {})}
    return PostMortem(evidence=ev, findings=found, world=world_info, ranks=per_rank,
                      unplaced=[{"output": node, "local_rank": local} for node, local in unplaced] + doubted)
