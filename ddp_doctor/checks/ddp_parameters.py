"""DDP's errors about single parameters, named: "Expected to have finished reduction in the prior
iteration" (DDP823) lists by index the parameters that received no gradient in the rank's
iteration; "Expected to mark a variable ready only once" (DDP847) gives the index (in recent torch
also the name) of one whose gradient came twice. By default torch prints only the indices.

The in-training probes record, for each DDP model a rank built, the names of the parameters its
reducer holds, in the reducer's order: the order the indices count in (probe record
"ddp_parameters", training/probes/dist_wrappers.py `reduced_parameter_names`). These pure functions
map the indices to those names (`name_indices`) and word the findings (`with_parameter_names`).
Without the record (a post-mortem from logs, an older record) the names torch's message holds are
used (TORCH_DISTRIBUTED_DEBUG=INFO/DETAIL), else the finding keeps its wording.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

from ddp_doctor.checks.probe_records import by_rank
from ddp_doctor.checks.rank_endings import failure_text
from ddp_doctor.findings import Finding, brief_ranks

UNUSED_ID = "DDP823"
READY_TWICE_ID = "DDP847"
SHOWN, SHOWN_CHARS = 12, 600  # what a message lists per rank, at most; the evidence keeps up to KEPT
KEPT = 256

_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+):[ \t]*([\d ,\t]*)")
_NAMES = re.compile(r"Parameters which did not receive grad for rank (\d+):[ \t]*([^\n]*)")
_TWICE = re.compile(r"Parameter at index (\d+)(?: with name (\S+?))? has been marked as ready twice")
_REDUCTION = "Expected to have finished reduction in the prior iteration before starting a new one"
_READY_ONCE = "Expected to mark a variable ready only once"


@dataclass(frozen=True)
class Named:
    """The indices of one DDP error, named against one model the rank built: `pairs` are (index,
    name); a name is None past the names recorded (the record keeps at most 4096)."""

    model: str
    pairs: tuple[tuple[int, str | None], ...]


def unused_indices(text: str) -> tuple[list[int], list[str]] | None:
    """(the indices, the names) of the parameters that received no gradient, from DDP's
    "Expected to have finished reduction" text; the names only under TORCH_DISTRIBUTED_DEBUG
    (torch lists them in its own order, not the indices'). None when the text lists none."""
    m = _INDICES.search(text)
    if m is None:
        return None
    indices = [int(i) for i in re.findall(r"\d+", m.group(2))]
    n = _NAMES.search(text)
    names = [s.strip() for s in n.group(2).split(",") if s.strip()] if n else []
    return (indices, names) if indices or names else None


def ready_twice(text: str) -> tuple[int, str | None] | None:
    """(the index, the name if torch gave it) of the parameter "marked as ready twice"."""
    m = _TWICE.search(text)
    return (int(m.group(1)), m.group(2)) if m else None


def name_indices(indices: list[int], models: Iterable[dict[str, Any]]) -> list[Named]:
    """The indices named against each DDP model the rank recorded whose reducer holds that many
    parameters (a model with fewer cannot have raised); several models may fit, the same list
    recorded twice counts once. [] when no model fits or there is no record."""
    out: list[Named] = []
    seen: list[list[str]] = []
    for m in models:
        if not isinstance(m, dict):
            continue
        names = [str(n) for n in m.get("names") or []]
        count = m.get("count")
        count = int(count) if isinstance(count, int) else len(names)
        if not indices or max(indices) >= count or min(indices) < 0 or names in seen:
            continue
        seen.append(names)
        out.append(Named(str(m.get("model") or "the model"),
                         tuple((i, names[i] if i < len(names) else None) for i in indices)))
    return out


def _listed(items: list[str]) -> str:
    """At most SHOWN items and SHOWN_CHARS characters of them, then how many more."""
    shown: list[str] = []
    for item in items[:SHOWN]:
        if shown and sum(len(s) + 2 for s in shown) + len(item) > SHOWN_CHARS:
            break
        shown.append(item)
    return ", ".join(shown) + (f" and {len(items) - len(shown)} more" if len(items) > len(shown) else "")


def _pairs_text(pairs: Iterable[tuple[int, str | None]]) -> str:
    return _listed([f"{n} (index {i})" if n is not None else f"index {i} (past the names recorded)"
                    for i, n in pairs])


def _named_text(named: list[Named]) -> str:
    if len(named) == 1:
        return _pairs_text(named[0].pairs)
    return ("; or, ".join(f"in {n.model} (DDP model {k})" + ": " + _pairs_text(n.pairs)
                          for k, n in enumerate(named, 1))
            + f" (the rank built {len(named)} DDP models that hold these indices; which one raised is not recorded)")


def _models_of(probes: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    return {r: list(p.get("ddp_parameters") or []) for r, p in by_rank(probes).items()}


def _exception_text(outcomes: dict[int, dict[str, Any]], rank: int) -> str:
    exc = (outcomes.get(rank) or {}).get("exception")
    return failure_text(exc) if isinstance(exc, dict) else ""


def _unused_said(text: str, models: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]] | None:
    """What one rank's message says, named: (the names as the finding lists them, the evidence)."""
    got = unused_indices(text)
    if got is None:
        return None
    indices, from_message = got
    named = name_indices(indices, models)
    if named:
        return _named_text(named), [{"model": n.model, "index": i, "name": name}
                                    for n in named for i, name in n.pairs[:KEPT]]
    if from_message:
        listed = _listed(from_message)
        return (f"{listed} (indices {' '.join(map(str, indices))})" if indices else listed,
                [{"name": n} for n in from_message[:KEPT]])
    return None


def _by_rank(said: dict[int, str], ranks: list[int]) -> str:
    """"rank 1: X", "ranks 0-1: X" when every rank of the finding says the same, else "rank 0: X;
    rank 1: Y"; an "{its}" in X reads "its", or "each one's" for several ranks."""
    if len(said) > 1 and len(set(said.values())) == 1 and set(said) == set(ranks):
        return f"ranks {brief_ranks(sorted(said))}: " + next(iter(said.values())).replace("{its}", "each one's")
    return "; ".join(f"rank {r}: {t.replace('{its}', 'its')}" for r, t in sorted(said.items()))


def unused_parameters_finding(f: Finding, outcomes: dict[int, dict[str, Any]],
                              models: dict[int, list[dict[str, Any]]]) -> Finding:
    """A DDP823 finding that names, for each of its ranks, the parameters its iteration left
    without a gradient; `f` itself when no rank's indices can be named."""
    said: dict[int, tuple[str, list[dict[str, Any]]]] = {}
    for r in f.ranks:
        got = _unused_said(_exception_text(outcomes, r), models.get(r) or [])
        if got is not None:
            said[r] = got
    if not said:
        return f
    head = _by_rank({r: "parameters unused in {its} iteration (DDP did not receive their gradient): " + t
                     for r, (t, _) in said.items()}, f.ranks)
    whose = "its" if len(f.ranks) == 1 else "each one's"
    message = f"{head}; so {whose} next forward raised RuntimeError: {_REDUCTION}"
    evidence = {**f.evidence, "error": f.message,
                "unused_parameters": {str(r): ev for r, (_, ev) in sorted(said.items())}}
    return replace(f, message=message, evidence=evidence)


def ready_twice_finding(f: Finding, outcomes: dict[int, dict[str, Any]],
                        models: dict[int, list[dict[str, Any]]]) -> Finding:
    """A DDP847 finding that names the parameter marked ready twice (and its module): from torch's
    message when it names it, else from the rank's record of its DDP model; `f` when neither can."""
    said: dict[int, str] = {}
    for r in f.ranks:
        got = ready_twice(_exception_text(outcomes, r))
        if got is None:
            continue
        index, name = got
        if name is not None:
            said[r] = _parameter_text(name, index)
            continue
        named = name_indices([index], models.get(r) or [])
        if named:
            said[r] = _named_text(named) if len(named) > 1 else _parameter_text(named[0].pairs[0][1], index)
    if not said:
        return f
    head = _by_rank(said, f.ranks)
    message = (f"{head} got its gradient twice in one backward pass (DDP marks each parameter ready once an "
               f"iteration): RuntimeError: {_READY_ONCE}")
    evidence = {**f.evidence, "error": f.message,
                "ready_twice": {str(r): t for r, t in sorted(said.items())}}
    return replace(f, message=message, evidence=evidence)


def _parameter_text(name: str | None, index: int) -> str:
    if name is None:
        return f"the parameter at index {index} (past the names recorded)"
    name = name.lstrip(".")
    module = name.rpartition(".")[0]
    return f"parameter {name} (index {index}" + (f", of module {module})" if module else ", of the root module)")


def with_parameter_names(findings: list[Finding], outcomes: dict[int, dict[str, Any]],
                         probes: list[dict[str, Any]]) -> list[Finding]:
    """The findings, with DDP823 and DDP847 naming the parameters their indices stand for."""
    if not any(f.id in (UNUSED_ID, READY_TWICE_ID) for f in findings):
        return findings
    models = _models_of(probes)
    out = []
    for f in findings:
        if f.id == UNUSED_ID:
            f = unused_parameters_finding(f, outcomes, models)
        elif f.id == READY_TWICE_ID:
            f = ready_twice_finding(f, outcomes, models)
        out.append(f)
    return out
