"""This run's figures against the hosts' own past (checks/history_rules.py judges), read from
the history this run will be recorded in. Never raises: a history that cannot be read compares
nothing."""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.history_rules import history_findings
from ddp_doctor.findings import Finding
from ddp_doctor.history.from_report import records_of
from ddp_doctor.history.opened import open_history
from ddp_doctor.history.store import default_path

PAST = 500  # the newest records read per host


def against_history(world: dict[str, Any], ranks: list[dict[str, Any]], measurements: dict[str, Any],
                    env: Any) -> list[Finding]:
    path = default_path(dict(env))
    if path is None:
        return []
    try:
        current = records_of({"phase": "preflight", "status": "pass", "world": world, "ranks": ranks,
                              "measurements": measurements, "findings": []})
        history = open_history(path)
        past = [r for now in current for r in history.records(host=now.host, limit=PAST)]
        return history_findings(current, past)
    except Exception:  # noqa: BLE001 - the history is an aid: never a failed preflight
        return []
