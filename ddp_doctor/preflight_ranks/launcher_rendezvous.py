"""What torch's elastic launcher was told about its own rendezvous (its parsed arguments) and what
it means when that rendezvous fails before any rank starts: the facts are gathered here, the
finding worded in checks/rendezvous.py. Used by ddp-doctor's launcher of `run`
(training/run/agent.py) and of the self-launched preflight (preflight_ranks/launcher.py), so both
say the same thing of the same failure.
"""
from __future__ import annotations

from typing import Any


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


MASTER_PROBE_S = 2.0  # how long ddp-doctor probes MASTER_ADDR:MASTER_PORT after the launcher's rendezvous failed


def launcher_rendezvous(args: Any, error_text: str, bound: float | None = None) -> Any:
    """What the launcher's rendezvous was (checks/rendezvous.py LauncherRendezvous), from torchrun's
    parsed arguments, and torch's `error_text` for how it failed."""
    from ddp_doctor.checks.rendezvous import LauncherRendezvous
    nnodes, node, nproc = nodes_of(args)
    host, port = master_of(args)
    return LauncherRendezvous(nnodes, node, nproc, host, port, str(getattr(args, "rdzv_backend", "static")),
                              bound if bound is not None else rendezvous_bound(args), error_text)


def rendezvous_finding(args: Any, error: BaseException, bound: float | None = None) -> Any:
    """What the launcher's failed (or never-ending) rendezvous means, for this node: when its
    store could not listen on the port (taken by another process), that, with the process; on the
    node that hosts it (node 0), which nodes never arrived; on another node, or in a one-node job,
    that the rendezvous at MASTER_ADDR:MASTER_PORT does not answer (refused / timed out /
    something else on the port), as a probe of it finds. The facts are gathered here; the
    findings are worded in checks/rendezvous.py, as the preflight's ranks word them."""
    import re
    import socket

    from ddp_doctor.checks import rendezvous as ev
    from ddp_doctor.facts import ports
    texts = error_texts(error)
    launcher = launcher_rendezvous(args, texts[0], bound)
    in_use = next((t for t in texts if ports.address_in_use(t)), None)
    if in_use is not None:  # the launcher's own store could not listen: no node is missing
        port = ports.failed_port(in_use) or launcher.master_port
        try:
            hostname = socket.gethostname()
        except OSError:
            hostname = "this host"
        taken = ev.PortTaken(port, hostname, in_use, tuple(ports.port_holders(port)), launcher)
        return ev.port_in_use_finding(taken, None)
    if ev.launcher_reaches_out(launcher):
        from ddp_doctor.preflight_ranks import bounded_rendezvous as rendezvous
        host, port = launcher.master_addr, launcher.master_port
        reach = rendezvous.reach_master(host, port, MASTER_PROBE_S, attempt_timeout=1.0)
        return ev.unreachable_finding(reach, host, port, MASTER_PROBE_S, None, launcher)
    m = re.search(r"(\d+)/(\d+) clients joined", texts[0])
    joined = _int(m.group(1), 0) if m else None
    return ev.ranks_missing_finding(ev.Missing(launcher=launcher, joined=joined), None)
