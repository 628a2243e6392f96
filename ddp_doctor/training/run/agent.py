"""torch's elastic launcher, run the way `ddp-doctor run` needs it: torchrun's own argument
parser and launch code (`torch.distributed.run.parse_args` / `run`), without torchrun's uncaught
ChildFailedError traceback and failure banner, and with the root-cause rank's own exit code.

    python -m ddp_doctor.training.run.agent [torchrun options] -m ddp_doctor run ... SCRIPT [ARGS]

ddp-doctor's parent process owns the diagnosis, so the launcher stays quiet about failures.
It owns the stops too: a SIGTERM, SIGINT or SIGHUP sent to the launcher is passed on to the
parent (hand_stops_to_parent), which takes the ranks' stacks and ledgers before it ends the job and
reports it as stopped; the launcher ends its ranks itself only when the parent ends it, is gone,
or a second stop comes. Its ranks die with it (watched_rank.py, AGENT_PID_ENV): a launcher killed outright
(SIGKILL) leaves no rank training.
When the launcher's own rendezvous fails (its store cannot listen on a port another process
holds; a node that never arrives, a master node that does not answer: bounded by the
`--rdzv-conf timeout=/join_timeout=` the parent passes, agent_command), no rank ever
starts; the agent then leaves the finding where the parent reads the preflight (write_node_report)
and exits with status 3, as a failed preflight does.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from ddp_doctor.processes.stop_signals import STOP_SIGNALS

if TYPE_CHECKING:
    from ddp_doctor.training.run.target import Target

RESULT_ENV = "DDP_DOCTOR_AGENT_RESULT"
AGENT_PID_ENV = "DDP_DOCTOR_AGENT_PID"  # this launcher's pid, for its ranks to die with it (watched_rank.py)
PARENT_ENDS_FILE = "agent-end"  # in the run directory: the parent ends the launcher (no passing back)
STOPPED_FILE = "agent-stopped.json"  # in the run directory: the stop signal the launcher acted on itself


def _write_result(exits: dict[str, int]) -> None:
    """rank -> exit status of the ranks that failed, for the ddp-doctor parent (0600, as every
    record in the run directory)."""
    path = os.environ.get(RESULT_ENV)
    if path:
        from ddp_doctor.training import records
        records.write_json(path, exits, redact=False)


def main(argv: list[str] | None = None) -> int:
    from ddp_doctor.processes.collector import imports_uncollected
    with imports_uncollected():  # the ranks start sooner
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run
    from ddp_doctor.preflight_ranks.launcher import quiet_launcher_logs
    quiet_launcher_logs()
    from torch.distributed import DistError
    from torch.distributed.elastic.rendezvous import RendezvousError

    args = parse_args(sys.argv[1:] if argv is None else argv)
    run_dir = os.path.dirname(os.environ.get(RESULT_ENV) or "") or None
    if run_dir:  # under ddp-doctor's parent
        os.environ[AGENT_PID_ENV] = str(os.getpid())  # the workers inherit it
        hand_stops_to_parent(args, run_dir)
        ask_before_stopping(run_dir)
        logs_in_run_dir(args, run_dir)
    try:
        run(args)
    except (DistError, RendezvousError) as e:  # before any rank started: the nodes did not meet
        from ddp_doctor.exit_codes import EXIT_FAILED
        path = os.environ.get(RESULT_ENV)
        if not path:
            raise
        from ddp_doctor.preflight_ranks.launcher_rendezvous import rendezvous_finding
        write_node_report(os.path.dirname(path), rendezvous_finding(args, e))
        return EXIT_FAILED
    except SignalException as e:  # ddp-doctor's parent ended the job (a hang, a stop): it reports why
        if run_dir and not parent_ends_it(run_dir):  # a stop this launcher acted on itself: say so
            _write_stopped(run_dir, int(e.sigval))
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        _write_result({str(rank): f.exitcode for rank, f in e.failures.items()})
        from ddp_doctor.preflight_ranks.launcher import first_failure_status
        return first_failure_status(e)
    return 0



def logs_in_run_dir(args: Any, run_dir: str) -> None:
    """torch's launcher makes a log tree per run (each rank's error file; its output with
    --redirects / --tee) in a new /tmp/torchelastic_* directory that nothing removes: one more per
    job. Without a --log-dir of the user's, and with no output asked to go there, that tree goes in
    the run directory, which the parent removes (or keeps, with --run-dir)."""
    if getattr(args, "log_dir", None) or getattr(args, "redirects", "0") != "0" or getattr(args, "tee", "0") != "0":
        return
    from ddp_doctor.report.private_files import ELASTIC_SUBDIR
    args.log_dir = os.path.join(run_dir, ELASTIC_SUBDIR)


def hand_stops_to_parent(args: Any, run_dir: str) -> None:
    """A stop signal sent to this launcher goes to ddp-doctor's parent, once, while the launcher
    keeps its ranks running: the parent takes their stacks and ledgers, then ends the launcher and
    reports a job stopped by a signal sent to the launcher. torch's own handling (end the ranks,
    then exit 128 + N) is kept for a stop that comes when the parent is ending the launcher
    (PARENT_ENDS_FILE), after the parent died (the launcher's own death signal), or for a second
    stop. torch is told to leave these signals to us (its --signals-to-handle)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    parent = os.getppid()
    rest = "SIGQUIT"  # what torch still handles itself
    if hasattr(args, "signals_to_handle"):
        args.signals_to_handle = rest
    else:  # a torch without the option reads the variable
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = rest
    passed: list[int] = []

    def on_stop(signum: int, frame: Any) -> None:
        if not passed and os.getppid() == parent and not parent_ends_it(run_dir):
            passed.append(signum)
            try:
                os.kill(parent, signum)
                return
            except OSError:
                pass
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_stop)


PEERS_LEDGER_WAIT = 5.0  # seconds the launcher waits for the live ranks' ledgers before it stops them


def ask_before_stopping(run_dir: str) -> None:
    """When a rank fails, torch's launcher stops the others at once, and where they were then
    (waiting in a collective, or elsewhere) is what tells cause from consequence. A rank that
    raised asks its live peers for their ledgers itself before it exits (watched_rank.py); a rank
    killed by a signal (a native abort inside a collective, SIGKILL) cannot: the launcher asks
    for it, and waits at most PEERS_LEDGER_WAIT seconds for the live ranks that have not written
    one, before it ends them (torch's process context ends the others as soon as one failed)."""
    import time

    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    from ddp_doctor.training.run import ledger
    started = time.time()
    close = SubprocessContext.close

    def close_after_asking(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if getattr(self, "_failures", None) and getattr(self, "_running_local_ranks", None):
                wanted = ledger.unanswered_ranks(run_dir, since=started)
                if wanted:
                    asked = time.time()
                    ledger.request(run_dir, reason="peer failed")
                    ledger.wait_for(run_dir, wanted, asked, PEERS_LEDGER_WAIT)
        except Exception:  # noqa: BLE001 - the ranks are ended whatever the run directory holds
            pass
        return close(self, *args, **kwargs)

    SubprocessContext.close = close_after_asking  # type: ignore[method-assign]


def parent_ends(run_dir: str) -> None:
    """Called by the parent before it ends the launcher: the launcher then ends its ranks itself."""
    try:
        with open(os.path.join(run_dir, PARENT_ENDS_FILE), "w", encoding="utf-8"):
            pass
    except OSError:
        pass  # the launcher passes the signal back once; the parent's SIGKILL after its grace ends it


def parent_ends_it(run_dir: str) -> bool:
    return os.path.exists(os.path.join(run_dir, PARENT_ENDS_FILE))


def _write_stopped(run_dir: str, signo: int) -> None:
    try:
        from ddp_doctor.training import records
        records.write_json(os.path.join(run_dir, STOPPED_FILE), {"signo": signo}, redact=False)
    except Exception:  # noqa: BLE001 - the parent then reports the launcher's exit status
        pass


def read_stop(run_dir: str) -> int | None:
    """The stop signal the launcher acted on itself (it ended its ranks), or None."""
    import json
    try:
        with open(os.path.join(run_dir, STOPPED_FILE), encoding="utf-8") as f:
            signo = int(json.load(f)["signo"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return signo if signo in {int(s) for s in STOP_SIGNALS} else None


def write_node_report(run_dir: str, finding: Any) -> None:
    """Leave `finding` where the parent (parent_report.py finish) reads a self-launched preflight:
    the merged report of this node, and a final record for its first local rank (none started)."""
    from ddp_doctor.processes.launch_dir import rank_path, report_path
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.training import records
    pf_dir = records.preflight_dir(run_dir)
    ev = finding.evidence or {}
    nnodes, nproc = int(ev.get("nnodes") or 1), int(ev.get("nproc_per_node") or 1)
    world = {"launcher": "torchrun", "backend": None, "world_size": nnodes * nproc, "nnodes": nnodes,
             "nproc_per_node": nproc, "master_addr": ev.get("master_addr"), "master_port": ev.get("master_port")}
    rep = reportlib.build_report(world=world, ranks=[], findings=[finding])
    try:
        records.make_private_dir(pf_dir)
        for path, data in ((report_path(pf_dir), rep),
                           (rank_path(pf_dir, 0), {"rank": 0, "final": True, "view": {}, "findings": []})):
            records.write_json(path, data)
    except OSError:
        pass


# ---------------------------------------------------------------- the launcher's command line

def torchrun_value(torchrun: list[str], *names: str) -> str | None:
    """The value of the first of `names` in a list of options as given (`--name V` or `--name=V`);
    None when it is not there."""
    for i, a in enumerate(torchrun):
        key, _, val = a.partition("=")
        if key in names:
            return val if val else (torchrun[i + 1] if i + 1 < len(torchrun) else None)
    return None


def agent_command(torchrun: list[str], doctor: list[str], target: Target) -> list[str]:
    """This launcher's command line, as the parent starts it (parent.py): torchrun's options (no
    restarts unless asked, --standalone for one node without a given address, the rendezvous of
    several nodes bounded by --timeout), then each rank as `python -m ddp_doctor run` with the
    ddp-doctor options and the target, which the rank reads again (cli/run_argv.py)."""
    args = list(torchrun)
    if torchrun_value(args, "--max-restarts", "--max_restarts") is None:
        args += ["--max-restarts", "0"]
    nnodes = torchrun_value(args, "--nnodes") or "1"
    given = any(torchrun_value(args, n) for n in ("--master-addr", "--master_addr", "--rdzv-endpoint",
                                                   "--rdzv_endpoint", "--master-port", "--master_port"))
    if nnodes == "1" and not given and "--standalone" not in args:
        args.append("--standalone")  # a free port for the store: no collisions between jobs
    # Several nodes: the launcher's own rendezvous waits for the others 900 s by default (static:
    # timeout, c10d: join_timeout): bound it by --timeout, as the preflight bounds the ranks' meeting.
    from ddp_doctor.preflight_ranks.local_launch import bounded_rdzv_conf
    conf = bounded_rdzv_conf(torchrun_value(args, "--rdzv-conf", "--rdzv_conf"),
                             float(torchrun_value(doctor, "--timeout") or 60))
    if nnodes != "1" and conf is not None:
        args = [a for i, a in enumerate(args) if a.split("=", 1)[0] not in ("--rdzv-conf", "--rdzv_conf")
                and not (i and args[i - 1] in ("--rdzv-conf", "--rdzv_conf"))]
        args.append("--rdzv-conf=" + conf)
    tail = ["-m", target.module] if target.module else [str(target.path)]
    return [sys.executable, "-m", "ddp_doctor.training.run.agent", *args, "-m", "ddp_doctor", "run",
            *doctor, *tail, *target.args]


if __name__ == "__main__":
    sys.exit(main())
