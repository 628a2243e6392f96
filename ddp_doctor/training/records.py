"""Per-rank records of a training run, written as files (never through a collective, so they
cannot deadlock the job): how the rank ended, its exception, its heartbeat and its stack.

Layout of a run directory: rank-N.json (outcome), hb-N.json (heartbeat), stack-N.txt (stacks
dumped on request), crash-N.txt (the Python stacks faulthandler wrote when a fatal signal hit the rank),
probe-PID.json (what the in-training probes of one process recorded; probe-remote-N.json, another
node's rank N's, copied at its ending), ledger-N.json (the rank's ledger of collectives, from
torch's flight recorder, written at the endings the rank lives through),
ledger-request (written by the parent on a hang, or by a failing rank: each live rank's watchdog
then writes its ledger), init-PID.json (what a process passed to init_process_group, written as it
called it), nccl-fr-rank-N (NCCL's flight recorder dump on a collective timeout, pickled by torch;
read by training/run/nccl_dumps.py). Under ddp-doctor's parent also: preflight/ (the launch
directory of the ranks' preflight, processes/launch_dir.py) and agent.json (the exit status of each
rank that failed, from the launcher, training/run/agent.py). Each file's name is said once, below.

One job, one run directory: under an outside launcher the directory is named after what the ranks
of one job on this node share and no other job does (training/run/run_dir.py, job_id), and each
outcome, heartbeat and ledger names the job that wrote it (`job`: a token every rank of the job
agreed through the preflight's store, join_job); the readers keep only this job's records.

Private: the run directory is made 0700 (report/private_files.py, make_private_dir) and every file
ddp-doctor writes in it 0600 (write_json, open_private); the records are redacted as reports are
(report/redact.py) before they are written, since they hold exception text and arguments.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import sys
import time
from typing import Any

from ddp_doctor.report.private_files import PREFLIGHT_SUBDIR, make_private_dir, open_private, write_private
from ddp_doctor.report.redact import redact_obj

__all__ = ["make_private_dir", "open_private"]  # run directories and the files faulthandler writes into


def write_json(path: str, data: dict[str, Any], *, redact: bool = True) -> None:
    """One record, atomically, readable by this user only (0600), redacted (exception text,
    arguments, probe notes can quote a secret). `redact=False` only for records without free text
    that are written often or are large (heartbeats, ledgers). A record that cannot be written
    never breaks the user's job: a full or read-only file system is said once on stderr."""
    try:
        text = json.dumps(redact_obj(data) if redact else data, default=str)
        write_private(path, text)  # two threads of a rank may write one record: own temp files
    except OSError as e:
        _record_lost(path, e)
    except (ValueError, RecursionError):
        pass


# What a full disk, a quota or a read-only mount answers; a missing directory is the run's end
# (its owner removed it) and says nothing.
_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
_lost_said = False


def _record_lost(path: str, e: OSError) -> None:
    global _lost_said
    if _lost_said or e.errno not in _STORAGE_ERRORS:
        return
    _lost_said = True
    try:
        sys.stderr.write(f"ddp-doctor: warning: could not write {path} ({e.strerror or e}): ddp-doctor's "
                         f"records of this run are incomplete; the job itself is not affected\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


# The files of a run directory, by name ({} is the rank, or the pid for probe and init records)
OUTCOME_FILE = "rank-{}.json"
HEARTBEAT_FILE = "hb-{}.json"
STACK_FILE = "stack-{}.txt"
CRASH_FILE = "crash-{}.txt"
CALL_NOTE_FILE = "call-{}.txt"  # the newest Python-level collective call, kept through a crash
PROBE_FILE = "probe-{}.json"  # its pattern also matches the remote ones: read_probes reads both
REMOTE_PROBE_FILE = "probe-remote-{}.json"
LEDGER_FILE = "ledger-{}.json"
LEDGER_REQUEST_FILE = "ledger-request"
INIT_CALL_FILE = "init-{}.json"
PREFLIGHT_RECORD_FILE = "preflight-{}.json"  # a rank's preflight report, kept for its final report
GONE_FILE = "gone-{}.json"  # another node's rank whose process ended without an ending
HANG_SHARED_FILE = "hang-shared-{}.json"  # a rank copied the other nodes' stacks at a hang
PREFLIGHT_DIR = PREFLIGHT_SUBDIR  # named where report/private_files.py makes it private
AGENT_RESULT_FILE = "agent.json"


def glob_pattern(run_dir: str, name: str) -> str:
    """The glob pattern of every file named `name` (one of the names above) in the run directory."""
    return os.path.join(run_dir, name.format("*"))


def outcome_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, OUTCOME_FILE.format(rank))


def heartbeat_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, HEARTBEAT_FILE.format(rank))


def stack_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, STACK_FILE.format(rank))


def crash_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, CRASH_FILE.format(rank))


def call_note_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, CALL_NOTE_FILE.format(rank))


def probe_path(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, PROBE_FILE.format(pid))


def remote_probe_path(run_dir: str, rank: int) -> str:
    """The probe record of another node's rank, copied into this run directory at its ending."""
    return os.path.join(run_dir, REMOTE_PROBE_FILE.format(rank))


def ledger_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, LEDGER_FILE.format(rank))


def init_call_path(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, INIT_CALL_FILE.format(pid))


def preflight_record_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, PREFLIGHT_RECORD_FILE.format(rank))


def gone_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, GONE_FILE.format(rank))


def hang_shared_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, HANG_SHARED_FILE.format(rank))


def preflight_dir(run_dir: str) -> str:
    """The launch directory (processes/launch_dir.py) of the ranks' preflight under ddp-doctor's parent."""
    return os.path.join(run_dir, PREFLIGHT_DIR)


def agent_result_path(run_dir: str) -> str:
    """Where the launcher (training/run/agent.py) leaves the exit status of each rank that failed."""
    return os.path.join(run_dir, AGENT_RESULT_FILE)


def _when(d: dict[str, Any], key: str) -> float:
    """A record's time; 0 when it has none or a bad one (a damaged record reads as an old one)."""
    try:
        return float(d.get(key) or 0)
    except (TypeError, ValueError):
        return 0.0


def read_init_calls(run_dir: str) -> list[dict[str, Any]]:
    """Every init_process_group call of this job (join_job) recorded in the run directory, oldest first."""
    out = []
    for p in glob.glob(glob_pattern(run_dir, INIT_CALL_FILE)):
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and _of_this_job(d):
            out.append(d)
    return sorted(out, key=lambda d: _when(d, "time"))


def ledger_request_path(run_dir: str) -> str:
    return os.path.join(run_dir, LEDGER_REQUEST_FILE)


JOB_FIELD = "job"  # the field of a record that names the job that wrote it
_job: str | None = None  # this process's job token; None until its preflight met the other ranks


def join_job(token: str | None) -> None:
    """The job this process belongs to: a token every rank of the job agreed through the
    preflight's store (preflight_ranks/one_rank.py, RankPreflight.job_token). From now on it is written
    into this process's outcome, heartbeat and ledger, and the readers below keep only records of
    this job. A record that names no job (written before the preflight ended, or by an older
    version) is judged by time alone (`since`), as before."""
    global _job
    _job = token or None


def current_job() -> str | None:
    return _job


def _of_this_job(d: dict[str, Any]) -> bool:
    """Not another job's: this process has no token yet, the record names none, or the same."""
    job = d.get(JOB_FIELD)
    return _job is None or job is None or job == _job


def names_this_job(d: dict[str, Any]) -> bool:
    """Strictly this job's: the record names this process's job (any record while it has none).
    For judgements about a peer (gone, still live) that only a record of this job may support."""
    return _job is None or d.get(JOB_FIELD) == _job


def _stamp() -> dict[str, Any]:
    return {JOB_FIELD: _job} if _job else {}


def write_outcome(run_dir: str, rank: int, data: dict[str, Any]) -> None:
    """How the rank ended; its exception's message and traceback are redacted before they are
    written (write_json), as the report is."""
    write_json(outcome_path(run_dir, rank), {"rank": rank, "pid": os.getpid(), "time": time.time(), **_stamp(),
                                             **data})


def write_heartbeat(run_dir: str, rank: int, data: dict[str, Any]) -> None:
    # every second, and no free text (phase, counters, the frame it is in): not redacted
    write_json(heartbeat_path(run_dir, rank), {"rank": rank, "pid": os.getpid(), **_stamp(), **data},
               redact=False)


def write_ledger(run_dir: str, rank: int, data: dict[str, Any]) -> None:
    """One rank's ledger of collectives; a later ending replaces an earlier one. Up to the flight
    recorder's 2000 entries of collectives, sizes and call sites, no free text: not redacted."""
    write_json(ledger_path(run_dir, rank), {"rank": rank, "pid": os.getpid(), "time": time.time(), **_stamp(),
                                            **data}, redact=False)


SAME_JOB = 5.0  # seconds: records written this long before a rank started may be its job's (the
# ranks of a job start within seconds of each other). A record that names its job (join_job) is
# kept or dropped by that; the time bound judges the records that name none.


def _read_all(pattern: str, since: float = 0.0) -> dict[int, dict[str, Any]]:
    """rank -> record, for the records of this job (join_job) written at `since` or later."""
    out: dict[int, dict[str, Any]] = {}
    for p in glob.glob(pattern):
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
            if _when(d, "time") >= since and _of_this_job(d):
                out[int(d["rank"])] = d
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def read_outcomes(run_dir: str, since: float = 0.0) -> dict[int, dict[str, Any]]:
    return _read_all(glob_pattern(run_dir, OUTCOME_FILE), since)


def read_heartbeats(run_dir: str, since: float = 0.0) -> dict[int, dict[str, Any]]:
    """Heartbeats last written at `since` or later (a live rank writes one every second)."""
    return _read_all(glob_pattern(run_dir, HEARTBEAT_FILE), since)


def read_ledgers(run_dir: str, since: float = 0.0) -> dict[int, dict[str, Any]]:
    return _read_all(glob_pattern(run_dir, LEDGER_FILE), since)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_stack(run_dir: str, rank: int) -> str | None:
    return _read_text(stack_path(run_dir, rank))


def read_crashes(run_dir: str) -> dict[int, tuple[str, float]]:
    """rank -> (what faulthandler wrote, when), for the ranks whose crash file is not empty."""
    out: dict[int, tuple[str, float]] = {}
    before, _, after = CRASH_FILE.partition("{}")
    for p in glob.glob(glob_pattern(run_dir, CRASH_FILE)):
        text = _read_text(p)
        try:
            rank, when = int(os.path.basename(p)[len(before):-len(after)]), os.path.getmtime(p)
        except (ValueError, OSError):
            continue
        if text and text.strip():
            out[rank] = (text, when)
    return out


def read_call_notes(run_dir: str) -> dict[int, dict[str, Any]]:
    """rank -> the newest Python-level collective call it kept (probes/collective_sites.py)."""
    from ddp_doctor.training.probes.collective_sites import read_note
    out: dict[int, dict[str, Any]] = {}
    before, _, after = CALL_NOTE_FILE.partition("{}")
    for p in glob.glob(glob_pattern(run_dir, CALL_NOTE_FILE)):
        try:
            rank = int(os.path.basename(p)[len(before):-len(after)])
        except ValueError:
            continue
        note = read_note(p)
        if note is not None:
            out[rank] = note
    return out


def read_probes(run_dir: str, since: float = 0.0) -> list[dict[str, Any]]:
    """The probe records of every process of this job that wrote one (started at `since` or later)."""
    out = []
    for p in sorted(glob.glob(glob_pattern(run_dir, PROBE_FILE))):
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and _when(d, "started") >= since and _of_this_job(d):
            out.append(d)
    return out
