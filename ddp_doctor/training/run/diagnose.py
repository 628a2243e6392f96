"""From what the ranks left behind (outcome records, launcher exit statuses, a detected hang) to
findings and the job's exit code. Pure functions: the run wrapper gathers, this decides.

Root cause = the first rank that failed. Ranks that failed later with another error, or with an
error that is a known symptom of a lost peer, are labelled as peers that failed after it (DDP802).
"""
from __future__ import annotations

import re
import signal
from typing import Any

from ddp_doctor.checks import training_failures as failures
from ddp_doctor.checks.internal import event_finding
from ddp_doctor.checks.signatures import classify
from ddp_doctor.findings import Finding
from ddp_doctor.training.frames import not_user_code_dirs

MESSAGE_LIMIT = 600
# Fatal signals raised in native code: faulthandler dumps the Python stack for each of them.
NATIVE_SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGBUS: "bus error",
                  signal.SIGILL: "illegal instruction", signal.SIGFPE: "floating-point exception",
                  signal.SIGABRT: "abort"}
NATIVE_HINTS = {
    signal.SIGSEGV: "A segmentation fault in native code: check that compiled extensions (and libraries "
                    "such as apex, flash-attn, bitsandbytes) were built for this torch and CUDA version, and "
                    "reproduce on one rank with `python -X faulthandler` at the line named.",
    signal.SIGBUS: "A bus error: most often /dev/shm is too small for DataLoader workers (docker "
                   "--shm-size, or num_workers=0 to confirm), or a memory-mapped file shrank under the job.",
    signal.SIGILL: "An instruction this machine lacks: a wheel or extension built for a newer CPU (AVX-512) "
                   "or GPU architecture; install builds that match this instance type.",
    signal.SIGFPE: "An arithmetic fault in native code (an integer division by zero in an extension): "
                   "check the shapes and sizes passed at the line named.",
    signal.SIGABRT: "Native code called abort(): an uncaught C++ exception ('terminate called after "
                    "throwing'), a failed internal assertion, or NCCL's watchdog ending a timed-out "
                    "collective; the rank's last stderr lines before the crash say which.",
}
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


def _short(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_text(exc: dict[str, Any]) -> str:
    return f"{exc.get('type')}: {exc.get('message')}\n{exc.get('traceback', '')}"


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def exception_finding(rank: int, exc: dict[str, Any], *, consequence_of: int | None = None) -> Finding:
    """One rank's exception as a finding: a known signature, a spawn child, or DDP800."""
    text = failure_text(exc)
    summary = _short(f"{exc.get('type')}: {exc.get('message')}")
    evidence: dict[str, Any] = {"exception": exc.get("type"), "traceback": exc.get("traceback", "")}
    child = re.search(r"process (\d+) terminated with", text, re.I)
    if child:
        # torch.multiprocessing.spawn re-raised a child's error: judge the child's own traceback
        evidence["spawn_process"] = int(child.group(1))
        text = str(exc.get("message", "")).split("following error:", 1)[-1]
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        summary = _short(lines[-1] if lines else summary)
        rank = int(child.group(1))
    sig = classify(text)
    if consequence_of is not None or (sig is not None and sig.consequence):
        evidence["consequence"] = True
        evidence["signature"] = sig.entry.id if sig else None
        first = f"after rank {consequence_of} failed" if consequence_of is not None else "after a peer failed"
        return event_finding(failures.PEER_FAILED, f"rank {rank} failed {first}: {summary}", rank=rank,
                           evidence=evidence, phase="training")
    who = f"spawned process {rank}" if child else f"rank {rank}"
    if sig is not None:
        return event_finding(sig.entry, f"{who} raised {summary}", rank=rank, evidence=evidence,
                           phase="training")
    if child:
        return event_finding(failures.SPAWN_CHILD_FAILED, f"{who} (torch.multiprocessing.spawn) failed: "
                           f"{summary}", rank=rank, evidence=evidence, phase="training")
    return event_finding(failures.RANK_RAISED, f"rank {rank} raised {summary}", rank=rank,
                       evidence=evidence, phase="training")


def crashing_frames(dump: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the thread that took the fatal signal, innermost first, from
    faulthandler's text ("Current thread ..." with all threads, "Stack ..." with one)."""
    frames: list[tuple[str, int, str]] = []
    inside = False
    for line in dump.splitlines():
        if line.startswith(("Current thread", "Stack (most recent call first)")):
            inside, frames = True, []
            continue
        if inside:
            m = _FRAME.match(line)
            if not m:
                if frames:
                    break
                continue
            frames.append((m["file"], int(m["line"]), m["func"]))
    return frames


def native_crash_finding(rank: int, code: int, dump: str, when: float | None = None) -> Finding:
    """A rank killed by a fatal signal in native code, with the Python line that called into it."""
    sig = signal.Signals(-code)
    frames = crashing_frames(dump)
    skip = not_user_code_dirs()
    user = next((f for f in frames if not f[0].startswith(skip)), frames[0] if frames else None)
    where = f" at {user[0]}:{user[1]} in {user[2]}" if user else " (no Python frame was recorded)"
    stack = "\n".join(f"  {f}:{ln} in {fn}" for f, ln, fn in frames)
    finding = event_finding(
        failures.NATIVE_CRASH, f"rank {rank} crashed with {sig.name} ({NATIVE_SIGNALS[sig]}) in native "
        f"code{where}", rank=rank, hint=NATIVE_HINTS[sig], phase="training",
        evidence={"exit_status": code, "signal": sig.name, "python_stack": stack, "faulthandler": dump[-4000:]})
    if when is not None:
        finding.time = when
    return finding


def training_findings(outcomes: dict[int, dict[str, Any]], exits: dict[int, int], ranks: list[int],
                      crashes: dict[int, tuple[str, float]] | None = None) -> tuple[list[Finding], int]:
    """Findings and the job's exit code (the root-cause rank's own code; 0 when all ended well).

    `outcomes`: rank -> record written by the rank when the script ended; `exits`: rank -> exit
    status the launcher saw (negative: killed by that signal), for ranks that did not end with 0;
    `crashes`: rank -> (faulthandler's dump, its time) for ranks that took a fatal signal."""
    crashes = crashes or {}
    findings: list[Finding] = []
    failed = sorted(((o["exception"].get("time", o["time"]), r) for r, o in outcomes.items()
                     if o.get("exception")), key=lambda x: x[0])
    sig_of = {r: classify(failure_text(outcomes[r]["exception"])) for _, r in failed}
    # The root cause is the first rank whose error is not itself a symptom of a lost peer.
    causes = [r for _, r in failed if not (sig_of[r] is not None and sig_of[r].consequence)]
    first_rank = causes[0] if causes else (failed[0][1] if failed else None)
    first_key = None
    if first_rank is not None:
        e = outcomes[first_rank]["exception"]
        first_key = (e.get("type"), e.get("message"))
    for _, r in failed:
        e = outcomes[r]["exception"]
        same = (e.get("type"), e.get("message")) == first_key or (
            sig_of[r] is not None and sig_of[r] is sig_of.get(first_rank))  # raised on its own too
        peer = first_rank if (r != first_rank and not same) else None
        f = exception_finding(r, e, consequence_of=peer)
        f.time = e.get("time", f.time)
        findings.append(f)
    for r in ranks:
        code = exits.get(r)
        o = outcomes.get(r)
        if code is None or code == 0:
            continue
        if o is not None and o.get("exit_code") == 0 and code == -signal.SIGABRT:
            findings.append(event_finding(
                failures.ABORT_AT_EXIT, f"rank {r}: the script ended with status 0, then the process "
                f"aborted (SIGABRT) during interpreter shutdown", rank=r, phase="teardown"))
        elif o is not None and code in (-signal.SIGKILL, -signal.SIGTERM):
            # SIGKILL: ddp-doctor ended it past the teardown bound; SIGTERM: the launcher did, once
            # a peer stuck the same way was ended first. After another rank failed (this one was
            # blocked with it in a collective) it is a consequence: info, said so.
            after = _failed_first(r, outcomes, exits)
            findings.append(event_finding(
                failures.STUCK_AT_EXIT, f"rank {r}: the script ended with status {o.get('exit_code')}, "
                f"but the process did not exit and was ended ({_signal_name(code)})"
                + (f", after rank {after} failed (a consequence)" if after is not None else ""),
                rank=r, phase="teardown", severity="info" if after is not None else None,
                evidence={"exit_status": code, **({"consequence": True, "after_rank": after}
                                                   if after is not None else {})}))
        elif o is None and code == -signal.SIGTERM and _others_failed(r, outcomes, exits):
            # the launcher stops the survivors once a rank has failed: a consequence, said so
            findings.append(event_finding(
                failures.PEER_FAILED, f"rank {r} was stopped by the launcher (SIGTERM) after another "
                f"rank failed", rank=r, evidence={"exit_status": code, "consequence": True},
                phase="training"))
        elif o is None and -code in NATIVE_SIGNALS:
            dump, when = crashes.get(r, ("", None))
            findings.append(native_crash_finding(r, code, dump, when))
        elif o is None and code < 0:
            findings.append(event_finding(
                failures.RANK_KILLED, f"rank {r} was ended by {_signal_name(code)} without a Python "
                f"error", rank=r, evidence={"exit_status": code}, phase="training"))
        elif o is None:
            # 128+N is how a shell or mpirun reports death by signal N: a native crash keeps its own
            # hint (DDP803's is about the OOM killer's SIGKILL)
            native = NATIVE_HINTS.get(code - 128) if code > 128 else None
            findings.append(event_finding(
                failures.RANK_KILLED, f"rank {r} exited with status {code} before its script ended "
                f"(no Python error was recorded: os._exit() or a crash in native code"
                + (f"; {code} is 128 + {_signal_name(128 - code)})" if native else ")"), rank=r,
                hint=native, evidence={"exit_status": code}, phase="training"))
    code = 0
    # Ranks the launcher stopped because another rank failed are consequences: the job's status is
    # the failing rank's, whichever rank number the launcher happened to stop first.
    stopped = {r for r in ranks if outcomes.get(r) is None and exits.get(r) == -signal.SIGTERM
               and _others_failed(r, outcomes, exits)}
    ranks = [r for r in ranks if r not in stopped] + sorted(stopped)
    killed = [exits[r] for r in ranks if outcomes.get(r) is None and (exits.get(r) or 0) < 0]
    if first_rank is not None and not causes and killed:
        code = 128 - killed[0]  # only lost-peer symptoms raised: the killed rank is the cause
    elif first_rank is not None:
        code = int(outcomes[first_rank].get("exit_code") or 1)
    else:
        for r in ranks:
            o = outcomes.get(r)
            if o is not None and o.get("exit_code"):
                code = int(o["exit_code"])  # a script's own sys.exit(N)
                break
            c = exits.get(r)
            if o is None and c:
                code = 128 - c if c < 0 else c
                break
    return findings, code


def _failed_first(rank: int, outcomes: dict[int, dict[str, Any]], exits: dict[int, int]) -> int | None:
    """Another rank that failed on its own (raised, or died before its script ended), or None."""
    raised = sorted((o["exception"].get("time", o.get("time", 0)), r) for r, o in outcomes.items()
                    if r != rank and o.get("exception"))
    if raised:
        return raised[0][1]
    died = [r for r, c in exits.items() if r != rank and outcomes.get(r) is None and c not in (0, -signal.SIGTERM)]
    return min(died) if died else None


def _others_failed(rank: int, outcomes: dict[int, dict[str, Any]], exits: dict[int, int]) -> bool:
    if any(o.get("exception") for r, o in outcomes.items() if r != rank):
        return True
    return any(c not in (0, -signal.SIGTERM) for r, c in exits.items() if r != rank)


def _whereabouts(heartbeats: dict[int, dict[str, Any]]) -> tuple[dict[int, Any], set[int]]:
    where = {r: hb.get("where") or hb.get("innermost") for r, hb in heartbeats.items()}
    return where, {r for r, hb in heartbeats.items() if hb.get("in_collective")}


def interrupted_finding(interrupt: Any, heartbeats: dict[int, dict[str, Any]], stacks: dict[int, str]) -> Finding:
    """The job stopped by a signal (DDP808), with where each rank was when it came."""
    where, in_coll = _whereabouts(heartbeats)
    parts = "; ".join(f"rank {r}: {where[r]}" + (" (in a collective)" if r in in_coll else "")
                      + f", {int(heartbeats[r].get('steps') or 0)} steps" for r in sorted(where))
    message = f"stopped by {interrupt.describe()}" + (f". {parts}" if parts else " before any rank started its script")
    return event_finding(failures.INTERRUPTED, message, rank=None, ranks=sorted(heartbeats),
                         evidence={**interrupt.to_dict(), "where": {str(r): w for r, w in where.items()},
                                   "stacks": {str(r): s for r, s in stacks.items()}}, phase="training")


def hang_finding(heartbeats: dict[int, dict[str, Any]], stacks: dict[int, str], timeout: float) -> Finding:
    """Name the ranks that are not where the others are: outside a collective while others wait in
    one, or else the minority location."""
    where, in_coll = _whereabouts(heartbeats)
    split = False  # the ranks are in different places with no minority among them
    if in_coll and len(in_coll) < len(heartbeats):
        odd = sorted(set(heartbeats) - in_coll)
    else:
        groups: dict[Any, list[int]] = {}
        for r in sorted(where):
            groups.setdefault(where[r], []).append(r)
        fewest = min(map(len, groups.values()), default=0)
        smallest = [g for g in groups.values() if len(g) == fewest]
        # one minority location names its ranks; a tie (two ranks, two places) names no one
        odd = smallest[0] if len(groups) > 1 and len(smallest) == 1 else []
        split = len(groups) > 1 and not odd
    parts = "; ".join(f"rank {r}: {where[r]}" + (" (in a collective)" if r in in_coll else "")
                      for r in sorted(where))
    if odd:
        head = f"no progress for {timeout:g} s; rank(s) {', '.join(map(str, odd))} not where the others are"
    else:
        head = f"no progress on any rank for {timeout:g} s" + ("; the ranks are in different places" if split else "")
    return event_finding(failures.RANK_HUNG, f"{head}. {parts}", rank=None, ranks=odd or sorted(heartbeats),
                       evidence={"where": {str(r): w for r, w in where.items()},
                                 "stacks": {str(r): s for r, s in stacks.items()}},
                       phase="training")


# What a rank's own failure or the hang looks like; the ledger may show it was only waiting.
_SYMPTOMS_NOT = {failures.NATIVE_CRASH.id, failures.RANK_KILLED.id, failures.ABORT_AT_EXIT.id,
                 failures.STUCK_AT_EXIT.id}


def with_ledgers(findings: list[Finding], ledgers: dict[int, dict[str, Any]],
                 world_size: int | None = None) -> list[Finding]:
    """Add what the ranks' ledgers of collectives show (checks/collectives.py) and let it name the
    cause: an error raised on a rank the ledger shows waiting in (or failing in) the collective
    at fault, and the hang itself, become consequences of it. A ledger finding dates from the
    collective it is about, before any timeout it led to."""
    from ddp_doctor.checks.collectives import ledger_findings
    found = ledger_findings(ledgers, world_size=world_size)
    if not found:
        return findings
    waited: set[int] = set()
    for lf in found:
        per_rank = lf.evidence.get("ranks") or {}
        waited |= {int(r) for r, ev in per_rank.items() if isinstance(ev, dict) and ev.get("consequence")}
        created = [ev.get("entry", {}).get("time_created_ns") for ev in per_rank.values() if isinstance(ev, dict)]
        created = [c for c in created if isinstance(c, int) and c > 0]
        if created:
            lf.time = min(created) / 1e9
    cause = found[0].id
    dumps = {int(r): str(d["path"]) for r, d in ledgers.items()
             if isinstance(d, dict) and d.get("source") == "nccl_dump" and d.get("path")}
    if dumps:  # where NCCL's own dumps are (training/run/nccl_dumps.py)
        for lf in found:
            lf.evidence = {**lf.evidence, "nccl_dumps": {str(r): p for r, p in sorted(dumps.items())}}
    for f in findings:
        if f.phase != "training" or f.severity != "error":
            continue
        if f.id in _SYMPTOMS_NOT and not _watchdog_abort(f, waited):
            continue
        if f.id == failures.RANK_HUNG.id or (f.ranks and set(f.ranks) <= waited):
            f.evidence = {**f.evidence, "consequence": True, "explained_by": cause}
            if f.id == failures.NATIVE_CRASH.id and f.ranks and f.ranks[0] in dumps:
                f.evidence["nccl_dump"] = dumps[f.ranks[0]]
    return findings + found


def _watchdog_abort(f: Finding, waited: set[int]) -> bool:
    """A rank aborted (SIGABRT) while its ledger shows it waiting in the collective at fault:
    NCCL's watchdog ended it when that collective timed out, a consequence of the cause."""
    return (f.id == failures.NATIVE_CRASH.id and f.evidence.get("signal") == "SIGABRT"
            and bool(f.ranks) and set(f.ranks) <= waited)


def init_findings(calls: list[dict[str, Any]]) -> list[Finding]:
    """What the processes passed to init_process_group (checks/init_arguments.py), dated from the
    first call: the cause of whatever followed (a wait in init, a timeout)."""
    from ddp_doctor.checks.init_arguments import init_argument_findings
    found = init_argument_findings(calls)
    first = min((float(c.get("time") or 0) for c in calls), default=0.0)
    for f in found:
        if first:
            f.time = first
    return found


def slow_rank_finding(slow: dict[str, Any]) -> Finding:
    """Ranks that waited in a collective for a rank still at work, past the hang bound but not a
    hang (DDP809): who kept whom waiting, how long, and where the working rank was."""
    from ddp_doctor.findings import format_ranks
    working, waiting = list(slow.get("working") or []), list(slow.get("waiting") or [])
    where = slow.get("where") or {}
    at = "; ".join(f"rank {r} at {where.get(str(r))}" for r in working if where.get(str(r)))
    who = f"rank {working[0]}" if len(working) == 1 else f"ranks {format_ranks(working)}"
    them = f"rank {waiting[0]}" if len(waiting) == 1 else f"ranks {format_ranks(waiting)}"
    message = (f"{who} kept {them} waiting in a collective for {float(slow.get('waited') or 0):g} s"
               + (f" ({at})" if at else ""))
    return event_finding(failures.SLOW_RANK, message, rank=None, ranks=working, phase="training",
                         evidence={**slow, "waiting": waiting, "working": working})


def launcher_failed_finding(code: int) -> Finding:
    """torch's elastic launcher exited with an error before any rank started (a bad launcher
    option, a rendezvous it could not set up): never a "pass" with a non-zero exit."""
    from ddp_doctor.checks.internal import RANK_LOST
    return event_finding(RANK_LOST, f"the launcher (torch's elastic agent) exited with status {code} before "
                         f"any rank started its script; its own error is in the output above", rank=None,
                         hint="Read the launcher's error above: a launcher option it rejected (--nnodes, "
                              "--rdzv-*, --node-rank), or a rendezvous it could not set up (--master-addr/"
                              "--master-port unreachable or taken).",
                         evidence={"launcher_exit": code}, phase="training")
