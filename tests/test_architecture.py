"""The "never" rules of the design (docs/architecture.md), enforced on the import graph.

Data flows one way: context -> checks -> findings -> report -> sinks. The graph counts every
import statement in ddp_doctor, those inside functions and under `if TYPE_CHECKING:` too (a lazy or
type-only import is still a dependency). Each failure names the rule it breaks and the import that
breaks it.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.source_scan import PKG, declarations, modules

MODULES = modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file; `from pkg import mod` names the module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                full = f"{mod}.{a.name}"
                out.append((full if full in MODULES else mod, node.lineno))
    return out


@functools.cache
def graph() -> dict[str, list[tuple[str, int]]]:
    """Every module's imports, parsed once, by the first test that reads them (not at collection:
    each xdist worker collects this module, one runs it)."""
    return {m: _imports(m, p) for m, p in MODULES.items()}


def _internal_edges(module: str) -> list[tuple[str, int]]:
    return [(t, line) for t, line in graph()[module] if t in MODULES and t != module]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _violations(sources: list[str], forbidden: list[str], allowed: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """Imports from a module under `sources` of one under `forbidden`; `allowed` names each
    (importing module, imported module) pair that is an exception, one by one."""
    bad = []
    for src in MODULES:
        if not any(_under(src, s) for s in sources):
            continue
        for target, line in graph()[src]:
            if any(_under(target, f) for f in forbidden) and (src, target) not in allowed:
                bad.append(f"{MODULES[src].relative_to(PKG.parent)}:{line} imports {target}")
    return bad


# The one arrow back up, on purpose: `from ddp_doctor.sagemaker import check_job` is the documented
# notebook API, so the platform package keeps a lazy alias of the job check's orchestrator above it.
# Only sagemaker/__init__.py may; any other module of sagemaker/ importing job_check fails.
CHECK_JOB_ALIAS = ("ddp_doctor.sagemaker", "ddp_doctor.job_check")


# The orchestrators: they run the stages, so no stage imports them.
ORCHESTRATORS = ["ddp_doctor.check_runner", "ddp_doctor.api", "ddp_doctor.job_check", "ddp_doctor.preflight_ranks",
                 "ddp_doctor.training.run", "ddp_doctor.pytest_plugin", "ddp_doctor.cli"]

RULES = [
    ("checks never import the CLI, the report/sinks, the training wrapper, the preflight machinery, "
     "the runner or pytest",
     ["ddp_doctor.checks"],
     ["ddp_doctor.cli", "ddp_doctor.report", "ddp_doctor.training.run", "ddp_doctor.preflight_ranks",
      "ddp_doctor.check_runner", "ddp_doctor.pytest_plugin", "ddp_doctor.api", "ddp_doctor.job_check",
      "ddp_doctor.processes", "pytest", "_pytest"], ()),
    ("the context and the facts know nothing of checks, the CLI, the report, the runner or training",
     ["ddp_doctor.context", "ddp_doctor.facts"],
     ["ddp_doctor.checks", "ddp_doctor.registry", "ddp_doctor.check_runner", "ddp_doctor.cli", "ddp_doctor.report",
      "ddp_doctor.preflight_ranks", "ddp_doctor.training", "ddp_doctor.pytest_plugin", "ddp_doctor.comm",
      "ddp_doctor.api", "ddp_doctor.job_check", "ddp_doctor.processes", "pytest", "_pytest"], ()),
    ("the facts are read before a context exists and describe any platform: they never import the "
     "context (it is built from them) or the platform package",
     ["ddp_doctor.facts"],
     ["ddp_doctor.context", "ddp_doctor.sagemaker"], ()),
    ("comm (the collective benchmarks) is a library under the checks and the CLI: it imports no check, "
     "finding, context, platform package, process machinery or orchestrator",
     ["ddp_doctor.comm"],
     ["ddp_doctor.checks", "ddp_doctor.registry", "ddp_doctor.findings", "ddp_doctor.report",
      "ddp_doctor.context", "ddp_doctor.sagemaker", "ddp_doctor.training", "ddp_doctor.processes",
      *ORCHESTRATORS, "pytest", "_pytest"],
     ()),
    ("sagemaker (the platform: the job spec and the AWS calls about it) describes and never runs checks: "
     "it imports no check, finding, report, context, comm, process machinery or orchestrator",
     ["ddp_doctor.sagemaker"],
     ["ddp_doctor.checks", "ddp_doctor.registry", "ddp_doctor.findings", "ddp_doctor.report",
      "ddp_doctor.context", "ddp_doctor.comm", "ddp_doctor.training", "ddp_doctor.processes",
      *ORCHESTRATORS, "pytest", "_pytest"],
     (CHECK_JOB_ALIAS,)),
    ("the report never runs checks (no runner, no catalogue, no preflight, no training wrapper, no CLI)",
     ["ddp_doctor.report"],
     ["ddp_doctor.check_runner", "ddp_doctor.checks", "ddp_doctor.preflight_ranks", "ddp_doctor.training",
      "ddp_doctor.cli", "ddp_doctor.api", "ddp_doctor.job_check", "ddp_doctor.pytest_plugin",
      "ddp_doctor.processes"], ()),
    ("findings and the registry are the bottom of the pipeline: they import no other stage",
     ["ddp_doctor.findings", "ddp_doctor.registry", "ddp_doctor.time_limit", "ddp_doctor.version",
      "ddp_doctor.exit_codes"],
     ["ddp_doctor.checks", "ddp_doctor.check_runner", "ddp_doctor.cli", "ddp_doctor.report", "ddp_doctor.context",
      "ddp_doctor.facts", "ddp_doctor.preflight_ranks", "ddp_doctor.training", "ddp_doctor.comm",
      "ddp_doctor.sagemaker", "ddp_doctor.pytest_plugin", "ddp_doctor.api", "ddp_doctor.job_check",
      "ddp_doctor.processes"], ()),
    ("processes (launching and watching processes) never import the preflight, training, the pytest "
     "plugin, the CLI, the runner, the API, comm, sagemaker, the facts or the context",
     ["ddp_doctor.processes"],
     ["ddp_doctor.preflight_ranks", "ddp_doctor.training", "ddp_doctor.pytest_plugin", "ddp_doctor.cli",
      "ddp_doctor.check_runner", "ddp_doctor.api", "ddp_doctor.job_check", "ddp_doctor.comm", "ddp_doctor.sagemaker",
      "ddp_doctor.facts", "ddp_doctor.context", "pytest", "_pytest"], ()),
    ("nothing but the CLI imports the CLI",
     [m for m in ("ddp_doctor.checks", "ddp_doctor.context", "ddp_doctor.facts", "ddp_doctor.report",
                  "ddp_doctor.preflight_ranks", "ddp_doctor.comm", "ddp_doctor.sagemaker", "ddp_doctor.training",
                  "ddp_doctor.pytest_plugin", "ddp_doctor.check_runner", "ddp_doctor.api", "ddp_doctor.job_check",
                  "ddp_doctor.registry", "ddp_doctor.processes")],
     ["ddp_doctor.cli"], ()),
]


# The layers of docs/architecture.md, bottom first: a module imports from its own layer or below,
# never from above (within a layer, the circle test keeps the arrows one way).
LAYERS = [
    ["findings", "time_limit", "exit_codes", "version"],
    ["facts", "registry"],
    ["context", "comm", "sagemaker", "report", "history"],
    ["checks"],
    ["check_runner", "processes"],
    ["api", "job_check", "preflight_ranks", "testing"],
    ["training", "pytest_plugin", "postmortem"],
    ["cli", "__main__"],
]


def _layer(module: str) -> int | None:
    part = module.split(".")[1] if "." in module else None
    return next((i for i, names in enumerate(LAYERS) if part in names), None)


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {m.split(".")[1] for m in MODULES if "." in m}
    assert parts == {p for names in LAYERS for p in names}, parts ^ {p for names in LAYERS for p in names}


def test_no_import_reaches_a_higher_layer() -> None:
    bad = []
    for src in MODULES:
        for target, line in _internal_edges(src):
            low, high = _layer(src), _layer(target)
            if low is not None and high is not None and high > low and (src, target) != CHECK_JOB_ALIAS:
                bad.append(f"{MODULES[src].relative_to(PKG.parent)}:{line} imports {target} (layer {high} > {low})")
    assert not bad, "an import runs up the layers of docs/architecture.md:\n" + "\n".join(bad)


@pytest.mark.parametrize("rule,sources,forbidden,allowed", RULES, ids=[r[0][:40] for r in RULES])
def test_never_rules(rule: str, sources: list[str], forbidden: list[str],
                     allowed: tuple[tuple[str, str], ...]) -> None:
    bad = _violations(sources, forbidden, allowed)
    assert not bad, f"rule broken: {rule}\n" + "\n".join(bad)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _ in _internal_edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in MODULES:
        if m not in index:
            visit(m)
    return out


def test_no_import_circles() -> None:
    cycles = _cycles()
    assert not cycles, "rule broken: no import circles among ddp_doctor modules\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_nothing_imports_the_package_itself() -> None:
    """ddp_doctor/__init__.py is the public API (lazy); parts import the module they need, so that
    importing any part never pulls in the API and no circle runs through the package."""
    bad = [f"{MODULES[m].relative_to(PKG.parent)}:{line}" for m in MODULES if m != "ddp_doctor"
           for t, line in graph()[m] if t == "ddp_doctor"]
    assert not bad, "rule broken: nothing imports the package ddp_doctor itself\n" + "\n".join(bad)


def _string_module_loads() -> list[str]:
    bad = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
                    in ("import_module", "__import__") and node.args
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("ddp_doctor")):
                bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno} loads {node.args[0].value!r}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("ddp_doctor.checks."):
                bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno} names {node.value!r} as a string")
    return bad


def test_catalogue_modules_are_imported_explicitly() -> None:
    """Every module under checks/ is imported by name in ddp_doctor.checks.load_catalogue (so the
    catalogue is visible to readers and tools); none is loaded from a string."""
    assert not _string_module_loads(), "rule broken: no catalogue module loaded by string\n" + "\n".join(
        _string_module_loads())
    loader = {t for t, _ in graph()["ddp_doctor.checks"]}
    missing = [m for m in MODULES if m.startswith("ddp_doctor.checks.") and m not in loader]
    assert not missing, ("rule broken: every catalogue module is imported in ddp_doctor/checks/__init__.py\n"
                         + "\n".join(missing))


def test_every_check_id_is_declared_under_checks() -> None:
    decl = declarations()
    assert len(decl) > 100  # the scan sees the catalogue (it would pass vacuously on an empty one)
    bad = [f"{MODULES[m].relative_to(PKG.parent)}:{line} declares {cid}" for cid, m, line in decl
           if not m.startswith("ddp_doctor.checks.")]
    assert not bad, "rule broken: every check ID is declared under ddp_doctor/checks/\n" + "\n".join(bad)


def test_the_rules_see_a_violation() -> None:
    """The rules are not vacuous: a check importing the CLI is caught (on a copy of the graph)."""
    src = "ddp_doctor.checks.host"
    saved = graph()[src]
    try:
        graph()[src] = [*saved, ("ddp_doctor.cli.preflight", 99999)]
        assert "ddp_doctor/checks/host.py:99999 imports ddp_doctor.cli.preflight" in _violations(
            ["ddp_doctor.checks"], ["ddp_doctor.cli"])
    finally:
        graph()[src] = saved


# Back arrows once hidden behind a lazy or type-only import; each must break a rule if it comes back.
BACK_ARROWS = [
    ("ddp_doctor.facts.gpus", "ddp_doctor.context"),           # a fact reading the RankContext
    ("ddp_doctor.facts.host", "ddp_doctor.sagemaker.spec"),    # a fact reaching into the platform
    ("ddp_doctor.comm.expected", "ddp_doctor.sagemaker.spec"),  # comm reading the platform package
    ("ddp_doctor.comm.sweep", "ddp_doctor.checks"),
    ("ddp_doctor.comm.sweep", "ddp_doctor.check_runner"),
    ("ddp_doctor.sagemaker.spec", "ddp_doctor.checks.sagemaker_job"),  # the platform running checks
    ("ddp_doctor.sagemaker.aws", "ddp_doctor.check_runner"),
    ("ddp_doctor.sagemaker.aws", "ddp_doctor.report.build"),
    ("ddp_doctor.sagemaker.spec", "ddp_doctor.job_check"),    # the alias is allowed in __init__ only
    ("ddp_doctor.checks.sagemaker_job", "ddp_doctor.job_check"),
]


@pytest.mark.parametrize("src,target", BACK_ARROWS, ids=[f"{s}->{t}" for s, t in BACK_ARROWS])
def test_the_rules_see_each_back_arrow(src: str, target: str) -> None:
    """Each back arrow, added to a copy of the graph, breaks a rule that names it."""
    saved = graph()[src]
    try:
        graph()[src] = [*saved, (target, 99999)]
        hits = [rule for rule, sources, forbidden, allowed in RULES
                if any(f":99999 imports {target}" in v for v in _violations(sources, forbidden, allowed))]
        assert hits, f"no rule catches {src} importing {target}"
    finally:
        graph()[src] = saved


def test_the_graph_counts_lazy_and_type_only_imports(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from ddp_doctor.context import RankContext\n"
                    "def f():\n    from ddp_doctor import check_runner\n    import ddp_doctor.checks.gpu\n")
    seen = {t for t, _ in _imports("ddp_doctor.facts.mod", path)}
    assert {"ddp_doctor.context", "ddp_doctor.check_runner", "ddp_doctor.checks.gpu"} <= seen, seen


def test_top_level_stays_small() -> None:
    top = sorted(p.name for p in PKG.glob("*.py") if not p.name.startswith("__"))
    assert len(top) <= 11, f"{len(top)} modules directly in ddp_doctor/ ({', '.join(top)}): group them by stage"


# The one judge: a finding is worded and decided in checks/; report/ merges and renders the findings
# it is given (it rebuilds them, it never words one); the machinery gathers facts and hands them over.
FINDING_MAKERS = ("Finding", "event_finding")
# registry.Check.finding is the constructor every check's and event's finding goes through: it copies
# the declaration (ID, title, severity, hint) and the words of a check's Problem, and words nothing.
JUDGES = ("ddp_doctor.checks", "ddp_doctor.report", "ddp_doctor.registry")
ID_CONSTANT = re.compile(r"^DDP\d{3}$")


def _finding_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every call of Finding(...) or event_finding(...), by name or attribute."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in FINDING_MAKERS:
                out.append((node.lineno, name))
    return out


def _id_constants(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, ID) of every string constant that is exactly one ID ("DDP123"); the pieces of an
    f-string are left out."""
    in_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstrings
            and ID_CONSTANT.match(node.value)]


def _outside(prefixes: tuple[str, ...], scan: Any) -> list[str]:
    bad = []
    for m, path in MODULES.items():
        if any(_under(m, p) for p in prefixes):
            continue
        for line, what in scan(ast.parse(path.read_text(), filename=str(path))):
            bad.append(f"{path.relative_to(PKG.parent)}:{line} {what}")
    return bad


def test_findings_are_made_only_in_checks() -> None:
    """No Finding(...) or event_finding(...) outside checks/, report/ and the registry's own
    Check.finding: the machinery calls a function of the checks module that declares the ID, with
    the facts it gathered."""
    bad = _outside(JUDGES, _finding_calls)
    assert not bad, ("rule broken: a finding is worded and decided in ddp_doctor/checks/ (report/ only "
                     "merges)\n" + "\n".join(bad))


def test_ids_are_named_only_in_checks() -> None:
    """No "DDPnnn" string outside checks/: code refers to the declared entry (`ENTRY.id`), or selects
    entries by a flag on their declaration. Docstrings and comments may mention IDs."""
    bad = _outside(("ddp_doctor.checks",), _id_constants)
    assert not bad, ("rule broken: an ID is named only by the checks module that declares it\n"
                     + "\n".join(bad))


def test_the_source_scans_see_what_they_forbid() -> None:
    tree = ast.parse('"""Mentions DDP001 in a docstring."""\n'
                     'from ddp_doctor.checks import internal as events\n'
                     'a = events.event_finding(events.CHECK_CRASHED, "m", rank=None)\n'
                     'b = Finding(id=x)\n'
                     'c = Finding.from_dict(d)\n'
                     'SELECT = ["DDP401"]\n'
                     'e = f"DDP{n:03d} and DDP002 {n}"\n')
    assert _finding_calls(tree) == [(3, "event_finding"), (4, "Finding")]
    assert _id_constants(tree) == [(6, "DDP401")]


# A function longer than this is split into named helpers by what its parts do: a reader sees what the
# function does from the names of its steps, and a change lands in the one step it concerns.
MAX_FUNCTION_LINES = 100


def _long_functions(tree: ast.AST, limit: int = MAX_FUNCTION_LINES) -> list[tuple[int, str, int]]:
    """(line, name, length) of every function or method, nested ones too, longer than `limit` lines,
    counted from its `def` line to its last line."""
    return [(node.lineno, node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_is_over_100_lines() -> None:
    bad = [f"{path.relative_to(PKG.parent)}:{line} {name} ({length} lines)" for path in MODULES.values()
           for line, name, length in _long_functions(ast.parse(path.read_text(), filename=str(path)))]
    assert not bad, (f"rule broken: no function in ddp_doctor/ is over {MAX_FUNCTION_LINES} lines (split it into "
                     "helpers named for what each part does)\n" + "\n".join(bad))


def test_the_length_rule_sees_a_long_function() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    tree = ast.parse(f"def short():\n{body}\nclass C:\n    async def long(self):\n{body.replace('    ', '        ')}"
                     "        def inner():\n            pass\n")
    assert _long_functions(tree, limit=4) == [(7, "long", 6)]
