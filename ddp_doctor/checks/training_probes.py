"""The entry to the rules over the in-training probe records of all ranks: `probe_findings(records,
failed=...)` runs them all, in this order:

- init_order.py: set-up order (DDP860-DDP866), per rank and across ranks (shared GPU);
- sampler.py: sampler sharding and epochs (DDP850, DDP852, DDP853), full evaluation on every rank (DDP854);
- replica_consistency.py: parameters and buffers differing between ranks (DDP870, DDP871);
- training_scale.py: data-loading stragglers, global batch and learning rate (DDP872, DDP873);
- teardown.py: destroy_process_group missing (DDP880), judged only when the job did not fail;
- thread_errors.py: a thread of the script that died with an exception (DDP815).

Records are plain dicts, one per process; probe_records.py picks one per rank.
"""
from __future__ import annotations

from typing import Any, Iterable

from ddp_doctor.checks.init_order import init_order, shared_gpu
from ddp_doctor.checks.probe_records import by_rank
from ddp_doctor.checks.replica_consistency import replica_divergence
from ddp_doctor.checks.sampler import sampler_rules
from ddp_doctor.checks.teardown import teardown
from ddp_doctor.checks.thread_errors import thread_errors
from ddp_doctor.checks.training_scale import batch_scaling, stragglers
from ddp_doctor.findings import Finding


def probe_findings(records: Iterable[dict[str, Any]], *, failed: bool = False, load: Any = None) -> list[Finding]:
    """Every probe finding for one job. `failed`: the job already failed (teardown rules that judge
    a normal ending are skipped). `load`: how busy the hosts were while it trained (host_busy.Load)."""
    ranks = by_rank(records)
    out: list[Finding] = []
    for r in sorted(ranks):
        out += init_order(r, ranks[r])
    out += shared_gpu(ranks)
    out += sampler_rules(ranks)
    out += replica_divergence(ranks)
    out += stragglers(ranks, load)
    out += batch_scaling(ranks)
    if not failed:
        out += teardown(ranks)
    out += thread_errors(ranks, failed=failed)
    return out
