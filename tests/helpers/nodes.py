"""Simulated nodes on one machine: each 'node' runs in its own UTS and mount namespace with its
own host name and an /etc/hosts where algo-1, algo-2, ... resolve to 127.0.0.1, 127.0.0.2, ...
(the network stays shared, so the nodes talk over loopback)."""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Sequence

import pytest

SCRIPT = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


@functools.lru_cache(maxsize=1)
def namespaces_work() -> bool:
    try:
        r = subprocess.run(["unshare", "--uts", "--mount", "sh", "-c", "hostname ns-probe && hostname"],
                           capture_output=True, text=True, timeout=10)
        return r.returncode == 0 and r.stdout.strip() == "ns-probe"
    except (OSError, subprocess.SubprocessError):
        return False


def require_namespaces() -> None:
    if not namespaces_work():
        pytest.skip("needs `unshare --uts --mount` (root) to simulate nodes with their own host names")


def hosts_file(tmp: Path, names: Sequence[str]) -> Path:
    path = tmp / "hosts"
    lines = ["127.0.0.1 localhost"] + [f"127.0.0.{i + 1} {n}" for i, n in enumerate(names)]
    path.write_text("\n".join(lines) + "\n")
    return path


def on_node(hostname: str, hosts: Path, cmd: Sequence[str]) -> list[str]:
    return ["unshare", "--uts", "--mount", "sh", "-c", SCRIPT, "node", hostname, str(hosts), *cmd]


def run_nodes(tmp_path: Path, hosts: Sequence[str], rank_args: Sequence[str], *, nproc: int = 1,
              master: str | None = None, node_rank_of=None, env_for=None, timeout: float = 120.0) -> list:
    """Start one torchrun per simulated host (`--nnodes len(hosts)`), each running
    `python -m ddp_doctor <rank_args>`, and wait for all of them (bounded, no survivors).

    `node_rank_of(host)` gives each host's --node-rank (default: its position), `env_for(host)`
    its environment (default: a clean one), `master` the --master-addr (default: the first host)."""
    import sys

    from helpers.procs import clean_env, finish, free_port, start
    require_namespaces()
    hosts_path = hosts_file(tmp_path, hosts)
    port = free_port()
    procs = []
    for i, host in enumerate(hosts):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
               "--node-rank", str(node_rank_of(host) if node_rank_of else i),
               "--nproc-per-node", str(nproc), "--master-addr", master or hosts[0],
               "--master-port", str(port), "-m", "ddp_doctor", *rank_args]
        procs.append(start(on_node(host, hosts_path, cmd), env_for(host) if env_for else clean_env(),
                           str(tmp_path)))
    return [finish(p, timeout) for p in procs]


def doctor_run_on_two_nodes(tmp_path: Path, script: Path, options: Sequence[str] = (),
                            script_args: Sequence[str] = ()) -> list:
    """`ddp-doctor run --nnodes 2` of `script`, one rank a node, on two simulated hosts (algo-1,
    algo-2); each node's report in tmp_path/nodeN.json. Their results, waited for with a bound."""
    import sys

    from helpers.procs import clean_env, finish, free_port, start
    require_namespaces()
    hosts = hosts_file(tmp_path, ["algo-1", "algo-2"])
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "ddp_doctor", "run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "algo-1", "--master-port", str(port),
               "--timeout", "30", *options, "--report", str(tmp_path / f"node{node}.json"), str(script),
               *script_args]
        procs.append(start(on_node(f"algo-{node + 1}", hosts, cmd), clean_env(), str(tmp_path)))
    return [finish(p, 150) for p in procs]
