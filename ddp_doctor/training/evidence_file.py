"""The evidence file: what a training job's verdict was judged from, written beside its report
(`ddp-doctor-report.json` -> `ddp-doctor-report.evidence.json`) and judged again by
`ddp-doctor analyze FILE.evidence.json`.

A user attaches it to a bug report; a maintainer replays it: the same rules over the same evidence
give the same verdict, with no access to the job's machines. It holds the judge's whole input
(checks/job.py's :class:`JobEvidence`, the preflight's findings, the report's world and ranks, the
measurements the report started from) and the verdict it led to. The one input a replay cannot
read again is the host's history: the findings it gave (DDP409) are kept as judged.

The report's sinks write it (report/sinks.write_evidence_file), redacted like the report.
Format: a JSON object, `schema` "ddp-doctor.evidence", `version` 1. JobEvidence's fields keyed by
rank are objects keyed by the rank's number as text; pairs are two-item lists; a stop signal is
its report form (Interrupt.to_dict) with the time it came.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ddp_doctor.checks.job import JobEvidence
from ddp_doctor.findings import Finding
from ddp_doctor.processes.stop_signals import Interrupt

SCHEMA = "ddp-doctor.evidence"
VERSION = 1
SIZE_LIMIT = 512 << 20  # bytes read back: a 4,096-rank job's full ledgers are a few hundred MB at most

# JobEvidence's fields keyed by rank, and how each value is read back
_BY_RANK = ("outcomes", "exits", "crashes", "last_calls", "ledgers", "stopped_at", "stacks", "vanished",
            "clock_offsets", "heartbeats")
_PAIRS = ("crashes", "clock_offsets")


class NotEvidence(ValueError):
    """The file is no evidence file ddp-doctor can read: the message says why."""


def document(ev: JobEvidence, *, world: dict[str, Any], ranks: list[dict[str, Any]],
             earlier: list[Finding], more: list[Finding], history: list[Finding],
             measurements: dict[str, Any], report: dict[str, Any], code: int) -> dict[str, Any]:
    """The evidence file's content for a verdict judged from these inputs (training/job_report.py)."""
    from ddp_doctor.version import __version__
    return {
        "schema": SCHEMA, "version": VERSION, "ddp_doctor": __version__,
        "verdict": verdict(report, code),
        "world": world, "ranks": ranks, "measurements": measurements,
        "earlier": [f.to_dict() for f in earlier], "more": [f.to_dict() for f in more],
        "history": [f.to_dict() for f in history],
        "evidence": evidence_to_dict(ev),
    }


def verdict(report: dict[str, Any], code: int) -> dict[str, Any]:
    """What a replay must reproduce: the status, the exit code, the root cause and each finding (its
    ID, severity and ranks), in the report's order."""
    root = report.get("root_cause") or {}
    return {"status": report.get("status"), "exit_code": int(code),
            "root_cause": {"id": root.get("id"), "ranks": list(root.get("ranks") or [])} if root else None,
            "findings": [[f.get("id"), f.get("severity"), list(f.get("ranks") or [])]
                         for f in report.get("findings") or [] if isinstance(f, dict)]}


def evidence_to_dict(ev: JobEvidence) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ev):
        value = getattr(ev, f.name)
        if f.name in _BY_RANK:
            value = {str(r): list(v) if f.name in _PAIRS else v for r, v in value.items()}
        elif f.name == "unlogged":
            value = sorted(value)
        elif f.name == "interrupted" and value is not None:
            value = {**value.to_dict(), "at": value.at}
        out[f.name] = value
    return out


def evidence_from_dict(d: Any) -> JobEvidence:
    """JobEvidence from its file form; NotEvidence names the first field that cannot be read."""
    if not isinstance(d, dict):
        raise NotEvidence("its 'evidence' is not an object")
    known = {f.name: f for f in dataclasses.fields(JobEvidence)}
    kwargs: dict[str, Any] = {}
    for name, value in d.items():
        if name not in known:
            continue  # a field of a later version: its rules are not here to read it
        try:
            kwargs[name] = _field(name, value)
        except (TypeError, ValueError, KeyError) as e:
            raise NotEvidence(f"its evidence field {name!r} cannot be read ({type(e).__name__}: {e})") from None
    return JobEvidence(**kwargs)


def _field(name: str, value: Any) -> Any:
    if name in _BY_RANK:
        if not isinstance(value, dict):
            raise TypeError("not an object keyed by rank")
        return {int(r): _pair(v) if name in _PAIRS else v for r, v in value.items()}
    if name == "unlogged":
        return {int(r) for r in value}
    if name == "interrupted":
        return None if value is None else _interrupt(value)
    if name == "ranks":
        return [int(r) for r in value]
    return value


def _pair(value: Any) -> tuple[Any, Any]:
    first, second = value
    return first, second


def _interrupt(d: dict[str, Any]) -> Interrupt:
    repeated = tuple(_interrupt(r) for r in d.get("repeated") or ())
    return Interrupt(int(d["signo"]), sender_pid=d.get("sender_pid"), sender=d.get("sender"),
                     at=float(d.get("at") or 0.0), to=d.get("to"), repeated=repeated)


def read(path: str) -> dict[str, Any]:
    """The evidence file at `path`, checked to be one; NotEvidence says why it is not."""
    try:
        if os.path.getsize(path) > SIZE_LIMIT:
            raise NotEvidence(f"{path} is larger than {SIZE_LIMIT >> 20} MB")
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except NotEvidence:
        raise
    except (OSError, ValueError) as e:
        raise NotEvidence(f"{path} cannot be read as JSON ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise NotEvidence(f"{path} is not a ddp-doctor evidence file (no \"schema\": \"{SCHEMA}\")")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise NotEvidence(f"{path} is evidence of version {doc.get('version')!r}; this ddp-doctor reads "
                          f"version {VERSION} and earlier: judge it with the version that wrote it "
                          f"({doc.get('ddp_doctor')})")
    return doc


def is_evidence_file(path: str) -> bool:
    """Whether `path` names a regular file that starts as an evidence file does (read: its first bytes)."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return f'"{SCHEMA}"'.encode() in head


def findings(doc: dict[str, Any], key: str) -> list[Finding]:
    items = doc.get(key) or []
    if not isinstance(items, list):
        raise NotEvidence(f"its {key!r} is not a list of findings")
    try:
        return [Finding.from_dict(d) for d in items]
    except (TypeError, ValueError, KeyError) as e:
        raise NotEvidence(f"a finding of its {key!r} cannot be read ({type(e).__name__}: {e})") from None
