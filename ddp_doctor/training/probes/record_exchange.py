"""Records handed between ranks through the process group's key-value store: `gather` (every
rank's record under a key prefix, bounded waits, no collective, so a rank that never arrives cannot
hang the others) and `share_across_nodes` (at destroy_process_group, rank 0 copies the records of
ranks on other nodes into its run directory)."""
from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from ddp_doctor.training.probes.recorder import Recorder, int_env, torch_dist
from ddp_doctor.training.records import remote_probe_path, write_json

STORE_WAIT = 15.0  # seconds rank 0 waits for the other nodes' records at destroy_process_group
NODE_RECORDS_KEY = "ddp_doctor/node-records"


def put_record(store: Any, key: str, rec: Recorder) -> None:
    store.set(key, json.dumps(rec.to_dict(), default=str))


def gather(store: Any, prefix: str, world: int, timeout: float) -> tuple[list[dict[str, Any]], list[int]]:
    """Every rank's record from the store, waiting at most `timeout` in all."""
    deadline = time.monotonic() + timeout
    got, missing = [], []
    for r in range(world):
        key = f"{prefix}/{r}"
        left = max(0.05, deadline - time.monotonic())
        try:
            store.wait([key], timedelta(seconds=left))
            got.append(json.loads(store.get(key)))
        except Exception:  # noqa: BLE001 - timed out or the store failed: report the rank as missing
            missing.append(r)
    return got, missing


def share_across_nodes(rec: Recorder) -> None:
    """Ranks on other nodes write their records in another directory: while the process group is
    still up, every rank puts its record in the group's store and rank 0 copies the others into
    its run directory (bounded waits, no collective), so its report covers every node."""
    try:
        dist = torch_dist()
        world = dist.get_world_size()
        local = int_env("LOCAL_WORLD_SIZE") or int_env("OMPI_COMM_WORLD_LOCAL_SIZE")
        if not rec.out_dir or world <= 1 or local is None or local >= world:
            return
        store = dist.distributed_c10d._get_default_store()
        rank = dist.get_rank()
        put_record(store, f"{NODE_RECORDS_KEY}/{rank}", rec)
        if rank != 0:
            return
        got, _ = gather(store, NODE_RECORDS_KEY, world, STORE_WAIT)
        for d in got:
            if d.get("rank") not in (None, 0):
                write_json(remote_probe_path(rec.out_dir, d["rank"]), d)
    except Exception as e:  # noqa: BLE001 - a probe never breaks the job
        rec.note_error("share across nodes", e)
