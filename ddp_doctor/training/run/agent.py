"""torch's elastic launcher, run the way `ddp-doctor run` needs it: torchrun's own argument
parser and launch code (`torch.distributed.run.parse_args` / `run`), without torchrun's uncaught
ChildFailedError traceback and failure banner, and with the root-cause rank's own exit code.

    python -m ddp_doctor.training.run.agent [torchrun options] -m ddp_doctor run ... SCRIPT [ARGS]

ddp-doctor's parent process owns the diagnosis, so the launcher stays quiet about failures.
When the launcher's own rendezvous fails (a node that never arrives, a master node that does not
answer: bounded by the `--rdzv-conf timeout=/join_timeout=` the parent passes, command.py
agent_command), no rank ever starts; the agent then leaves the finding where the parent reads the
preflight (write_node_report) and exits with status 3, as a failed preflight does.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

RESULT_ENV = "DDP_DOCTOR_AGENT_RESULT"


def _write_result(exits: dict[str, int]) -> None:
    """rank -> exit status of the ranks that failed, for the ddp-doctor parent."""
    path = os.environ.get(RESULT_ENV)
    if path:
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(exits, f)
        except OSError:
            pass


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
    try:
        run(args)
    except (DistError, RendezvousError) as e:  # before any rank started: the nodes did not meet
        from ddp_doctor.exit_codes import EXIT_FAILED
        path = os.environ.get(RESULT_ENV)
        if not path:
            raise
        write_node_report(os.path.dirname(path), rendezvous_finding(args, e))
        return EXIT_FAILED
    except SignalException as e:  # ddp-doctor's parent ended the job (a hang): it reports why
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        _write_result({str(rank): f.exitcode for rank, f in e.failures.items()})
        _, first = e.get_first_failure()
        code = first.exitcode
        return code if code > 0 else 128 - code  # a signal -N as the shell shows it: 128 + N
    return 0



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


def rendezvous_finding(args: Any, error: BaseException, bound: float | None = None) -> Any:
    """What the launcher's failed (or never-ending) rendezvous means, for this node: on the node
    that hosts it (node 0), which nodes never arrived; on another node, that node 0's launcher
    does not answer (refused / timed out / something else on the port)."""
    import re

    from ddp_doctor.checks import rendezvous as ev
    from ddp_doctor.checks.internal import event_finding
    from ddp_doctor.findings import format_ranks
    from ddp_doctor.preflight_run import rendezvous
    nnodes, node, nproc = nodes_of(args)
    host, port = master_of(args)
    bound = bound if bound is not None else rendezvous_bound(args)
    within = f"within {bound:g} s" if bound else "in time"
    text = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    backend = getattr(args, "rdzv_backend", "static")
    evidence = {"nnodes": nnodes, "node_rank": node, "nproc_per_node": nproc, "master_addr": host,
                "master_port": port, "rdzv_backend": backend, "bound_s": bound, "error": text}
    hint = ("Start every node with the same --nnodes, --master-addr and --master-port and a distinct "
            "--node-rank; check that the missing node started at all (its own log or report), and that "
            f"it can reach {host}:{port}. {ev.SG_HINT}")
    if node != 0 and backend == "static":
        reach = rendezvous.reach_master(host, port, 2.0, attempt_timeout=1.0)
        entry = {"refused": ev.MASTER_REFUSED, "unresolvable": ev.MASTER_UNRESOLVABLE,
                 "not_store": ev.NOT_A_STORE}.get(reach.kind, ev.MASTER_TIMEOUT)
        how = reach.detail or ("it accepts connections" if reach.ok else "no answer")
        evidence["detail"] = how
        return event_finding(
            entry, f"node {node} of --nnodes {nnodes}: the launcher could not join the rendezvous of node 0 "
            f"at {host}:{port} {within} ({how}; torch: {text})", rank=None, evidence=evidence,
            hint="Start node 0 first (or at about the same time), with the same --master-addr and "
                 f"--master-port as this node; check that {host} is node 0's address. {ev.SG_HINT}")
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


def write_node_report(run_dir: str, finding: Any) -> None:
    """Leave `finding` where the parent (command.py finish) reads a self-launched preflight:
    the merged report of this node, and a final record for its first local rank (none started)."""
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.training import records
    pf_dir = os.path.join(run_dir, "preflight")
    ev = finding.evidence or {}
    nnodes, nproc = int(ev.get("nnodes") or 1), int(ev.get("nproc_per_node") or 1)
    world = {"launcher": "torchrun", "backend": None, "world_size": nnodes * nproc, "nnodes": nnodes,
             "nproc_per_node": nproc, "master_addr": ev.get("master_addr"), "master_port": ev.get("master_port")}
    rep = reportlib.build_report(world=world, ranks=[], findings=[finding])
    try:
        os.makedirs(pf_dir, exist_ok=True)
        for name, data in (("report.json", rep),
                           ("rank-0.json", {"rank": 0, "final": True, "view": {}, "findings": []})):
            records.write_json(os.path.join(pf_dir, name), data)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
