"""How each rank's job ended, judged (DDP800-DDP807 and the signatures): its exception (the real
error inside a wrapper, a known signature, a symptom of a lost peer), a native crash, a kill, a
process that would not exit; and the job's exit code. Pure functions over what the ranks left (outcome
records, the launcher's exit statuses, faulthandler's dumps).

Root cause = the first rank that failed. Ranks that failed later with another error, or with an
error that is a known symptom of a lost peer, are labelled as peers that failed after it (DDP802).
"""
from __future__ import annotations

import re
import signal
from dataclasses import replace
from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.checks.signatures import Signature, classify
from ddp_doctor.checks.teardown import exit_holders
from ddp_doctor.checks.wrapped_errors import RealError, real_error, user_frame
from ddp_doctor.facts.frames import dumped_threads, is_library_file, not_user_code_dirs, thread_in_collective
from ddp_doctor.findings import ROOT_CAUSE, Finding, brief_ranks
from ddp_doctor.registry import declare

RANK_RAISED = declare(
    "DDP800", category="training_failure", severity="error", title="A rank raised an exception",
    doc="""
    What: The training script raised an exception on this rank that matches no known signature;
    the finding carries the exception and its traceback. An error that reached the script wrapped
    in another (a DataLoader worker's "Caught ValueError in DataLoader worker process 0", a
    torch.multiprocessing.spawn child's, a chained cause, a torchelastic child's) is shown as the
    innermost error, with the line of your code that raised it; the wrapper stays in the evidence
    (wrapped_by).
    Why: The first rank to fail is the root cause; the other ranks usually fail or time out after
    it, waiting in a collective for the rank that is gone.
    Fix: Read the traceback of the rank named as root cause (the others are labelled as peers that
    failed after it) and fix that error first.
    """)


SAME_ON_ALL_HINT = ("Each rank named raised this error itself, none after another's failure: fix it once, in the "
                    "code they all ran (the traceback above is the first rank's).")


PEER_FAILED = declare(
    "DDP802", category="training_failure", severity="error", title="A rank failed after a peer failed",
    doc="""
    What: This rank failed after another rank had already failed; its error is a consequence (for
    example gloo's "Connection closed by peer", a collective timeout, a store that went away), or
    its launcher stopped it (SIGTERM) once that rank had failed or vanished.
    Why: When one rank dies, its peers blocked in a collective with it fail too; their errors hide
    the real cause if read first.
    Fix: Fix the root-cause rank's error; this rank's failure should then disappear.
    """, cause_class="unknown")


RANK_KILLED = declare(
    "DDP803", category="training_failure", severity="error", title="A rank ended without a Python error",
    doc="""
    What: A rank process ended without a Python exception: killed by a signal that no handler can
    see (SIGKILL, or SIGTERM from outside), or exited with a non-zero status through os._exit().
    A crash in native code (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) is DDP807, with its stack.
    Why: SIGKILL usually means the kernel's out-of-memory killer or a cancelled job.
    Fix: Check the host's memory (dmesg for "Out of memory: Killed process"; lower the batch size or
    the DataLoader's num_workers / prefetch_factor), and whether something outside ended the job.
    """, cause_class="unknown")


EARLY_OS_EXIT = declare(
    "DDP812", category="training_failure", severity="error",
    title="A rank's script ended its process while the others still ran",
    doc="""
    What: The script of the rank named called os._exit() (exit status 0 included) while the job's
    other ranks still ran, and they then failed after it (a peer error such as "Connection reset by
    peer", a collective timeout). The finding names the line that called it, the status and where
    the rank was. Seen by the probes as the call is made (the process then ends with no exception
    and no exit handler, so nothing else records it). os._exit() on every rank once the job's work
    is done, with no rank failing after it, is not judged.
    Why: os._exit ends the process at once: no exception, no destroy_process_group, no record; the
    rank's collectives go with it, the launcher counts a status 0 as a rank that finished, and the
    errors of the ranks left behind are all that is printed.
    Fix: Let every rank leave the training loop at the same step (decide together: all_reduce a stop
    flag, then break on every rank), then destroy_process_group() and return; keep os._exit() for
    after the whole job's work, on every rank.
    """)


SCRIPT_EXITED = declare(
    "DDP814", category="training_failure", severity="error", title="A rank's script exited with a failure status",
    doc="""
    What: The script of the rank named ended itself with a non-zero status, `sys.exit(N)` (or
    `exit(N)`, `raise SystemExit(N)`, a library that calls it) without an exception, while the
    job's other ranks had not ended (they then fail or wait in a collective it never issued:
    consequences). The finding names the line that called it and the status; the job exits with
    that status, as the script asked.
    Why: A rank that leaves on its own (a check that fails on one rank's data or configuration, a
    script's `if loss is nan: sys.exit(1)`, an argument parser that rejects a rank's arguments)
    takes its collectives with it: the others block until the collective timeout or fail with
    "Connection closed by peer", and their errors hide the one that matters.
    Fix: Go to the line named: make the condition the same on every rank (all_reduce a flag and
    exit together), or raise an exception with a message instead, so the report quotes it.
    """)


ABORT_AT_EXIT = declare(
    "DDP804", category="teardown", severity="info", title="Abort at interpreter exit after the script ended",
    doc="""
    What: The script finished (its exit status was recorded) and the process then aborted while the
    interpreter shut down (SIGABRT, "terminate called without an active exception").
    Why: torch 2.13 on gloo sometimes aborts in static destructors after a correct
    destroy_process_group. It happens after your code ran; it is not a bug in your script.
    Fix: Nothing to fix in the script. ddp-doctor reports the script's own exit status; call
    dist.destroy_process_group() at the end of training and upgrade torch when a fix is released.
    """, cause_class="unknown")


SPAWN_CHILD_FAILED = declare(
    "DDP805", category="training_failure", severity="error", title="A spawned process failed",
    doc="""
    What: A process started by torch.multiprocessing.spawn failed; torch re-raised its error in
    the parent. The finding names the process index (usually the rank) and its traceback.
    Why: spawn-based scripts run their ranks as children of one process; the parent's traceback
    only says a child failed.
    Fix: Read the child's traceback in the finding, and fix the error of the first failing process.
    """)


STUCK_AT_EXIT = declare(
    "DDP806", category="teardown", severity="error", title="Process did not exit after the script ended",
    severities=("error", "warning", "info"),
    doc="""
    What: The script ended (its exit status was recorded) but the process was still alive past the
    teardown bound (60 s); ddp-doctor ended it. The finding names what kept it alive, from what the
    process held, never from the script's text: each thread alive and not a daemon (its name, where
    it is blocked: its innermost frame and the script's line, and the line that started it) and
    each child process still running (pid, command line with secrets redacted, the line that
    started it). The training's exit status stays the script's (3 with --fail-on error).
    Why: Python's exit waits for every non-daemon thread (a metrics uploader blocked on
    queue.get(), a thread waiting on an Event nobody sets) and joins multiprocessing's non-daemon
    children, so a finished rank never exits: under torchrun the job never completes, and on
    SageMaker it is billed until its max_run. A process group never destroyed or torch 2.13's gloo
    teardown can hang the exit too.
    Fix: Stop and join what the script starts (put a sentinel on the queue, set the Event, then
    thread.join(); close() and join() a Pool; wait() for a child), or make background threads
    daemons; call dist.destroy_process_group() at the end of training.
    Severity: error when the process held a thread or a child process the script started (the
    finding names it); warning when it held none (interpreter or torch teardown: not the script's
    doing, nothing named); info when another rank had failed first (raised, or died before its
    script ended): this rank was then blocked with it in a collective or its teardown, a
    consequence of that failure, not a problem of its own.
    """)


NATIVE_CRASH = declare(
    "DDP807", category="training_failure", severity="error", title="A rank crashed in native code",
    doc="""
    What: A rank died of a fatal signal raised in native code (SIGSEGV, SIGBUS, SIGILL, SIGFPE, or
    SIGABRT while its script was running). faulthandler wrote the Python stack of the crashing
    thread to the run directory; the finding names the Python line that called into native code.
    Why: There is no Python traceback for these: the process is gone, its peers then fail with
    "Connection closed by peer" or time out, and those symptoms are what a log shows first.
    Fix: Start from the line named. SIGSEGV: an extension or library built for another torch or
    CUDA version, or memory used after it was freed; SIGBUS: /dev/shm too small for DataLoader
    workers (docker --shm-size) or a memory-mapped file that shrank; SIGILL: a wheel built for a
    newer CPU or GPU; SIGABRT: an uncaught C++ exception or NCCL's watchdog ending a timed-out
    collective (the stderr lines just before the crash say which).
    """, cause_class="unknown")

MESSAGE_LIMIT = 600
# Fatal signals raised in native code: faulthandler dumps the Python stack for each of them.
NATIVE_SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGBUS: "bus error",
                  signal.SIGILL: "illegal instruction", signal.SIGFPE: "floating-point exception",
                  signal.SIGABRT: "abort"}
NATIVE_HINTS: dict[int, str] = {  # by signal number: signal.Signals is an int
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
                    "collective; the rank's last stderr lines before the crash say which. If they show "
                    "the script had finished (its last step, its save, destroy_process_group), this is the "
                    "abort some torch builds' gloo make at interpreter exit: the work was done, but the "
                    "exit status says failed; ending the script with os._exit(0) after its teardown "
                    "(output flushed) avoids it.",
}


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


def real_error_of(exc: dict[str, Any]) -> RealError | None:
    """The real error inside a rank's wrapped exception (a DataLoader worker's, a spawned process's,
    a chained cause, a torchelastic child's), or None when it wraps nothing."""
    return real_error(str(exc.get("type") or ""), str(exc.get("message") or ""), str(exc.get("traceback") or ""),
                      library_dirs=not_user_code_dirs())


def signature_of(exc: dict[str, Any], real: RealError | None = None) -> Signature | None:
    """The known signature of a rank's exception. A wrapped one is judged by its real error; the
    wrapper's own text counts too, unless what it matches is a symptom of a lost peer (a cleanup
    collective that failed while the real error was handled is not what made the rank fail)."""
    whole = classify(failure_text(exc))
    if real is None:
        return whole
    return classify(real.text()) or (whole if whole is not None and not whole.consequence else None)


def _own_numbers(rank: int, local_rank: Any = None) -> set[str]:
    own = {str(rank)}
    if isinstance(local_rank, int) or (isinstance(local_rank, str) and local_rank.isdigit()):
        own.add(str(int(local_rank)))
    return own


_NUMBERS = re.compile(r"(\d+(?:\.\d+)*)")  # a decimal (0.5) is one piece: never a rank's own number


def same_error_modulo_rank(a: dict[str, Any], rank_a: int, b: dict[str, Any], rank_b: int, *,
                           local_a: Any = None, local_b: Any = None) -> bool:
    """Two ranks' exceptions are the same error raised on each on its own: the same type, and
    messages equal but for numbers that are each rank's own, its rank or local rank ("device_ids
    [0]" / "[1]", "rank 0" / "rank 1", "cuda:0" / "cuda:1"). A wrapped exception is compared by
    its real error."""
    def key(exc: dict[str, Any]) -> tuple[str, str]:
        real = real_error_of(exc)
        if real is not None:
            return real.type, real.message
        return str(exc.get("type") or ""), str(exc.get("message") or "")

    (type_a, msg_a), (type_b, msg_b) = key(a), key(b)
    if type_a != type_b:
        return False
    pa, pb = _NUMBERS.split(msg_a), _NUMBERS.split(msg_b)
    if len(pa) != len(pb):
        return False
    own_a, own_b = _own_numbers(rank_a, local_a), _own_numbers(rank_b, local_b)
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x == y:
            continue
        if i % 2 == 0 or not (x in own_a and y in own_b):  # text differs, or a number not the ranks' own
            return False
    return True


def _error_line(exc: dict[str, Any]) -> str:
    """"Type: message" of a rank's exception, of its real error when it is wrapped."""
    real = real_error_of(exc)
    return real.summary if real is not None else f"{exc.get('type')}: {exc.get('message')}"


def exception_finding(rank: int, exc: dict[str, Any], *, consequence_of: int | None = None,
                      same_on: dict[int, dict[str, Any]] | None = None, time: float | None = None) -> Finding:
    """One rank's exception as a finding: a known signature, a spawn child, or DDP800. A wrapped
    exception is shown by its real error: type, message and the user's line that raised it, the
    wrapper kept in the evidence. `same_on`: other ranks that raised the same error but for their
    own rank numbers (one finding lists them all)."""
    real = real_error_of(exc)
    sig = signature_of(exc, real)
    summary = _short(f"{exc.get('type')}: {exc.get('message')}")
    evidence: dict[str, Any] = {"exception": exc.get("type"), "traceback": exc.get("traceback", "")}
    where = ""
    child: int | None = None
    if real is not None:
        summary = _short(real.summary)
        evidence.update(exception=real.type, wrapped_by=real.wrapped_by,
                        wrapping=[w.to_dict() for w in real.wrappers],
                        raised_at=str(real.raised_at) if real.raised_at else None)
        child = real.spawn_process()
        worker = real.ray_rank()  # Ray Train's driver error names the worker's world rank: that rank raised it
        if worker is not None:
            rank, same_on = worker, None
            evidence["ray_worker_rank"] = worker
        around = real.describe_wrapping(skip=("spawn",))  # a spawned process is named as such
        where = (f" at {real.raised_at}" if real.raised_at else "") + (f" ({around})" if around else "")
    else:
        # torch.multiprocessing.spawn's ProcessExitedException: a child ended without a Python error
        exited = re.search(r"process (\d+) terminated with (exit code|signal)", str(exc.get("message", "")), re.I)
        frame = user_frame(str(exc.get("traceback") or ""), not_user_code_dirs())
        if frame is not None:  # the user's line that raised it: the verdict shows it under the message
            evidence["raised_at"] = str(frame)
        if exited:
            child = int(exited.group(1))
            lines = [ln for ln in str(exc.get("message", "")).strip().splitlines() if ln.strip()]
            summary = _short(lines[-1] if lines else summary)
    if child is not None:
        evidence["spawn_process"] = child
        rank, same_on = child, None  # a spawned process is named alone
    if consequence_of is not None or (sig is not None and sig.consequence):
        evidence["signature"] = sig.entry.id if sig else None
        first = f"after rank {consequence_of} failed" if consequence_of is not None else "after a peer failed"
        return event_finding(PEER_FAILED, f"rank {rank} failed {first}: {summary}{where}", rank=rank,
                             evidence=evidence, phase="training", time=time, caused_by=ROOT_CAUSE)
    ranks = [rank]
    who = f"spawned process {rank}" if child is not None else f"rank {rank}"
    tail = ""
    if same_on:
        ranks = sorted({rank, *same_on})
        who = f"ranks {brief_ranks(ranks)} each"
        tail = f" (as rank {rank} wrote it; the other ranks' texts differ only by their own rank numbers)"
        evidence["per_rank"] = {str(r): {"error": _short(_error_line(e), 300)}
                                for r, e in sorted({rank: exc, **same_on}.items())}
    if sig is not None:
        return event_finding(sig.entry, f"{who} raised {summary}{where}{tail}", rank=rank, ranks=ranks,
                             evidence=evidence, phase="training", time=time)
    if child is not None:
        return event_finding(SPAWN_CHILD_FAILED, f"{who} (torch.multiprocessing.spawn) failed: "
                             f"{summary}{where}", rank=rank, evidence=evidence, phase="training", time=time)
    return event_finding(RANK_RAISED, f"{who} raised {summary}{where}{tail}", rank=rank, ranks=ranks,
                         evidence=evidence, phase="training", time=time, hint=SAME_ON_ALL_HINT if same_on else None)


def crashing_frames(dump: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the thread that took the fatal signal, innermost first, from
    faulthandler's text. A signal raised on a thread of a library's own (gloo's abort on a
    collective mismatch) leaves no Python thread "current": then the thread inside a collective,
    else the last one listed with a frame of the user's code (faulthandler lists the main thread,
    the oldest, last)."""
    threads = dumped_threads(dump)
    current = next((t for t in threads if t.current), None)
    if current is not None:
        return list(current.frames)
    found = thread_in_collective(dump)
    if found is not None:
        return list(found[0].frames)
    users = [t for t in threads if any(not is_library_file(f[0]) for f in t.frames)]
    return list(users[-1].frames) if users else []


def native_crash_finding(rank: int, code: int, dump: str, when: float | None = None) -> Finding:
    """A rank killed by a fatal signal in native code, with the Python line that called into it."""
    sig = signal.Signals(-code)
    frames = crashing_frames(dump)
    user = next((f for f in frames if not is_library_file(f[0])), frames[0] if frames else None)
    where = f" at {user[0]}:{user[1]} in {user[2]}" if user else " (no Python frame was recorded)"
    inside = thread_in_collective(dump)
    if inside is not None and user is not None and user in inside[0].frames:
        where += (" (in a DDP model's backward: its gradient all_reduce)" if inside[1] == "backward"
                  else f" (inside torch.distributed.{inside[1]})")
    stack = "\n".join(f"  {f}:{ln} in {fn}" for f, ln, fn in frames)
    return event_finding(
        NATIVE_CRASH, f"rank {rank} crashed with {sig.name} ({NATIVE_SIGNALS[sig]}) in native "
        f"code{where}", rank=rank, hint=NATIVE_HINTS[sig], phase="training", time=when,
        evidence={"exit_status": code, "signal": sig.name, "python_stack": stack, "faulthandler": dump[-4000:]})


def training_findings(outcomes: dict[int, dict[str, Any]], exits: dict[int, int], ranks: list[int],
                      crashes: dict[int, tuple[str, float]] | None = None,
                      unlogged: set[int] | frozenset[int] = frozenset()) -> tuple[list[Finding], int]:
    """Findings and the job's exit code (the root-cause rank's own code; 0 when all ended well).

    `outcomes`: rank -> record written by the rank when the script ended; `exits`: rank -> exit
    status the launcher saw (negative: killed by that signal), for ranks that did not end with 0;
    `crashes`: rank -> (faulthandler's dump, its time) for ranks that took a fatal signal;
    `unlogged`: ranks whose output the evidence lacks (their error, if any, is unknown)."""
    crashes = crashes or {}
    failed = [r for _, r in sorted(((o["exception"].get("time", o["time"]), r) for r, o in outcomes.items()
                                    if o.get("exception")), key=lambda x: x[0])]
    sig_of = {r: signature_of(outcomes[r]["exception"], real_error_of(outcomes[r]["exception"])) for r in failed}
    # The root cause is the first rank whose error is not itself a symptom of a lost peer.
    causes = [r for r in failed if not ((sig := sig_of[r]) is not None and sig.consequence)]
    first_rank = causes[0] if causes else (failed[0] if failed else None)
    findings = _exception_findings(outcomes, failed, sig_of, first_rank, first_rank in causes)
    findings += _exited_findings(outcomes, exits)
    for r in ranks:
        code = exits.get(r)
        f = _exit_status_finding(r, code, outcomes, exits, crashes, unlogged) if code else None
        if f is not None:
            findings.append(f)
    return findings, _job_exit_code(outcomes, exits, ranks, first_rank, bool(causes))


def _alike_ranks(outcomes: dict[int, dict[str, Any]], failed: list[int],
                 first_rank: int) -> dict[int, dict[str, Any]]:
    """rank -> exception, for the ranks whose error is the first rank's but for their own rank numbers:
    they raised it on their own too, so one finding lists them with the first rank (the report merges
    only equal texts). Empty when all their texts are equal to the first rank's."""
    first = outcomes[first_rank]
    first_key = (first["exception"].get("type"), first["exception"].get("message"))
    alike = {r: outcomes[r]["exception"] for r in failed if r != first_rank and same_error_modulo_rank(
        first["exception"], first_rank, outcomes[r]["exception"], r,
        local_a=first.get("local_rank"), local_b=outcomes[r].get("local_rank"))}
    if all((e.get("type"), e.get("message")) == first_key for e in alike.values()):
        return {}  # equal texts: one finding per rank, merged by the report as "ranks 0-1 raised"
    return alike


def _exception_findings(outcomes: dict[int, dict[str, Any]], failed: list[int],
                        sig_of: dict[int, Signature | None], first_rank: int | None,
                        first_is_cause: bool) -> list[Finding]:
    """One finding per rank that raised, in the order they failed: the first rank's as the root
    cause (listing the ranks that raised its error on their own too), a later rank's as a peer that
    failed after it unless it raised the same error itself."""
    first_key = None
    if first_rank is not None:
        e = outcomes[first_rank]["exception"]
        first_key = (e.get("type"), e.get("message"))
    alike = _alike_ranks(outcomes, failed, first_rank) if first_rank is not None and first_is_cause else {}
    findings: list[Finding] = []
    grouped: set[int] = set()  # listed in the first rank's finding (a spawned child's is not grouped)
    # the first rank's very text raised by others too: each its own error (merged as "ranks 0-1 raised")
    equal = first_is_cause and sum((outcomes[r]["exception"].get("type"), outcomes[r]["exception"].get("message"))
                                   == first_key for r in failed) > 1
    for r in failed:  # the alike ranks failed after the first one (else one of them would be first)
        if r in grouped:
            continue
        e = outcomes[r]["exception"]
        same = (e.get("type"), e.get("message")) == first_key or r in alike or (  # or raised on its own too:
            sig_of[r] is not None and first_rank is not None and sig_of[r] is sig_of.get(first_rank))
        peer = first_rank if (r != first_rank and not same) else None
        f = exception_finding(r, e, consequence_of=peer, same_on=(alike or None) if r == first_rank else None,
                              time=e.get("time"))
        if r == first_rank:
            grouped = set(alike) if f.ranks == sorted({r, *alike}) else set()
        if equal and f.id == RANK_RAISED.id and (e.get("type"), e.get("message")) == first_key:
            f = replace(f, hint=SAME_ON_ALL_HINT)
        findings.append(f)
    return findings


def _exit_status_finding(r: int, code: int, outcomes: dict[int, dict[str, Any]], exits: dict[int, int],
                         crashes: dict[int, tuple[str, float]],
                         unlogged: set[int] | frozenset[int]) -> Finding | None:
    """The finding for rank `r`'s non-zero exit status `code`, read with what the rank recorded: an
    abort or a stuck exit after the script ended, a stop by the launcher after a peer failed, a native
    crash, a kill, or an exit with no Python error (the status alone says which). None for a rank
    whose script ended and whose status says nothing more (its ending has its own finding)."""
    o = outcomes.get(r)
    if o is not None and o.get("exit_code") == 0 and code == -signal.SIGABRT:
        return event_finding(
            ABORT_AT_EXIT, f"rank {r}: the script ended with status 0, then the process "
            f"aborted (SIGABRT) during interpreter shutdown", rank=r, phase="teardown")
    if o is not None and code in (-signal.SIGKILL, -signal.SIGTERM):
        return _stuck_at_exit_finding(r, code, o, outcomes, exits)
    if o is None and code == -signal.SIGTERM and _others_failed(r, outcomes, exits):
        # the launcher stops the survivors once a rank has failed: a consequence, said so
        return event_finding(
            PEER_FAILED, f"rank {r} was stopped by the launcher (SIGTERM) after another "
            f"rank failed", rank=r, evidence={"exit_status": code}, phase="training", caused_by=ROOT_CAUSE)
    if o is None and -code in NATIVE_SIGNALS:
        dump, when = crashes.get(r, ("", None))
        return native_crash_finding(r, code, dump, when)
    if o is None and code < 0:
        return event_finding(
            RANK_KILLED, f"rank {r} was ended by {_signal_name(code)} without a Python "
            f"error", rank=r, evidence={"exit_status": code}, phase="training")
    if o is None and r in unlogged:
        return event_finding(
            RANK_KILLED, f"rank {r} exited with status {code}; its output is not among the "
            f"evidence, so whether it raised, and what, is unknown", rank=r,
            hint="Add this rank's output (its log file, its host's stream) and analyze again: its "
                 "error is the likely cause.", evidence={"exit_status": code, "output": "missing"},
            phase="training")
    if o is not None:
        return None
    # 128+N is how a shell or mpirun reports death by signal N: a native crash keeps its own
    # hint (DDP803's is about the OOM killer's SIGKILL)
    sig = code - 128 if 128 < code < 128 + signal.NSIG else None
    native = NATIVE_HINTS.get(sig) if sig else None
    said = (f"rank {r} exited with status {code} ({code} is 128 + {_signal_name(-sig)}: how a shell "
            f"or mpirun reports a process ended by that signal), with no Python error" if sig else
            f"rank {r} exited with status {code} before its script ended (no Python error was "
            f"recorded: os._exit() or a crash in native code)")
    return event_finding(RANK_KILLED, said, rank=r, hint=native,
                         evidence={"exit_status": code}, phase="training")


def _stuck_at_exit_finding(r: int, code: int, o: dict[str, Any], outcomes: dict[int, dict[str, Any]],
                           exits: dict[int, int]) -> Finding:
    """DDP806 for a rank whose script ended but whose process was ended by a signal: SIGKILL, ddp-doctor
    ended it past the teardown bound; SIGTERM, the launcher did, once a peer stuck the same way was
    ended first. After another rank failed (this one was blocked with it in a collective) it is a
    consequence: info, said so; else what held the process decides error or warning."""
    # a rank that raised an error of its own (not a lost peer's symptom) is judged by that error,
    # never as a consequence of another rank's: the teardown its script skipped held it (info)
    raised = bool(o.get("exception")) and not _lost_peer_error(o)
    after = None if raised else _failed_first(r, outcomes, exits)
    # what the process held past the bound (non-daemon threads, children): the script's, an error
    held = exit_holders(o.get("held_by"))
    return event_finding(
        STUCK_AT_EXIT, f"rank {r}: the script ended with status {o.get('exit_code')}, "
        f"but the process did not exit and was ended ({_signal_name(code)})"
        + (f"; what kept it alive: {held}" if held else "")
        + (f", after rank {after} failed (a consequence)" if after is not None else "")
        + (", after its own error above (the teardown the script would have run never did)"
           if raised and not held else ""),
        rank=r, phase="teardown",
        severity="info" if after is not None or (raised and not held) else "error" if held else "warning",
        hint=None if after is not None or (raised and not held) else (
            "Stop and join what the script starts before it ends (a sentinel on the queue or the "
            "Event set, then thread.join(); Pool.close() and join(); Popen.wait()), or make "
            "background threads daemons: Python's exit waits for them, so the rank never exits."
        ) if held else (
            "No thread or child process of the script was seen holding it (the interpreter's or "
            "torch's own teardown): call dist.destroy_process_group() at the end of training; if it "
            "persists, end the script with os._exit(status) after flushing its output."),
        caused_by=ROOT_CAUSE if after is not None else None,
        evidence={"exit_status": code, **({"after_rank": after} if after is not None else {}),
                  **({"held_by": o["held_by"]} if held else {})})


def _job_exit_code(outcomes: dict[int, dict[str, Any]], exits: dict[int, int], ranks: list[int],
                   first_rank: int | None, has_cause: bool) -> int:
    """The job's exit status: the root-cause rank's own code; when only lost-peer symptoms were raised,
    that of the rank that left (sys.exit(N)) or died; with no rank raising, the first non-zero ending;
    0 when all ended well."""
    # Ranks the launcher stopped because another rank failed are consequences: the job's status is
    # the failing rank's, whichever rank number the launcher happened to stop first.
    stopped = {r for r in ranks if outcomes.get(r) is None and exits.get(r) == -signal.SIGTERM
               and _others_failed(r, outcomes, exits)}
    ranks = [r for r in ranks if r not in stopped] + sorted(stopped)
    # ranks that died without an ending (killed by a signal, or os._exit(N) / a native crash with
    # status N): when the only errors raised are lost-peer symptoms, such a rank is the cause and
    # the job's status is its own, whichever ending came first in time (the peer's "Connection
    # closed by peer" may be recorded before the launcher saw the rank die)
    died = [exits[r] for r in ranks if outcomes.get(r) is None and exits.get(r)]
    # a script that ended itself with sys.exit(N) while its peers waited: only lost-peer symptoms
    # were raised, and the rank that left has the job's status, N
    exited = [int(o["exit_code"]) for r in ranks if (o := outcomes.get(r)) is not None and o.get("exit_code")
              and not o.get("exception") and not o.get("interrupted")]
    if first_rank is not None and not has_cause and exited:
        return exited[0]
    if first_rank is not None and not has_cause and died:
        return 128 - died[0] if died[0] < 0 else died[0]  # only lost-peer symptoms raised: the dead rank's
    if first_rank is not None:
        return int(outcomes[first_rank].get("exit_code") or 1)
    for r in ranks:
        o = outcomes.get(r)
        if o is not None and o.get("exit_code"):
            return int(o["exit_code"])  # a script's own sys.exit(N)
        c = exits.get(r)
        if o is None and c:
            return 128 - c if c < 0 else c
    return 0


def _ended_itself(o: dict[str, Any] | None) -> bool:
    """Whether a rank's script ended itself with sys.exit(N != 0): no exception, no stop, no hang."""
    return bool(o and o.get("exit_code") and not (o.get("exception") or o.get("interrupted") or o.get("hung"))
                and o.get("phase") in (None, "training"))


def _lost_peer_error(o: dict[str, Any]) -> bool:
    """Whether a rank raised a known symptom of a lost peer (a signature marked as a consequence)."""
    exc = o.get("exception")
    if not exc:
        return False
    sig = signature_of(exc, real_error_of(exc))
    return sig is not None and sig.consequence


def _exited_findings(outcomes: dict[int, dict[str, Any]], exits: dict[int, int]) -> list[Finding]:
    """DDP814 for each rank whose script ended itself with sys.exit(N != 0), without an exception
    or a stop: the cause, whose peers' lost-peer errors are consequences. With no other rank
    failing either, it is still the job's failure: the status the script asked for. Ranks that
    ended themselves alike are not each other's consequence."""
    out = []
    for r, o in sorted(outcomes.items()):
        if not _ended_itself(o):
            continue
        site = o.get("exited") or {}
        where = site.get("where")
        # other ranks whose ending is this one's consequence: a lost peer's error, or an end with no
        # record of its own (stopped by the launcher, killed); not a rank that raised or exited on its own
        failed_after = any(_lost_peer_error(o2) for r2, o2 in outcomes.items() if r2 != r) or any(
            c for r2, c in exits.items() if r2 != r and outcomes.get(r2) is None)
        others = " while the other ranks still ran (their errors below are its consequence)" if failed_after else ""
        n = int(o["exit_code"])
        if site.get("aborted_at_exit"):  # a log's reading: no Python error, then the teardown abort
            last = site.get("last_line")
            how = (f"rank {r}'s output ends with no Python error" + (f" (its last line: {str(last).strip()[:160]!r})"
                   if last and str(last).strip() else "") + ", then the process aborted as the interpreter exited "
                   f"(SIGABRT, 'terminate called without an active exception': torch's gloo teardown): the "
                   f"script had ended itself{others}; the status it asked for is lost to the abort")
        elif site.get("from_output"):  # a log's reading: the status, and no Python error in the output
            how = (f"rank {r} exited with status {n} and no Python error in the output: the script ended "
                   f"itself (sys.exit({n}), or os._exit({n})){others}")
        else:
            how = f"rank {r}'s script ended itself with status {n} (sys.exit({n}), no exception)" + (
                f" at {where}" if where else "") + others
        out.append(event_finding(
            SCRIPT_EXITED, how,
            rank=r, phase="training", time=site.get("time") or o.get("time"),
            evidence={"exit_code": n, "where": where,
                      **({"aborted_at_exit": True} if site.get("aborted_at_exit") else {}),
                      **({"last_line": site["last_line"]} if site.get("last_line") else {})}))
    return out


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


def stopped_after_failure_findings(outcomes: dict[int, dict[str, Any]], findings: list[Finding]) -> list[Finding]:
    """DDP802 for each rank that recorded a stop signal (its launcher's SIGTERM: under an outside
    launcher the rank itself notes it, no launcher of ours sees its exit) and no error of its own,
    when another rank failed or vanished (an error finding names it): the launcher stopped the
    survivors, a consequence. Before its own collective's lost-peer error, or after: a race."""
    failing = {r for f in findings if f.severity == "error" for r in f.ranks or ()}
    out = []
    for r, o in sorted(outcomes.items()):
        stop = o.get("interrupted")
        if not isinstance(stop, dict) or o.get("exception") or r in failing or not failing:
            continue  # not stopped, or judged by its own error; or nobody failed: the job's own stop
        others = sorted(failing)
        out.append(event_finding(
            PEER_FAILED, f"rank {r} was stopped by its launcher ({stop.get('signal') or 'a signal'}) after "
            f"rank{'s' if len(others) > 1 else ''} {brief_ranks(others)} failed", rank=r, phase="training",
            caused_by=ROOT_CAUSE,
            evidence={"signal": stop.get("signal"), "exit_status": o.get("exit_code"), "after_ranks": others}))
    return out


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


def vanished_finding(rank: int, heartbeat: dict[str, Any]) -> Finding:
    """A rank whose process is gone without an ending (no record of how its script ended, and no
    launcher of ours saw its exit status): SIGKILL (the OOM killer) or a crash it could not record.
    Dated from its last heartbeat: it died after that and before the next one was due."""
    where = heartbeat.get("where") or heartbeat.get("innermost")
    steps = heartbeat.get("steps")
    # where its last heartbeat saw it, a second or less before it vanished
    at = ((f" after {int(steps)} steps" if isinstance(steps, int) and steps else "")
          + (f" (last seen at {where})" if where else ""))
    return event_finding(
        RANK_KILLED, f"rank {rank} (pid {heartbeat.get('pid', '?')}) was killed without an ending{at}: "
        f"its process is gone and it recorded no exit (SIGKILL: the OOM killer?)", rank=rank, phase="training",
        time=float(heartbeat.get("time") or 0) or None,
        evidence={"pid": heartbeat.get("pid"), "last_heartbeat": heartbeat.get("time"), "where": where,
                  "vanished": True})


def early_os_exits(probes: dict[int, dict[str, Any]], outcomes: dict[int, dict[str, Any]],
                   findings: list[Finding]) -> list[Finding]:
    """DDP812 for each rank whose script called os._exit (its probe record's end says so) before
    another rank's error; those later errors become its consequences. `probes`: one probe record a
    rank (checks/probe_records.by_rank)."""
    out: list[Finding] = []
    for r, rec in sorted(probes.items()):
        ended = rec.get("ended") or {}
        at = ended.get("t")
        raised = (outcomes.get(r) or {}).get("exception")
        if ended.get("how") != "os_exit" or not isinstance(at, (int, float)) or raised:
            continue
        after = [f for f in findings if f.severity == "error" and f.phase == "training" and f.ranks
                 and r not in f.ranks and f.time >= at]
        if not after:
            continue  # os._exit once the job's work was done: nothing failed for it
        status = ended.get("status")
        site = f" at {ended['site']}" if ended.get("site") else ""
        steps = rec.get("steps")
        done = f" after {steps} optimizer step(s)" if isinstance(steps, int) and steps else ""
        others = sorted({x for f in after for x in f.ranks})
        message = (f"rank {r} ended its process with os._exit({status if status is not None else '?'}){site}"
                   f"{done} while {'rank' if len(others) == 1 else 'ranks'} {brief_ranks(others)} still ran, "
                   f"and failed after it")
        out.append(event_finding(EARLY_OS_EXIT, message, rank=r, phase="training", time=float(at),
                                 evidence={"status": status, "site": ended.get("site"), "steps": steps}))
        for f in after:
            if f.caused_by in (None, ROOT_CAUSE):
                f.caused_by = EARLY_OS_EXIT.id
    return out
