"""Whether the hosts were busy while the ranks were timed, from each rank's load window
(facts/host_load.py), for the timing checks that name a slow rank.

Two readings of the same windows:
- a node is busy when other processes than the job's ranks kept BUSY_SHARE of its cores busy, the
  hypervisor stole STEAL_BUSY of its time, or its load average was above its cores: a rank's pace
  there is partly the scheduler's, so a slow rank is said with that doubt (at most info);
- a rank's CPUs are shared when other processes took SHARED_CORES more of its CPUs than of the
  other ranks' (a rank pinned beside other work): that is a cause of its slowness the user can
  act on, so it is named (a warning), busy host or not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ddp_doctor.comm.stragglers import median
from ddp_doctor.facts.host_load import LoadWindow

BUSY_SHARE = 0.25  # other processes' CPU, as a share of the node's cores, from which it is busy
STEAL_BUSY = 0.10  # the hypervisor's steal, as a share of the node's CPU time
SHARED_CORES = 0.25  # cores of other work on a rank's CPUs beyond the other ranks' median


@dataclass(frozen=True)
class Load:
    """What the windows say: busy nodes (node -> why), other work on each rank's CPUs (cores)."""
    busy: dict[Any, str] = field(default_factory=dict)
    others: dict[int, float] = field(default_factory=dict)
    read: bool = False  # some window could be read

    def shared(self, rank: int) -> bool:
        """Other processes took markedly more of this rank's CPUs than of the other ranks'."""
        mine = self.others.get(rank)
        rest = [v for r, v in self.others.items() if r != rank]
        return mine is not None and bool(rest) and mine - median(rest) >= SHARED_CORES

    def describe(self) -> str:
        return "; ".join(f"node {n}: {why}" if len(self.busy) > 1 or n != 0 else why
                         for n, why in sorted(self.busy.items(), key=lambda kv: str(kv[0])))

    def summary(self) -> dict[str, Any]:
        """measurements.host_load of a report: whether a host was busy while the job was timed,
        the history's test of a run it may compare with (history/from_report.py)."""
        return {"busy": bool(self.busy), **self.evidence()}

    def evidence(self) -> dict[str, Any]:
        return {"busy_nodes": {str(k): v for k, v in self.busy.items()},
                "other_cores_on_rank_cpus": {str(r): round(v, 2) for r, v in self.others.items()}}


def read(loads: Mapping[int, LoadWindow], node_of: Mapping[int, Any]) -> Load:
    """The ranks' windows read together: a rank's own CPU and its node's other ranks' (those with
    the same CPU set share its CPUs) are the job's, the rest is other processes'."""
    by_node: dict[Any, list[int]] = {}
    for r in loads:
        by_node.setdefault(node_of.get(r, 0), []).append(r)
    busy: dict[Any, str] = {}
    others: dict[int, float] = {}
    for node, ranks in by_node.items():
        job = sum(loads[r].own for r in ranks)
        w = loads[ranks[0]]
        why = []
        if w.busy_host is not None:
            other = max(0.0, w.busy_host - job)
            if other >= BUSY_SHARE * w.cores:
                why.append(f"other processes used {other:.1f} of its {w.cores} cores")
        if w.steal is not None and w.steal >= STEAL_BUSY:
            why.append(f"the hypervisor stole {w.steal:.0%} of its CPU time")
        if w.load1 is not None and w.load1 > w.cores:
            why.append(f"load average {w.load1:.1f} on {w.cores} cores")
        if why:
            busy[node] = ", ".join(why)
        for r in ranks:
            mine = loads[r].busy_mine
            if mine is None:
                continue
            mates = sum(loads[j].own for j in ranks if loads[j].cpus_key == loads[r].cpus_key)
            others[r] = max(0.0, mine - mates)
    return Load(busy, others, read=bool(others) or any(w.busy_host is not None for w in loads.values()))


def of_ledgers(ledgers: Mapping[int, Mapping[str, Any]]) -> Load | None:
    """The load the ranks' ledgers kept while they trained (`host_load`), read by host; None when
    no ledger kept one."""
    windows = {r: w for r, led in ledgers.items() if (w := LoadWindow.from_dict(led.get("host_load"))) is not None}
    if not windows:
        return None
    return read(windows, {r: str(ledgers[r].get("host") or "") for r in windows})
