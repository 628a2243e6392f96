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

import logging
import math
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
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    quiet = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")
    for name in [*quiet, *logging.root.manager.loggerDict]:
        if name.startswith(quiet):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    from torch.distributed import DistError
    from torch.distributed.elastic.rendezvous import RendezvousError

    args = parse_args(sys.argv[1:] if argv is None else argv)
    run_dir = os.path.dirname(os.environ.get(RESULT_ENV) or "") or None
    if run_dir:  # under ddp-doctor's parent
        os.environ[AGENT_PID_ENV] = str(os.getpid())  # the workers inherit it
        hand_stops_to_parent(args, run_dir)
        ask_before_stopping(run_dir)
    try:
        run(args)
    except (DistError, RendezvousError) as e:  # before any rank started: the nodes did not meet
        from ddp_doctor.exit_codes import EXIT_FAILED
        path = os.environ.get(RESULT_ENV)
        if not path:
            raise
        write_node_report(os.path.dirname(path), rendezvous_finding(args, e))
        return EXIT_FAILED
    except SignalException as e:  # ddp-doctor's parent ended the job (a hang, a stop): it reports why
        if run_dir and not parent_ends_it(run_dir):  # a stop this launcher acted on itself: say so
            _write_stopped(run_dir, int(e.sigval))
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        _write_result({str(rank): f.exitcode for rank, f in e.failures.items()})
        _, first = e.get_first_failure()
        code = first.exitcode
        return code if code > 0 else 128 - code  # a signal -N as the shell shows it: 128 + N
    return 0



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


def _int(value: object, default: int) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def nodes_of(args: Any) -> tuple[int, int, int]:
    """(nodes expected, this node's rank, processes per node) from torchrun's parsed arguments."""
    nnodes = _int(str(getattr(args, "nnodes", "1")).split(":")[-1], 1)
    return nnodes, _int(getattr(args, "node_rank", 0), 0), _int(getattr(args, "nproc_per_node", 1), 1)


def rendezvous_bound(args: Any) -> float | None:
    """The bound on the launcher's rendezvous, from --rdzv-conf (timeout or join_timeout)."""
    conf = dict(kv.split("=", 1) for kv in str(getattr(args, "rdzv_conf", "") or "").split(",") if "=" in kv)
    values = [float(conf[k]) for k in ("join_timeout", "timeout") if k in conf and conf[k].strip().isdigit()]
    return min(values) if values else None


def master_of(args: Any) -> tuple[str, int]:
    endpoint = str(getattr(args, "rdzv_endpoint", "") or "")
    if getattr(args, "rdzv_backend", "static") != "static" and endpoint:
        host, _, port = endpoint.rpartition(":")
        return (host or endpoint), _int(port, 29400)
    return str(getattr(args, "master_addr", "127.0.0.1")), _int(getattr(args, "master_port", 29500), 29500)


def error_texts(error: BaseException) -> list[str]:
    """The first line of `error` and of every exception it was raised from or during (torch's
    c10d rendezvous wraps the store's own error in a RendezvousConnectionError)."""
    out: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append((str(e).strip().splitlines() or [type(e).__name__])[0][:300])
        e = e.__cause__ or e.__context__
    return out


def rendezvous_finding(args: Any, error: BaseException, bound: float | None = None) -> Any:
    """What the launcher's failed (or never-ending) rendezvous means, for this node: when its
    store could not listen on the port (taken by another process), that, with the process; on the
    node that hosts it (node 0), which nodes never arrived; on another node, or in a one-node job,
    that the rendezvous at MASTER_ADDR:MASTER_PORT does not answer (refused / timed out /
    something else on the port)."""
    import re

    from ddp_doctor.checks import rendezvous as ev
    from ddp_doctor.checks.internal import event_finding
    from ddp_doctor.facts import ports
    from ddp_doctor.findings import format_ranks
    nnodes, node, nproc = nodes_of(args)
    host, port = master_of(args)
    bound = bound if bound is not None else rendezvous_bound(args)
    within = f"within {bound:g} s" if bound else "in time"
    texts = error_texts(error)
    text = texts[0]
    backend = getattr(args, "rdzv_backend", "static")
    evidence = {"nnodes": nnodes, "node_rank": node, "nproc_per_node": nproc, "master_addr": host,
                "master_port": port, "rdzv_backend": backend, "bound_s": bound, "error": text}
    in_use = next((t for t in texts if ports.address_in_use(t)), None)
    if in_use is not None:  # the launcher's own store could not listen: no node is missing
        return port_in_use_finding(args, in_use, evidence)
    if (node != 0 and backend == "static") or nnodes <= 1:
        return _unreachable_finding(args, text, within, evidence)
    hint = ("Start every node with the same --nnodes, --master-addr and --master-port and a distinct "
            "--node-rank; check that the missing node started at all (its own log or report), and that "
            f"it can reach {host}:{port}. {ev.SG_HINT}")
    m = re.search(r"(\d+)/(\d+) clients joined", text)
    joined = _int(m.group(1), 0) if m else None
    others = [n for n in range(nnodes) if n != node]
    nodes = f"node{'s' if len(others) > 1 else ''} {format_ranks(others)}"
    if len(others) == 1 or (joined is not None and nnodes - joined == len(others)):
        missing_nodes, which = others, nodes
    elif joined is not None:
        missing_nodes, which = [], (f"{nnodes - joined} of {nodes} (the launcher's store counts the "
                                    f"nodes that arrived, it does not name them)")
    else:
        missing_nodes, which = [], f"at least one of {nodes}"
    ranks = [n * nproc + i for n in missing_nodes for i in range(nproc)]
    arrived = f"{joined} of {nnodes} nodes arrived" if joined is not None else f"{backend} rendezvous"
    evidence.update(missing_nodes=missing_nodes, joined=joined, missing_ranks=ranks)
    return event_finding(
        ev.RANKS_MISSING, f"--nnodes {nnodes}: {which} never joined the launcher's rendezvous at "
        f"{host}:{port} {within} ({arrived}; torch: {text}); no rank was started, on this node "
        f"(node {node}) or any other", rank=None, ranks=ranks or None, evidence=evidence, hint=hint)


def _unreachable_finding(args: Any, text: str, within: str, evidence: dict[str, Any]) -> Any:
    """The launcher could not reach the rendezvous at MASTER_ADDR:MASTER_PORT: another node's
    (node 0's) launcher, or in a one-node job its own store. Why, as the preflight's ranks tell it."""
    from ddp_doctor.checks import rendezvous as ev
    from ddp_doctor.checks.internal import event_finding
    from ddp_doctor.preflight_ranks import bounded_rendezvous as rendezvous
    nnodes, node, _ = nodes_of(args)
    host, port = master_of(args)
    reach = rendezvous.reach_master(host, port, 2.0, attempt_timeout=1.0)
    entry = {"refused": ev.MASTER_REFUSED, "unresolvable": ev.MASTER_UNRESOLVABLE,
             "not_store": ev.NOT_A_STORE}.get(reach.kind, ev.MASTER_TIMEOUT)
    how = reach.detail or ("it accepts connections" if reach.ok else "no answer")
    evidence["detail"] = how
    if nnodes <= 1:
        return event_finding(
            entry, f"one node (--nnodes {nnodes}): the launcher could not set up its rendezvous at "
            f"{host}:{port} {within} ({how}; torch: {text}); no rank was started", rank=None,
            evidence=evidence,
            hint=f"In a one-node job the launcher hosts the rendezvous itself: check that --master-addr "
                 f"{host} is an address of this host (or leave out --master-addr and --master-port: "
                 f"`ddp-doctor run` then passes --standalone, which picks a free port).")
    return event_finding(
        entry, f"node {node} of --nnodes {nnodes}: the launcher could not join the rendezvous of node 0 "
        f"at {host}:{port} {within} ({how}; torch: {text})", rank=None, evidence=evidence,
        hint="Start node 0 first (or at about the same time), with the same --master-addr and "
             f"--master-port as this node; check that {host} is node 0's address. {ev.SG_HINT}")


def port_in_use_finding(args: Any, error_text: str, evidence: dict[str, Any] | None = None) -> Any:
    """DDP313 for the launcher's store: it could not listen on its port because another process
    holds it. Names the port and that process (pid and command line, or "an unknown process" when
    this host does not let it be seen), and the way out."""
    import socket

    from ddp_doctor.checks import rendezvous as ev
    from ddp_doctor.checks.internal import event_finding
    from ddp_doctor.facts import ports
    nnodes, node, nproc = nodes_of(args)
    host, master_port = master_of(args)
    backend = getattr(args, "rdzv_backend", "static")
    port = ports.failed_port(error_text) or master_port
    holders = ports.port_holders(port)
    held_by = "; ".join(h.describe() for h in holders) if holders else ports.PortHolder(None).describe()
    name = f"MASTER_PORT={port}" if backend == "static" else f"port {port} of --rdzv-endpoint"
    where = "one node" if nnodes <= 1 else f"node {node} of --nnodes {nnodes}"
    try:
        hostname = socket.gethostname()
    except OSError:
        hostname = "this host"
    evidence = dict(evidence or {})
    evidence.update(nnodes=nnodes, node_rank=node, nproc_per_node=nproc, master_addr=host, master_port=port,
                    rdzv_backend=backend, error=error_text, holders=[h.to_dict() for h in holders],
                    hostname=hostname)
    pids = [h.pid for h in holders if h.pid is not None]
    stop = f"stop that process (`kill {pids[0]}`)" if len(pids) == 1 else (
        f"stop the processes holding it (`kill {' '.join(map(str, pids))}`)" if pids
        else f"stop the process holding it (`ss -ltnp 'sport = :{port}'` names it, as root if need be)")
    option = "--master-port" if backend == "static" else "--rdzv-endpoint"
    if nnodes <= 1:
        leave = "--master-port (and --master-addr)" if backend == "static" else "--rdzv-endpoint"
        hint = (f"Pick a free port ({option} with another port), or {stop}, or leave out {leave}: on one "
                f"node `ddp-doctor run` then passes --standalone, which picks a free port.")
    else:
        hint = (f"Pick a free port and give it to every node ({option}, the same on each), or {stop} "
                f"on {hostname}.")
    return event_finding(
        ev.PORT_IN_USE, f"{where}: the launcher's rendezvous store could not listen on {name} on "
        f"host {hostname}: the port is already in use, held by {held_by}; no rank was started "
        f"(torch: {error_text})", rank=None, evidence=evidence, hint=hint)


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
    bound = str(max(1, math.ceil(float(torchrun_value(doctor, "--timeout") or 60))))
    conf = torchrun_value(args, "--rdzv-conf", "--rdzv_conf")
    keys = {kv.split("=", 1)[0].strip() for kv in (conf or "").split(",") if "=" in kv}
    more = [f"{k}={bound}" for k in ("timeout", "join_timeout") if k not in keys] if nnodes != "1" else []
    if more:
        args = [a for i, a in enumerate(args) if a.split("=", 1)[0] not in ("--rdzv-conf", "--rdzv_conf")
                and not (i and args[i - 1] in ("--rdzv-conf", "--rdzv_conf"))]
        args.append("--rdzv-conf=" + ",".join(([conf] if conf else []) + more))
    tail = ["-m", target.module] if target.module else [str(target.path)]
    return [sys.executable, "-m", "ddp_doctor.training.run.agent", *args, "-m", "ddp_doctor", "run",
            *doctor, *tail, *target.args]


if __name__ == "__main__":
    sys.exit(main())
