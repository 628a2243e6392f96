"""The check catalogue: stable IDs, documentation sections, selection, plugin modules."""
from __future__ import annotations

import ast
import functools
import re
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest
from helpers.source_scan import declarations

from ddp_doctor import check_runner, registry
from ddp_doctor import checks as catalogue
from ddp_doctor.context import build_context
from ddp_doctor.facts.host import HostFacts
from ddp_doctor.findings import CATEGORIES, SEVERITIES, Problem


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, registry.Check]]:
    """A copy of the full catalogue that tests may add to; the real one is restored afterwards."""
    catalogue.load_catalogue()  # import every module first, so its entries land in the real registry
    scratch = dict(registry.REGISTRY)
    monkeypatch.setattr(registry, "REGISTRY", scratch)
    monkeypatch.setattr(registry, "LOAD_ERRORS", {})
    monkeypatch.setattr(registry, "RETIRED", dict(registry.RETIRED))
    yield scratch


def free_id(reg: dict[str, registry.Check]) -> str:
    for n in range(999, 899, -1):
        cid = f"DDP{n}"
        if cid not in reg and cid not in registry.RETIRED:
            return cid
    raise AssertionError("no free test ID in DDP900-DDP999")


DOC = """
    What: a test check.
    Why: tests.
    Fix: nothing.
    """


# ---------------------------------------------------------------- the catalogue itself

def test_every_entry_is_well_formed() -> None:
    cat = catalogue.load_catalogue()
    assert len(cat) >= 10
    for cid, entry in cat.items():
        assert cid == entry.id
        assert re.fullmatch(r"DDP\d{3}", cid), cid
        assert entry.category in CATEGORIES, cid
        assert entry.severity in SEVERITIES, cid
        assert entry.stage in registry.STAGES, cid
        assert entry.title.strip(), cid
        sections = entry.sections
        for name in ("What", "Why", "Fix"):
            assert sections.get(name, "").strip(), f"{cid} has an empty {name} section"
        assert entry.hint == sections["Fix"]
        if entry.stage == "event":
            assert entry.func is None
        else:
            assert callable(entry.func) and entry.timeout > 0, cid


def test_each_id_is_declared_once_and_registered_under_its_own_key() -> None:
    decl = declarations()
    places: dict[str, list[str]] = {}
    for cid, module, line in decl:
        places.setdefault(cid, []).append(f"{module}:{line}")
    assert len(places) > 100  # the scan sees the catalogue
    assert not {cid: p for cid, p in places.items() if len(p) > 1}, "an ID is declared more than once"
    cat = catalogue.load_catalogue()
    assert set(places) <= set(cat), "declared in the source but not registered by load_catalogue()"
    assert all(key == entry.id for key, entry in cat.items())
    assert not set(cat) & set(registry.RETIRED)


def test_machinery_events_are_catalogued() -> None:
    cat = catalogue.load_catalogue()
    for cid in ("DDP001", "DDP002", "DDP003", "DDP310", "DDP311", "DDP312", "DDP313", "DDP320", "DDP322"):
        assert cid in cat
        assert cat[cid].stage == "event"
    assert cat["DDP001"].category == "internal"


def test_to_dict_has_sections() -> None:
    d = catalogue.get("DDP320").to_dict()
    assert d["id"] == "DDP320" and d["stage"] == "event"
    assert set(d) >= {"id", "category", "severity", "title", "stage", "what", "why", "fix"}


def test_parse_sections_multiline() -> None:
    s = registry.parse_sections("""
        What: first line
          continues here.
        Why: because.
        Fix:
          do this
          and that.
        """)
    assert s == {"What": "first line continues here.", "Why": "because.", "Fix": "do this and that."}


# ---------------------------------------------------------------- registration rules

def test_duplicate_id_raises(scratch_registry: dict[str, registry.Check]) -> None:
    taken = next(iter(sorted(scratch_registry)))
    with pytest.raises(ValueError, match="already taken"):
        registry.check(taken, category="host", severity="error", title="dup")(lambda ctx: iter(()))
    with pytest.raises(ValueError, match="already taken"):
        registry.declare(taken, category="host", severity="error", title="dup", doc=DOC)


def test_retired_id_cannot_be_registered(scratch_registry: dict[str, registry.Check]) -> None:
    cid = free_id(scratch_registry)
    registry.RETIRED[cid] = "retired for a test"
    with pytest.raises(ValueError, match="never reused"):
        registry.declare(cid, category="host", severity="error", title="t", doc=DOC)
    assert cid not in registry.REGISTRY


@pytest.mark.parametrize("kwargs,match", [
    ({"id": "DDP12"}, "DDPnnn"),
    ({"id": "ddp123"}, "DDPnnn"),
    ({"id": "DDP1234"}, "DDPnnn"),
    ({"category": "weather"}, "category"),
    ({"severity": "fatal"}, "severity"),
])
def test_invalid_entries_raise(scratch_registry: dict[str, registry.Check], kwargs: dict[str, str],
                               match: str) -> None:
    args = {"id": free_id(scratch_registry), "category": "host", "severity": "error", "title": "t", **kwargs}
    before = dict(scratch_registry)
    with pytest.raises(ValueError, match=match):
        registry.declare(args.pop("id"), doc=DOC, **args)
    assert scratch_registry == before


def test_unknown_stage_raises(scratch_registry: dict[str, registry.Check]) -> None:
    with pytest.raises(ValueError, match="stage"):
        registry.check(free_id(scratch_registry), category="host", severity="error", title="t",
                       stage="later")(lambda ctx: iter(()))


def test_check_decorator_keeps_function_and_doc(scratch_registry: dict[str, registry.Check]) -> None:
    cid = free_id(scratch_registry)

    def my_check(ctx: object) -> Iterator[Problem]:
        """
        What: looks at something.
        Why: it matters.
        Fix: change it.
        """
        yield Problem("x")

    assert registry.check(cid, category="gpu", severity="warning", title="mine", timeout=3.0)(my_check) is my_check
    entry = scratch_registry[cid]
    assert entry.func is my_check and entry.stage == "local" and entry.timeout == 3.0
    assert entry.hint == "change it."


# ---------------------------------------------------------------- selection

def test_parse_selectors() -> None:
    assert registry.parse_selectors(["DDP101,network"]) == ["DDP101", "network"]
    assert registry.parse_selectors(["DDP101, network ,", "DDP2"]) == ["DDP101", "network", "DDP2"]
    assert registry.parse_selectors(None) == []
    assert registry.parse_selectors([""]) == []


def test_selected_by_exact_id_prefix_and_category() -> None:
    cat = catalogue.load_catalogue()
    entry = cat["DDP310"]
    assert entry.category == "network"
    assert registry.selected(entry, ["DDP310"], [])
    assert registry.selected(entry, ["DDP3"], [])
    assert registry.selected(entry, ["ddp31"], [])
    assert registry.selected(entry, ["network"], [])
    assert not registry.selected(entry, ["DDP1"], [])
    assert not registry.selected(entry, ["gpu"], [])
    assert registry.selected(entry, [], [])
    # skip wins over select
    assert not registry.selected(entry, ["network"], ["DDP310"])
    assert not registry.selected(entry, [], ["DDP3"])


def test_checks_for_respects_selection() -> None:
    local = catalogue.checks_for("local")
    assert local and all(c.stage == "local" for c in local)
    assert [c.id for c in local] == sorted(c.id for c in local)
    only = catalogue.checks_for("local", ["DDP1"])
    assert only and all(c.id.startswith("DDP1") for c in only)
    by_cat = catalogue.checks_for("local", ["launcher_env"])
    assert by_cat and all(c.category == "launcher_env" for c in by_cat)
    skipped = catalogue.checks_for("local", None, ["DDP1"])
    assert not any(c.id.startswith("DDP1") for c in skipped)
    assert len(skipped) + len(only) == len(local)


def test_unknown_selectors() -> None:
    assert catalogue.unknown_selectors(["DDP101", "network", "DDP3", "ddp1", "internal"]) == []
    # "DDP0999" can never prefix a DDPnnn ID, whatever test plugins were loaded in this process
    assert catalogue.unknown_selectors(["nonsense", "DDP101", "DDP0999"]) == ["nonsense", "DDP0999"]


# ---------------------------------------------------------------- plugin modules

def _ctx() -> object:
    facts = HostFacts(hostname="h", interfaces=("lo",), visible_gpus=0, physical_gpus=None, backends=("gloo",))
    return build_context({"RANK": "0", "WORLD_SIZE": "1"}, facts, sm_root="/nonexistent/ddp-doctor-tests")


def test_broken_plugin_module_becomes_ddp001(scratch_registry: dict[str, registry.Check], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    name = "ddp_doctor_test_broken_plugin_mod"
    (tmp_path / f"{name}.py").write_text("raise ImportError('needs the frobnicator package')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.EXTRA_MODULES_ENV, f" {name} , ddp_doctor_test_no_such_module_xyz")
    catalogue.load_catalogue()
    assert "needs the frobnicator package" in registry.LOAD_ERRORS[name]
    assert registry.LOAD_ERRORS["ddp_doctor_test_no_such_module_xyz"].startswith("ModuleNotFoundError")
    # select only an event so that no real local check runs: the load errors are reported anyway
    findings = check_runner.run_stage("local", (_ctx(),), 0, select=["DDP001"])
    ids = [f.id for f in findings]
    assert ids == ["DDP001", "DDP001"]
    broken = next(f for f in findings if f.evidence["module"] == name)
    assert "frobnicator" in broken.message and registry.EXTRA_MODULES_ENV in broken.message
    assert broken.ranks == [0] and broken.category == "internal" and broken.severity == "error"
    # only the local stage reports them
    assert check_runner.run_stage("group", (_ctx(), None), 0, select=["DDP001"]) == []


def test_working_plugin_module_registers_checks(scratch_registry: dict[str, registry.Check], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cid = free_id(scratch_registry)
    name = "ddp_doctor_test_good_plugin_mod"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f'''
        from ddp_doctor.findings import Problem
        from ddp_doctor.registry import check

        @check("{cid}", category="host", severity="warning", title="plugin check", timeout=2.0)
        def plugin_check(ctx):
            """
            What: a plugin.
            Why: teams add their own.
            Fix: plugin fix.
            """
            yield Problem("plugin saw rank %s" % ctx.rank)
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.EXTRA_MODULES_ENV, name)
    monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        catalogue.load_catalogue()
        assert cid in scratch_registry and registry.LOAD_ERRORS == {}
        findings = check_runner.run_stage("local", (_ctx(),), 0, select=[cid])
        assert [(f.id, f.message, f.hint, f.severity) for f in findings] == [
            (cid, "plugin saw rank 0", "plugin fix.", "warning")]
    finally:
        sys.modules.pop(name, None)


# ---------------------------------------------------------------- one severity per ID, or documented

PACKAGE = Path(registry.__file__).resolve().parent


_TREES: dict[str, ast.Module] = {}  # dotted module name -> its tree (filled by severity_overrides)


def _funcs(tree: ast.Module) -> dict[str, tuple[ast.FunctionDef, ast.Module]]:
    """The module's own functions, and those it imports from the package (`from ddp_doctor.x import f`)."""
    out = {n.name: (n, tree) for n in tree.body if isinstance(n, ast.FunctionDef)}
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and n.module in _TREES:
            other = _TREES[n.module]
            defs = {d.name: d for d in other.body if isinstance(d, ast.FunctionDef)}
            for alias in n.names:
                if alias.name in defs:
                    out[alias.asname or alias.name] = (defs[alias.name], other)
    return out


# scope -> name -> values: one walk per scope, not one per name looked up (the scan's cost)
_ASSIGNMENTS: dict[int, tuple[ast.AST, dict[str, list[ast.expr]]]] = {}


def _names(target: ast.AST) -> set[str]:
    return {x.id for x in ast.walk(target) if isinstance(x, ast.Name)}


def _assigned(scope: ast.AST, name: str) -> list[ast.expr]:
    """Values assigned to `name` in scope (for-loop targets give the iterated expression)."""
    held = _ASSIGNMENTS.get(id(scope))
    if held is None or held[0] is not scope:
        index: dict[str, list[ast.expr]] = {}
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign):
                for target_name in set().union(*(_names(t) for t in n.targets)):
                    index.setdefault(target_name, []).append(n.value)
            elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and isinstance(n.target, ast.Name) \
                    and n.value is not None:
                index.setdefault(n.target.id, []).append(n.value)
            elif isinstance(n, (ast.For, ast.comprehension)):
                for target_name in _names(n.target):
                    index.setdefault(target_name, []).append(n.iter)
        held = _ASSIGNMENTS[id(scope)] = (scope, index)  # the scope kept: its id is not reused
    return held[1].get(name, [])


def _literals(expr: ast.AST, scopes: list[ast.AST], seen: set[str] | None = None) -> set[str]:
    """Severity strings an expression can evaluate to, following names assigned in `scopes`."""
    seen = set() if seen is None else seen
    out: set[str] = set()
    for n in ast.walk(expr):
        if isinstance(n, ast.Constant) and n.value in SEVERITIES:
            out.add(n.value)
        elif isinstance(n, ast.Name) and n.id not in seen:
            seen.add(n.id)
            for scope in scopes:
                for value in _assigned(scope, n.id):
                    out |= _literals(value, scopes, seen)
    return out


def _severities_in(func: ast.FunctionDef, tree: ast.Module, seen: set[str]) -> set[str]:
    """Severities that `func` (or a same-module helper it calls) passes as `severity=` / to a
    helper's `severity` parameter."""
    funcs = _funcs(tree)
    scopes: list[ast.AST] = [func, tree]
    out: set[str] = set()
    body = [n for stmt in func.body for n in ast.walk(stmt)]  # not the decorators: their severity is the default
    for call in (n for n in body if isinstance(n, ast.Call)):
        for kw in call.keywords:
            if kw.arg == "severity":
                out |= _literals(kw.value, scopes)
        callee, callee_tree = funcs.get(call.func.id, (None, tree)) if isinstance(call.func, ast.Name) \
            else (None, tree)
        if callee is None or callee.name in seen:
            continue
        seen.add(callee.name)
        params = [a.arg for a in callee.args.args]
        if "severity" in params:
            i = params.index("severity")
            if i < len(call.args):
                out |= _literals(call.args[i], scopes)
        else:
            out |= _severities_in(callee, callee_tree, seen)
    return out


def _check_ids(func: ast.FunctionDef) -> list[str]:
    return [d.args[0].value for d in func.decorator_list
            if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "check"
            and d.args and isinstance(d.args[0], ast.Constant)]


def severity_overrides() -> dict[str, set[str]]:
    """Every severity the package's source can give each ID: `Problem(severity=...)` in a check
    (and the helpers it calls), and `event_finding(EVENT, ..., severity=...)` anywhere."""
    return _severity_overrides(PACKAGE)


@functools.lru_cache(maxsize=None)  # one scan of a package serves every test that reads it
def _severity_overrides(package: Path) -> dict[str, set[str]]:
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(package.rglob("*.py"))}
    _TREES.clear()
    _ASSIGNMENTS.clear()
    for p, tree in trees.items():
        parts = p.relative_to(package.parent).with_suffix("").parts
        _TREES[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = tree
    events: dict[str, str] = {}  # module-level NAME = declare("DDPnnn", ...)
    for tree in trees.values():
        for n in tree.body:
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) \
                    and getattr(n.value.func, "id", None) == "declare" and n.value.args \
                    and isinstance(n.value.args[0], ast.Constant):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        events[t.id] = n.value.args[0].value
    found: dict[str, set[str]] = {}
    for tree in trees.values():
        nodes = list(ast.walk(tree))  # walked once, read twice
        for func in nodes:
            if isinstance(func, ast.FunctionDef):
                for cid in _check_ids(func):
                    found.setdefault(cid, set()).update(_severities_in(func, tree, {func.name}))
        for call in (n for n in nodes if isinstance(n, ast.Call)):
            name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
            if name != "event_finding" or not call.args:
                continue
            target = call.args[0]
            ev = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
            for kw in call.keywords:
                if kw.arg == "severity" and ev in events:
                    enclosing = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                                 and any(c is call for c in ast.walk(f))]
                    found.setdefault(events[ev], set()).update(_literals(kw.value, [*enclosing, tree]))
    return found


def test_severity_scan_sees_overrides() -> None:
    """The scan itself works: it finds an override it must find."""
    found = severity_overrides()
    assert "info" in found.get("DDP509", set()) and "warning" in found["DDP509"]
    assert "warning" in found.get("DDP301", set())  # through a helper's `severity` parameter
    assert "warning" in found.get("DDP911", set())  # through a helper that sets it itself
    assert "warning" in found.get("DDP101", set())  # through a module-level table


def test_every_severity_a_finding_can_have_is_declared() -> None:
    """A `Problem(severity=...)` / `event_finding(..., severity=...)` that gives an ID a severity not
    declared for it (`@check(..., severities=...)`) is an undocumented escalation: declare it and
    explain it in the ID's Severity section, or give the situation an ID of its own."""
    cat = catalogue.load_catalogue()
    bad = {cid: sorted(sevs - set(cat[cid].severities))
           for cid, sevs in severity_overrides().items() if cid in cat and sevs - set(cat[cid].severities)}
    assert not bad, f"severities used but not declared: {bad}"


def test_ids_with_several_severities_explain_them() -> None:
    for cid, entry in catalogue.load_catalogue().items():
        assert entry.severity in entry.severities, cid
        assert list(entry.severities) == [s for s in SEVERITIES if s in entry.severities], cid
        if len(entry.severities) > 1:
            assert entry.sections.get("Severity", "").strip(), f"{cid} has no Severity section"
            assert entry.severity_label.startswith(entry.severity + "/"), cid
        else:
            assert entry.severity_label == entry.severity, cid


def test_several_severities_need_a_severity_section(scratch_registry: dict[str, registry.Check]) -> None:
    cid = free_id(scratch_registry)
    with pytest.raises(ValueError, match="Severity"):
        registry.declare(cid, category="internal", severity="warning", title="t", doc=DOC,
                         severities=("error",))
    with pytest.raises(ValueError, match="unknown severities"):
        registry.declare(cid, category="internal", severity="warning", title="t", doc=DOC,
                         severities=("fatal",))
    entry = registry.declare(cid, category="internal", severity="warning", title="t",
                             doc=DOC + "    Severity: an error past the limit.\n", severities=("error",))
    assert entry.severities == ("error", "warning")
    assert entry.severity_label == "warning/error"
    assert entry.sections["Severity"] == "an error past the limit."
    assert entry.to_dict()["severities"] == ["error", "warning"]
    assert entry.to_dict()["severity"] == "warning"
    assert entry.to_dict()["severity_note"] == "an error past the limit."


def test_undeclared_severity_is_an_error_in_strict_mode(scratch_registry: dict[str, registry.Check],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    entry = registry.declare(free_id(scratch_registry), category="internal", severity="warning", title="t", doc=DOC)
    problem = Problem(message="m", severity="error")
    monkeypatch.delenv(registry.STRICT_SEVERITIES_ENV, raising=False)
    assert entry.finding(problem, rank=0).severity == "error"  # passed on, not lost
    monkeypatch.setenv(registry.STRICT_SEVERITIES_ENV, "1")
    with pytest.raises(ValueError, match="does not declare"):
        entry.finding(problem, rank=0)
    assert entry.finding(Problem(message="m"), rank=0).severity == "warning"
    with pytest.raises(ValueError, match="unknown severity"):
        entry.finding(Problem(message="m", severity="fatal"), rank=0)


def test_probe_record_lost_is_its_own_id() -> None:
    """Split from DDP003: a rank that misses the in-training probe gather is DDP006, a warning."""
    from ddp_doctor.checks.internal import probe_records_missing
    f = probe_records_missing([1, 3], 30.0)
    assert (f.id, f.severity, f.phase, f.ranks) == ("DDP006", "warning", "training", [1, 3])
    assert catalogue.get("DDP003").severities == ("error",)


def test_severity_scan_follows_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan sees severities set in a check, a same-module helper, an imported helper and an event."""
    pkg = tmp_path / "ddp_doctor"
    (pkg / "checks").mkdir(parents=True)
    (pkg / "checks" / "__init__.py").write_text("")
    (pkg / "checks" / "helpers.py").write_text(textwrap.dedent('''
        def shared(msg):
            return Problem(msg, severity="info")
    '''))
    (pkg / "checks" / "mine.py").write_text(textwrap.dedent('''
        from ddp_doctor.checks.helpers import shared
        LEVELS = {"a": "warning"}
        EV = declare("DDP997", category="internal", severity="error", title="t", doc="")

        def local(msg, severity):
            return Problem(msg, severity=severity)

        @check("DDP998", category="internal", severity="error", title="t")
        def c1(ctx):
            yield Problem("m", severity="warning" if ctx else None)
            yield local("m", LEVELS["a"])

        @check("DDP999", category="internal", severity="error", title="t")
        def c2(ctx):
            yield shared("m")

        def raise_event():
            return event_finding(EV, "m", rank=None, severity="info")
    '''))
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    found = severity_overrides()
    assert found == {"DDP998": {"warning"}, "DDP999": {"info"}, "DDP997": {"info"}}


def test_selectors_are_checked_against_the_catalogue_only_when_an_id_is_among_them():
    # a `run` with no --select/--skip, or with categories only, never imports the check modules
    # (a tenth of a second in the parent); an ID or a misspelled name still is a usage error
    import subprocess
    script = textwrap.dedent("""
        import sys
        from ddp_doctor import checks
        assert checks.unknown_selectors([]) == [] and checks.unknown_selectors(["communication"]) == []
        assert "ddp_doctor.checks.communication" not in sys.modules
        assert checks.unknown_selectors(["DDP401", "DDP9", "comunication"]) == ["comunication"]
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
