"""Network checks on this host: the host names the job depends on resolve, and the network
interfaces named for NCCL, Gloo and SageMaker exist.

IDs DDP300-DDP309. Reaching the master's port belongs to the rendezvous (DDP310-DDP329).
"""
from __future__ import annotations

import socket
from typing import Any, Callable, Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.facts import launchers
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check
from ddp_doctor.time_limit import call_all_with_time_limit

# Overall bound on resolving every host name (resolutions run concurrently).
RESOLVE_TIMEOUT_S = 5.0
# Host names looked up at most (one thread each): the master and this host first, then the others in
# the job's order. A job of thousands of hosts is judged on this sample, and the finding says so.
MAX_RESOLVED = 64
FAILED_SHOWN = 10  # failed names a message quotes; the others are counted
# Indirection so tests can stand in a slow or fake resolver.
_getaddrinfo: Callable[..., Any] = socket.getaddrinfo
LOOPBACK = "lo"


# ---------------------------------------------------------------------------------------------
# Host names

def hosts_to_resolve(ctx: RankContext) -> dict[str, list[str]]:
    """host name -> the sources that name it, in first-seen order (SM_HOSTS, resourceconfig.json).

    MASTER_ADDR is left to the rendezvous, which resolves it on every rank and reports DDP310."""
    named: list[tuple[str, list[str] | None]] = []
    if ctx.sagemaker is not None:
        named += [("SM_HOSTS", ctx.sagemaker.hosts), ("resourceconfig.json hosts", ctx.sagemaker.rc_hosts)]
    out: dict[str, list[str]] = {}
    for source, hosts in named:
        for h in hosts or ():
            h = h.strip()
            if h and source not in out.setdefault(h, []):
                out[h].append(source)
    return out


def resolve_all(hosts: list[str], timeout: float | None = None) -> dict[str, str | None]:
    """host -> None when it resolved, else why not. Lookups run in daemon threads so a resolver
    that never answers costs at most `timeout` (default RESOLVE_TIMEOUT_S) in all and never
    blocks interpreter exit."""
    timeout = RESOLVE_TIMEOUT_S if timeout is None else timeout
    calls = {h: (lambda h=h: _getaddrinfo(h, None)) for h in hosts}
    done = call_all_with_time_limit(calls, timeout, name="ddp-doctor-resolve")

    def outcome(host: str) -> str | None:
        out = done[host]
        if not out.finished:
            return f"did not resolve within {timeout:g} s"
        # a resolver bug (not an OSError) is still "did not resolve", with its reason
        return None if out.error is None else f"{type(out.error).__name__}: {out.error}"

    return {h: outcome(h) for h in hosts}


def resolve_sample(ctx: RankContext, names: list[str], limit: int = MAX_RESOLVED) -> list[str]:
    """The names to look up: all of them, or for a larger job `limit` of them: the SageMaker master
    and this host first (the names the launch depends on), then the others in the job's order."""
    if len(names) <= limit:
        return names
    sm = ctx.sagemaker
    first = [h for h in (sm.master_hostname, sm.this_host) if h] if sm is not None else []
    known = set(names)
    picked = list(dict.fromkeys([h.strip() for h in first if h.strip() in known] + names))
    return picked[:limit]


@check("DDP300", category="network", severity="error", title="Host name does not resolve", timeout=10.0,
       severities=("info",), cause_class="network", action="investigate")
def hosts_resolve(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Every host name of the job (the hosts in SM_HOSTS and in SageMaker's resourceconfig.json;
    of a job of more than 64 hosts, 64 of them: the master, this host and the first others)
    resolves to an address on this host, within a few seconds. MASTER_ADDR is resolved by the
    rendezvous itself (DDP310).
    Why: A rank that cannot resolve the master's name cannot join the rendezvous; one that cannot
    resolve a peer's name fails when NCCL or MPI connects to it. Either way the job hangs or fails
    long after start, with a message that rarely names the host.
    Fix: Make the name resolvable on every node (DNS or /etc/hosts), or set MASTER_ADDR to the
    master's IP address.
    Severity: error for a name that does not resolve; info when a job of more than 64 hosts had a
    sample of its names looked up (the master, this host, then the first others) and all resolved.
    """
    sources = hosts_to_resolve(ctx)
    if not sources:
        return
    names = list(sources)
    checked = resolve_sample(ctx, names)
    sample = (f" (a sample of {len(checked)} of the job's {len(names)} host names: the master, this host and "
              f"the first others; the rest were not looked up)") if len(checked) < len(names) else ""
    outcome = resolve_all(checked)
    failed = {h: why for h, why in outcome.items() if why is not None}
    evidence: dict[str, Any] = {"checked": len(checked), "names": len(names), "timeout_s": RESOLVE_TIMEOUT_S}
    if not failed:
        if sample:
            yield Problem(message=f"all {len(checked)} host names looked up resolved on this host{sample}",
                          severity="info", evidence=evidence)
        return
    alike: dict[tuple[str, str], list[str]] = {}  # names failing the same way, from the same sources
    for h, why in failed.items():
        alike.setdefault((", ".join(sources[h]), why), []).append(h)
    parts = [f"{', '.join(hs[:FAILED_SHOWN])}{f' +{len(hs) - FAILED_SHOWN} more' if len(hs) > FAILED_SHOWN else ''}"
             f" (from {src}): {why}" for (src, why), hs in list(alike.items())[:FAILED_SHOWN]]
    if len(alike) > FAILED_SHOWN:
        parts.append(f"+{sum(len(hs) for hs in list(alike.values())[FAILED_SHOWN:])} more failing otherwise")
    kept = dict(list(failed.items())[:100])
    yield Problem(
        message=f"{len(failed)} of {len(checked)} host name(s) looked up did not resolve on this host{sample}: "
                + "; ".join(parts),
        hint=_resolve_hint(ctx),
        evidence={"failed": kept, "failed_count": len(failed), "sources": {h: sources[h] for h in kept}, **evidence},
    )


def _resolve_hint(ctx: RankContext) -> str | None:
    if ctx.sagemaker is None:
        return None  # the check's default Fix
    return ("On SageMaker the host names come from SM_HOSTS (resourceconfig.json); the training "
            "toolkit waits for every host to resolve before it starts the script, so a name that "
            "still fails was not produced by SageMaker or DNS in the container is not ready. Use "
            "the names from SM_HOSTS / resourceconfig.json as they are (never build 'algo-N' "
            "yourself), and check the VPC's DNS settings (enableDnsSupport / enableDnsHostnames).")


# ---------------------------------------------------------------------------------------------
# Interfaces

def parse_nccl_ifname(spec: str) -> tuple[bool, list[tuple[str, bool]]]:
    """NCCL_SOCKET_IFNAME syntax -> (exclude, [(name, exact)]). A leading `^` excludes the
    listed interfaces; an entry starting with `=` is an exact name, otherwise a prefix."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    entries = []
    for raw in spec.split(","):
        raw = raw.strip()
        exact = raw.startswith("=")
        name = raw[1:] if exact else raw
        if name:
            entries.append((name, exact))
    return exclude, entries


def nccl_selects(spec: str, interface: str) -> bool:
    """Would NCCL use `interface` under NCCL_SOCKET_IFNAME=spec?"""
    exclude, entries = parse_nccl_ifname(spec)
    hit = any(interface == n if exact else interface.startswith(n) for n, exact in entries)
    return not hit if exclude else hit


def _sm_interface(ctx: RankContext) -> tuple[str, str] | None:
    """(source, name) of SageMaker's network interface, when known."""
    if ctx.env.get("SM_NETWORK_INTERFACE_NAME"):
        return "SM_NETWORK_INTERFACE_NAME", ctx.env["SM_NETWORK_INTERFACE_NAME"].strip()
    if ctx.sagemaker is not None and ctx.sagemaker.network_interface:
        return "resourceconfig.json network_interface_name", str(ctx.sagemaker.network_interface).strip()
    return None


def _missing_problem(variable: str, value: str, missing: list[str], present: tuple[str, ...],
                     severity: str | None, note: str = "") -> Problem:
    if not missing:
        what = "matches no interface"
    else:
        what = (f"names {', '.join(repr(m) for m in missing)}, which "
                + ("does" if len(missing) == 1 else "do") + " not exist")
    return Problem(
        message=f"{variable}={value!r} {what} on this host; interfaces present: {', '.join(present)}.{note}",
        severity=severity,
        evidence={"variable": variable, "value": value, "missing": missing, "interfaces": list(present)},
    )


@check("DDP301", category="network", severity="error", title="Named network interface does not exist",
       severities=("warning",), cause_class="configuration")
def interfaces_exist(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The interfaces named by NCCL_SOCKET_IFNAME (comma-separated prefixes; `=name` is an
    exact name), GLOO_SOCKET_IFNAME (comma-separated exact names) and SM_NETWORK_INTERFACE_NAME
    exist on this host.
    Why: NCCL finds no socket interface and fails at init ("no socket interface found"); Gloo
    fails with "Unable to find address for" the name. Container and instance types name their
    interfaces differently (eth0, ens5, enp...), so a value copied from another setup breaks here.
    Fix: Set the variable to an interface this host has (`ip -brief link` lists them), or unset it
    and let the library choose.
    Severity: error when the backend in use reads the variable; a warning when it names a missing
    interface that only another backend would read, or for SageMaker's own interface name (passed on
    as NCCL_SOCKET_IFNAME, which is checked in its own right).
    """
    present = ctx.host.interfaces
    if not present:
        return  # interfaces could not be listed: nothing to compare against
    nccl = (ctx.env.get("NCCL_SOCKET_IFNAME") or "").strip()
    if nccl and not nccl.startswith("^") and not any(nccl_selects(nccl, i) for i in present):
        uses = ctx.backend in ("nccl", "smddp")
        note = "" if uses else f" (the {ctx.backend} backend does not read it, but NCCL would fail on it)"
        yield _missing_problem("NCCL_SOCKET_IFNAME", nccl, [], present, None if uses else "warning", note)
    gloo = (ctx.env.get("GLOO_SOCKET_IFNAME") or "").strip()
    if gloo:
        missing = [n for n in (x.strip() for x in gloo.split(",")) if n and n not in present]
        if missing:
            uses = ctx.backend == "gloo"
            note = "" if uses else f" (the {ctx.backend} backend does not read it, but any Gloo group would fail)"
            yield _missing_problem("GLOO_SOCKET_IFNAME", gloo, missing, present, None if uses else "warning", note)
    sm = _sm_interface(ctx)
    if sm is not None and sm[1] and sm[1] not in present:
        # The toolkit passes it on as NCCL_SOCKET_IFNAME; that variable is checked in its own right.
        yield _missing_problem(sm[0], sm[1], [sm[1]], present, "warning")


@check("DDP302", category="network", severity="warning",
       title="NCCL_SOCKET_IFNAME excludes every interface but loopback", severities=("error",),
       cause_class="configuration")
def nccl_exclusion_leaves_loopback(ctx: RankContext) -> Iterator[Problem]:
    """
    What: NCCL_SOCKET_IFNAME is an exclusion list (`^docker,lo`) that leaves NCCL only the
    loopback interface, or no interface at all.
    Why: With only `lo`, NCCL binds to 127.0.0.1 and ranks on other nodes cannot connect: a
    multi-node job hangs at its first collective. With nothing left, NCCL fails at init.
    Fix: Exclude fewer interfaces, or name the interface to use (NCCL_SOCKET_IFNAME=eth0).
    Severity: a warning when only loopback is left (a multi-node job hangs); error when nothing is
    left (NCCL fails at init).
    """
    nccl = (ctx.env.get("NCCL_SOCKET_IFNAME") or "").strip()
    present = ctx.host.interfaces
    if not nccl.startswith("^") or not present:
        return
    left = [i for i in present if nccl_selects(nccl, i)]
    if left and left != [LOOPBACK]:
        return
    if not left:
        yield Problem(
            message=f"NCCL_SOCKET_IFNAME={nccl!r} excludes every interface on this host "
                    f"({', '.join(present)}); NCCL will find no socket interface.",
            severity="error", evidence={"value": nccl, "interfaces": list(present), "left": left})
        return
    if not launchers.multi_node(ctx.world_size, ctx.local_world_size, nnodes=ctx.nnodes, unknown=True):
        return  # loopback is enough when every rank is on this host
    yield Problem(
        message=f"NCCL_SOCKET_IFNAME={nccl!r} leaves only the loopback interface 'lo' of "
                f"{', '.join(present)}; ranks on other nodes cannot reach this one through it.",
        evidence={"value": nccl, "interfaces": list(present), "left": left})


@check("DDP303", category="network", severity="warning",
       title="NCCL_SOCKET_IFNAME disagrees with SageMaker's network interface", cause_class="configuration")
def nccl_ifname_matches_sagemaker(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On SageMaker, NCCL_SOCKET_IFNAME selects the interface SageMaker names in
    SM_NETWORK_INTERFACE_NAME (resourceconfig.json network_interface_name).
    Why: SageMaker's toolkit sets NCCL_SOCKET_IFNAME to that interface; a value overridden in the
    estimator's environment or in the script sends NCCL traffic over another interface, which is
    slower or cannot reach the other nodes.
    Fix: Remove the override and let the toolkit set NCCL_SOCKET_IFNAME, or set it to the value
    of SM_NETWORK_INTERFACE_NAME.
    """
    if ctx.sagemaker is None:
        return
    nccl = (ctx.env.get("NCCL_SOCKET_IFNAME") or "").strip()
    sm = _sm_interface(ctx)
    if not nccl or sm is None or not sm[1] or nccl_selects(nccl, sm[1]):
        return
    yield Problem(
        message=f"NCCL_SOCKET_IFNAME={nccl!r} does not select {sm[0]}={sm[1]!r}.",
        hint=f"Set NCCL_SOCKET_IFNAME={sm[1]} (or unset it on SageMaker: the toolkit sets it).",
        evidence={"NCCL_SOCKET_IFNAME": nccl, sm[0]: sm[1]})
