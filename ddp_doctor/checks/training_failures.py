"""Catalogue entries for what `ddp-doctor run` observes about the training itself (DDP800-DDP819).
Known error signatures have their own entries in signatures.py (DDP820 on)."""
from __future__ import annotations

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding
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

RANK_HUNG = declare(
    "DDP801", category="training_failure", severity="error", title="Training made no progress",
    doc="""
    What: A rank made no progress (its Python stack did not move and no optimizer step ran) for
    --hang-timeout seconds. The finding names the rank(s) that are not where the others are and
    carries every rank's Python stack; then the job is ended.
    Why: One rank stuck outside a collective (a data-loading stall, a rank-dependent branch, a
    rank that skipped a collective) leaves every other rank blocked in the collective until the
    30-minute default timeout.
    Fix: Look at the odd rank's stack: make every rank call the same collectives in the same order
    (no rank-dependent early exit or extra all_reduce), and bound data loading.
    """)

PEER_FAILED = declare(
    "DDP802", category="training_failure", severity="error", title="A rank failed after a peer failed",
    doc="""
    What: This rank failed after another rank had already failed; its error is a consequence (for
    example gloo's "Connection closed by peer", a collective timeout, a store that went away), or
    its launcher stopped it (SIGTERM) once that rank had failed or vanished.
    Why: When one rank dies, its peers blocked in a collective with it fail too; their errors hide
    the real cause if read first.
    Fix: Fix the root-cause rank's error; this rank's failure should then disappear.
    """)

RANK_KILLED = declare(
    "DDP803", category="training_failure", severity="error", title="A rank ended without a Python error",
    doc="""
    What: A rank process ended without a Python exception: killed by a signal that no handler can
    see (SIGKILL, or SIGTERM from outside), or exited with a non-zero status through os._exit().
    A crash in native code (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) is DDP807, with its stack.
    Why: SIGKILL usually means the kernel's out-of-memory killer or a cancelled job.
    Fix: Check the host's memory (dmesg for "Out of memory: Killed process"; lower the batch size or
    the DataLoader's num_workers / prefetch_factor), and whether something outside ended the job.
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
    """)

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
    """)


INTERRUPTED = declare(
    "DDP808", category="training_failure", severity="error", title="The job was stopped by a signal",
    doc="""
    What: ddp-doctor's parent received SIGTERM, SIGINT or SIGHUP (a stopped SageMaker training job,
    a spot interruption, a cancelled CI job, Kubernetes ending the pod, Ctrl-C) and stopped the
    ranks. The finding names the signal, its sender when known, and where each rank was then; the
    report's status is "interrupted" and the exit status 128 + the signal number.
    Why: A stopped job is neither a pass nor a failure of the script: what matters is where the
    ranks were (a rank stuck in a collective is the reason many jobs get stopped by hand), which
    the ranks' stacks and ledgers taken before they were ended show.
    Fix: If the stop was expected (a planned stop, a spot reclaim), resume from the last
    checkpoint. If the job was stopped because it looked stuck, read where each rank was and the
    ledger findings next to this one: they name the collective the ranks disagreed on.
    """)


SLOW_RANK = declare(
    "DDP809", category="training_failure", severity="warning", title="Ranks waited long for a slow rank",
    doc="""
    What: During training, some ranks waited in a collective past the hang bound while another
    rank was still working (its stack moving): one rank saving a checkpoint, evaluating or loading
    data while the others waited at a barrier or in the next step's all_reduce. The job went on,
    so it was not a hang; the finding names who waited, how long, and where the working rank was.
    Why: Every rank pays for the slowest one at each collective: the waiting ranks' GPUs sit idle
    for that time, and a wait that grows past the collective timeout (30 minutes by default) kills
    the job.
    Fix: Make the slow work shorter or share it: save checkpoints asynchronously or from every rank
    (torch.distributed.checkpoint), evaluate on every rank over a shard, or raise the process
    group's timeout for that step if the wait is expected.
    """)


RECORDS_DEGRADED = declare(
    "DDP813", category="internal", severity="warning", title="ddp-doctor's records could not be kept where asked",
    doc="""
    What: The run directory where `ddp-doctor run` keeps its records (heartbeats, endings, ledgers,
    stacks: `$TMPDIR/ddp-doctor-run-*`, `DDP_DOCTOR_RUN_DIR`, `--run-dir`) could not be made or has
    no room (its file system is full: less than 8 MiB or 256 inodes free, read-only, permission
    denied). The records went to another place (/dev/shm, /var/tmp), named in the message; when no
    place could take them, ddp-doctor's records of the run are incomplete.
    Why: A record that cannot be written reads as a rank that never reported; ddp-doctor moves
    them rather than let its own storage change the job's verdict or exit status, which stay the
    job's own.
    Fix: Free space in (or point TMPDIR / DDP_DOCTOR_RUN_DIR / --run-dir at) a writable directory
    with room; `df -h $TMPDIR` and `df -i $TMPDIR` show what is left.
    """)


def records_moved_finding(note: str, rank: int | None, run_dir: str) -> Finding:
    """DDP813: the records went to `run_dir` rather than where asked; `note` says why (run_dir.py)."""
    return event_finding(RECORDS_DEGRADED, note, rank=rank, evidence={"run_dir": run_dir})
