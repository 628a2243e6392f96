"""The report's JSON Schema (ddp_doctor/report/schema.json): a valid draft 2020-12 schema, in step
with the code's constants and with docs/report-schema.md, accepting every kind of report the
builders make, and the built-in validator agreeing with the `jsonschema` package."""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import ddp_doctor
from ddp_doctor import findings as findings_mod
from ddp_doctor import registry
from ddp_doctor.findings import ROOT_CAUSE, Finding
from ddp_doctor.report import build, sinks
from ddp_doctor.report.schema import ANNOTATIONS, SUPPORTED_KEYWORDS, TEST_ERRORS_ENV, report_schema, validate_report

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "report-schema.md"
SCHEMA = report_schema()
DEFS = SCHEMA["$defs"]


def _jsonschema_errors(report: Any) -> list[str] | None:
    """jsonschema's verdict (None when it is not installed)."""
    try:
        import jsonschema
    except ImportError:
        return None
    return [e.message for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(report)]


def _finding(fid: str = "DDP320", severity: str = "error", ranks: tuple[int, ...] = (2,), t: float = 1.0,
             **kw: Any) -> Finding:
    return Finding(id=fid, category="network", severity=severity, title="Ranks missing at rendezvous",
                   message="WORLD_SIZE=3 but only 2 rank(s) checked in", hint="Make WORLD_SIZE right",
                   ranks=list(ranks), evidence={"arrived": [0, 1], "missing": [2]}, time=t, **kw)


WORLD = {"launcher": "torchrun", "backend": "gloo", "world_size": 2, "nnodes": 1, "nproc_per_node": 2,
         "master_addr": "localhost", "master_port": 29500, "platform": None}
RANKS = [{"rank": 0, "local_rank": 0, "node_rank": 0, "host": "algo-1", "device": "cpu"},
         {"rank": 1, "local_rank": 1, "node_rank": 0, "host": "algo-1", "device": "cpu"}]
SWEEP = [{"bytes": 1048576, "count": 262144, "type": "float", "redop": "sum", "time_us": 2886.0,
          "algbw_gbps": 0.36, "busbw_gbps": 0.36, "correct": True, "wrong": 0, "wrong_ranks": [], "iters": 5,
          "group": "world", "nranks": 2}]
MEASUREMENTS = {"all_reduce": SWEEP, "all_reduce_inter": [{**SWEEP[0], "sharing": 2}], "broadcast": SWEEP,
                "all_gather": SWEEP, "stage_seconds": {"startup": 3.92, "total": 0.99, "launch": 5.83},
                "check_seconds": {"DDP401": 0.75}, "something_new": {"any": ["shape"]}}


def _reports() -> Iterator[tuple[str, dict[str, Any]]]:
    """One report of each kind the builders make."""
    from ddp_doctor.processes.stop_signals import Interrupt
    yield "pass", build.build_report(world=WORLD, ranks=RANKS, findings=[])
    yield "fail", build.build_report(world=WORLD, ranks=RANKS, findings=[
        _finding(), _finding("DDP320", ranks=(3,), t=2.0), _finding("DDP405", "warning", (1,), 0.5),
        _finding("DDP801", ranks=(0,), t=3.0, caused_by=ROOT_CAUSE, phase="training")],
        measurements=MEASUREMENTS)
    running = build.mark_running(build.build_report(world={**WORLD, "launched_by": "ddp-doctor"}, ranks=RANKS,
                                                    findings=[_finding("DDP405", "warning")]))
    yield "running", running
    stop = Interrupt(15, sender_pid=1234, sender="bash", to="the launcher",
                     repeated=(Interrupt(2, sender_pid=None),))
    yield "interrupted", build.mark_interrupted(build.build_report(
        world=WORLD, ranks=[], findings=[_finding("DDP808", ranks=(0, 1))], phase="training"), stop.to_dict())
    yield "planned sagemaker job", build.build_report(world={
        "launcher": "torchrun", "backend": "nccl", "world_size": 16, "nnodes": 2, "nproc_per_node": 8,
        "master_addr": None, "master_port": None, "platform": "sagemaker", "planned": True,
        "instance_type": "ml.p4d.24xlarge", "instance_count": 2, "distribution": "torch_distributed",
        "gpus_per_instance": 8, "region": "us-east-1"}, ranks=[], findings=[_finding("DDP901", "info", ())])
    yield "rank pool", build.build_report(world={"launcher": "pytest (ddp-doctor's rank pool)"},
                                          ranks=[{"rank": None, "local_rank": None, "node_rank": None,
                                                  "host": None, "device": None}], findings=[])


REPORTS = dict(_reports())


def _on_disk(report: dict[str, Any]) -> dict[str, Any]:
    """The report as write_report_file writes it and a reader loads it."""
    return json.loads(json.dumps(report, default=str))


@pytest.mark.parametrize("kind", sorted(REPORTS))
def test_every_kind_of_report_is_valid(kind: str) -> None:
    report = _on_disk(REPORTS[kind])
    assert validate_report(report) == []
    assert _jsonschema_errors(report) in (None, [])


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def _keywords(node: Any, out: set[str]) -> set[str]:
    """Every keyword a schema uses (the names under properties and $defs are not keywords)."""
    if isinstance(node, dict):
        for k, v in node.items():
            out.add(k)
            if k in ("properties", "$defs"):
                for sub in v.values():
                    _keywords(sub, out)
            elif k in ("items", "additionalProperties"):
                _keywords(v, out)
            elif k == "anyOf":
                for sub in v:
                    _keywords(sub, out)
    return out


def test_the_built_in_validator_knows_every_keyword_the_schema_uses() -> None:
    unknown = _keywords(SCHEMA, set()) - SUPPORTED_KEYWORDS - ANNOTATIONS
    assert not unknown, f"schema.json uses keywords validate_report does not apply: {sorted(unknown)}"


def test_the_schema_follows_the_code() -> None:
    props = SCHEMA["properties"]
    assert props["schema"]["const"] == build.SCHEMA and props["schema_version"]["const"] == build.SCHEMA_VERSION
    finding = DEFS["finding"]["properties"]
    assert finding["category"]["enum"] == list(findings_mod.CATEGORIES)
    assert finding["severity"]["enum"] == list(findings_mod.SEVERITIES)
    assert finding["phase"]["enum"] == props["phase"]["enum"] == list(findings_mod.PHASES)
    assert DEFS["check_id"]["pattern"].replace("[0-9]", r"\d") == registry.ID_PATTERN.pattern
    # every finding written carries its cause_class and action; reports written before them stay valid
    assert set(DEFS["finding"]["required"]) == set(_finding().to_dict()) - {"cause_class", "action"}
    assert set(finding) == set(_finding().to_dict()) | {"hosts"}  # hosts: the root cause's, to leave out
    assert finding["cause_class"]["enum"] == list(findings_mod.CAUSE_CLASSES)
    assert finding["action"]["enum"] == list(findings_mod.ACTIONS)
    assert set(SCHEMA["required"]) == set(REPORTS["pass"])
    assert set(DEFS["rank"]["required"]) == set(build.rank_entry({}))
    for cid in ("DDP001", "DDP320", "DDP999"):
        assert re.search(DEFS["check_id"]["pattern"], cid)


BROKEN = {
    "a key missing": lambda r: r.pop("root_cause"),
    "a top-level key the schema does not know": lambda r: r.update(extra=1),
    "an unknown status": lambda r: r.update(status="ok"),
    "schema_version true": lambda r: r.update(schema_version=True),
    "schema_version 2": lambda r: r.update(schema_version=2),
    "a wrong schema name": lambda r: r.update(schema="other"),
    "an unknown phase": lambda r: r.update(phase="setup"),
    "a malformed ID": lambda r: r["findings"][0].update(id="DDP32"),
    "an unknown severity": lambda r: r["findings"][0].update(severity="fatal"),
    "an unknown category": lambda r: r["findings"][0].update(category="misc"),
    "a finding field missing": lambda r: r["findings"][0].pop("hint"),
    "a finding field the schema does not know": lambda r: r["findings"][0].update(extra=1),
    "a rank that is a string": lambda r: r["findings"][0].update(ranks=["1"]),
    "a negative rank": lambda r: r["findings"][0].update(ranks=[-1]),
    "caused_by that is no ID": lambda r: r["findings"][0].update(caused_by="root_cause"),
    "evidence that is a list": lambda r: r["findings"][0].update(evidence=[]),
    "a root cause that is a string": lambda r: r.update(root_cause="DDP320"),
    "a bad root cause": lambda r: r["root_cause"].pop("id"),
    "a world port that is a string": lambda r: r["world"].update(master_port="29500"),
    "launched_by someone else": lambda r: r["world"].update(launched_by="me"),
    "a rank entry missing its host": lambda r: r["ranks"][0].pop("host"),
    "a sweep entry without bytes": lambda r: r["measurements"]["all_reduce"][0].pop("bytes"),
    "correct that is a string": lambda r: r["measurements"]["all_reduce"][0].update(correct="yes"),
    "stage seconds that are strings": lambda r: r["measurements"]["stage_seconds"].update(total="1s"),
    "measurements that are a list": lambda r: r.update(measurements=[]),
    "interrupted without signo": lambda r: r.update(interrupted={"signal": "SIGTERM"}),
    "preflight_status running": lambda r: r.update(preflight_status="running"),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_report_is_invalid_to_both_validators(what: str) -> None:
    report = _on_disk(copy.deepcopy(REPORTS["fail"]))
    BROKEN[what](report)
    errors = validate_report(report)
    assert errors, what
    assert all(e.startswith("$") for e in errors), errors
    theirs = _jsonschema_errors(report)
    assert theirs is None or theirs, f"jsonschema accepts {what}"


def test_the_validator_says_where() -> None:
    report = _on_disk(REPORTS["fail"])
    report["findings"][1]["id"] = "DDPX"
    assert validate_report(report) == ["$.findings[1].id: \"DDPX\" does not match '^DDP[0-9]{3}$'"]


def test_report_schema_is_public_and_a_copy() -> None:
    a = ddp_doctor.report_schema()
    a["properties"].clear()
    assert ddp_doctor.report_schema() == SCHEMA and ddp_doctor.validate_report is validate_report


# --- the suite's hook: write_report_file validates under TEST_ERRORS_ENV, in any process ---------

@pytest.mark.invalid_reports_expected  # bad.json, on purpose
def test_write_report_file_records_an_invalid_report_under_the_test_env(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    errors_dir = tmp_path / "errors"
    errors_dir.mkdir()
    monkeypatch.setenv(TEST_ERRORS_ENV, str(errors_dir))
    assert sinks.write_report_file(REPORTS["fail"], str(tmp_path / "good.json")) is None
    assert os.listdir(errors_dir) == []
    assert sinks.write_report_file({**REPORTS["fail"], "status": "ok"}, str(tmp_path / "bad.json")) is None
    assert (tmp_path / "bad.json").exists()  # the report is written either way
    [name] = os.listdir(errors_dir)
    record = json.loads((errors_dir / name).read_text())
    assert record["path"] == str(tmp_path / "bad.json") and "$.status" in record["errors"][0]


def test_without_the_env_nothing_is_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_ERRORS_ENV, raising=False)
    import ddp_doctor.report.schema as schema_mod
    monkeypatch.setattr(schema_mod, "validate_report", lambda r: pytest.fail("validated in a user's run"))
    assert sinks.write_report_file({"status": "ok"}, str(tmp_path / "r.json")) is None


def test_a_child_process_records_its_invalid_report(tmp_path: Path) -> None:
    """Ranks write reports in processes of their own: the environment carries the hook there."""
    errors_dir = tmp_path / "errors"
    errors_dir.mkdir()
    code = ("import sys; from ddp_doctor.report import sinks; "
            "sinks.write_report_file({'status': 'ok'}, sys.argv[1])")
    env = {**os.environ, TEST_ERRORS_ENV: str(errors_dir)}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "child.json")], check=True, env=env, timeout=60)
    [name] = os.listdir(errors_dir)
    assert "required key 'schema' is missing" in (errors_dir / name).read_text()


# --- docs/report-schema.md names what the schema has, and the schema what the doc names ---------

def _doc_example() -> dict[str, Any]:
    text = DOC.read_text()
    block = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    block = block.replace('"pass | warn | fail | interrupted | running"', '"pass"')
    return json.loads(block)


def _named_in_doc(key: str) -> bool:
    return re.search(rf'[`"]([\w.]*\.)?{re.escape(key)}[`":]', DOC.read_text()) is not None


def test_the_doc_example_has_exactly_the_schema_s_keys() -> None:
    ex = _doc_example()
    props = SCHEMA["properties"]
    assert set(ex) <= set(props), set(ex) - set(props)
    assert set(SCHEMA["required"]) <= set(ex)
    assert set(ex["findings"][0]) == set(DEFS["finding"]["properties"]) - {"hosts"}
    assert set(ex["ranks"][0]) == set(DEFS["rank"]["properties"])
    assert set(ex["world"]) <= set(DEFS["world"]["properties"]), set(ex["world"]) - set(DEFS["world"]["properties"])
    entry = ex["measurements"]["all_reduce"][0]
    assert set(DEFS["sweep_entry"]["required"]) <= set(entry) <= set(DEFS["sweep_entry"]["properties"])
    example = copy.deepcopy(ex)
    example["root_cause"] = example["findings"][0]
    assert validate_report(example) == []


@pytest.mark.parametrize("where", ["properties", "world", "interrupt", "measurements", "sweep_entry"])
def test_every_key_of_the_schema_is_named_in_the_doc(where: str) -> None:
    props = SCHEMA["properties"] if where == "properties" else DEFS[where]["properties"]
    missing = [k for k in props if not _named_in_doc(k)]
    assert not missing, f"docs/report-schema.md does not name {where} keys {missing}"


def test_the_doc_names_the_schema_command() -> None:
    text = DOC.read_text()
    assert "ddp-doctor schema" in text and "schema.json" in text


def test_the_schema_is_package_data() -> None:
    """`pip install .` (not only an editable install) ships schema.json."""
    tomllib = pytest.importorskip("tomllib")
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "schema.json" in conf["tool"]["setuptools"]["package-data"]["ddp_doctor.report"]
