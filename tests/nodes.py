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
