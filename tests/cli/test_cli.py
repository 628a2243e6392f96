"""The command line: usage errors exit 2 with a clear message, catalogue commands, no torch import."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ddp_doctor import checks as catalogue
from ddp_doctor import cli, registry

LAUNCHER_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC_", "OMPI_", "PMI_", "SLURM_", "SM_",
                     "GROUP_", "ROLE_", "MASTER_", "DDP_DOCTOR_")


def clean_env() -> dict[str, str]:
    """This environment without any launcher or ddp-doctor variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}


def ddp_doctor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_doctor", *args], capture_output=True, text=True,
                          timeout=timeout, env=clean_env())


@pytest.mark.slow
def test_help() -> None:
    p = ddp_doctor("--help")
    assert p.returncode == 0
    for word in ("preflight", "list-checks", "explain", "env", "Exit codes"):
        assert word in p.stdout


@pytest.mark.slow
def test_preflight_help() -> None:
    p = ddp_doctor("preflight", "--help")
    assert p.returncode == 0
    for opt in ("--nproc-per-node", "--report", "--timeout", "--json", "--select", "--skip"):
        assert opt in p.stdout


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert "ddp-doctor 0.1.0" in capsys.readouterr().out


@pytest.mark.slow
def test_importing_cli_does_not_import_torch() -> None:
    code = ("import sys, ddp_doctor.cli; "
            "p = ddp_doctor.cli.build_parser(); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env())
    assert p.returncode == 0, p.stderr


@pytest.mark.slow
def test_catalogue_commands_do_not_import_torch() -> None:
    code = ("import sys, io, contextlib, ddp_doctor.cli as c\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert c.main(['list-checks']) == 0\n"
            "    assert c.main(['explain', 'DDP320']) == 0\n"
            "assert 'torch' not in sys.modules\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env())
    assert p.returncode == 0, p.stderr


def test_list_checks_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list-checks"]) == 0
    out = capsys.readouterr().out
    for cid in catalogue.load_catalogue():
        assert cid in out
    line = next(x for x in out.splitlines() if x.startswith("DDP320"))
    assert "error" in line and "network" in line and "Ranks missing at rendezvous" in line


def test_list_checks_text_has_a_legend_and_a_header(capsys: pytest.CaptureFixture[str]) -> None:
    """The first line explains the "runs" column (every stage), the second names the columns, and
    every column of a row starts where its header does."""
    assert cli.main(["list-checks"]) == 0
    legend, header, *rows = capsys.readouterr().out.splitlines()
    assert legend.startswith("runs: ")
    for stage in registry.STAGES:
        assert re.search(rf"\b{stage} (/ \w+ )?=", legend) or f"/ {stage} =" in legend, (stage, legend)
    assert header.split() == ["ID", "severity", "category", "runs", "title"]
    row = next(x for x in rows if x.startswith("DDP320"))
    entry = catalogue.get("DDP320")
    for name, value in (("severity", entry.severity), ("category", entry.category), ("runs", entry.stage),
                        ("title", entry.title)):
        assert row.index(value) == header.index(name), (name, header, row)
    assert all(x.startswith("DDP") for x in rows)


def test_schema_prints_the_report_schema(capsys: pytest.CaptureFixture[str]) -> None:
    from ddp_doctor.report.schema import report_schema
    assert cli.main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == report_schema()


@pytest.mark.invalid_reports_expected  # bad.json, for --validate to name
def test_schema_validate(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from ddp_doctor.report.build import build_report
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(build_report(world={"launcher": "torchrun"}, ranks=[], findings=[])))
    bad.write_text(json.dumps({"schema": "ddp-doctor.report", "schema_version": 1}))
    assert cli.main(["schema", "--validate", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: valid\n"
    assert cli.main(["schema", "--validate", str(good), str(bad)]) == 3
    out = capsys.readouterr().out
    assert f"{bad}: 8 problem(s)" in out and "  $: required key 'status' is missing" in out
    assert cli.main(["schema", "--validate", str(tmp_path / "none.json")]) == 2
    assert "cannot read the report" in capsys.readouterr().err


@pytest.mark.slow
def test_schema_command_does_not_import_torch() -> None:
    code = ("import sys, io, contextlib, ddp_doctor.cli as c\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert c.main(['schema']) == 0\n"
            "assert 'torch' not in sys.modules\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env())
    assert p.returncode == 0, p.stderr


@pytest.mark.slow
def test_list_checks_json() -> None:
    p = ddp_doctor("list-checks", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    ids = [c["id"] for c in data["checks"]]
    assert ids == sorted(ids)
    assert set(ids) == set(catalogue.load_catalogue())
    assert isinstance(data["retired"], dict)
    for c in data["checks"]:
        assert c["what"] and c["why"] and c["fix"]


@pytest.mark.parametrize("arg", ["DDP320", "ddp320", " DDP320 "])
def test_explain(capsys: pytest.CaptureFixture[str], arg: str) -> None:
    assert cli.main(["explain", arg]) == 0
    out = capsys.readouterr().out
    assert out.startswith("DDP320: Ranks missing at rendezvous")
    entry = catalogue.get("DDP320")
    for name in ("What", "Why", "Fix"):
        assert f"{name}: {entry.sections[name]}" in out
    # the check's row in docs/checks.md, by an anchor the table has
    assert "Docs: docs/checks.md#ddp320 " in out
    from pathlib import Path
    assert '<a id="ddp320"></a>DDP320 |' in (Path(__file__).resolve().parents[2] / "docs" / "checks.md").read_text()


def test_explain_shows_every_severity_and_when(capsys: pytest.CaptureFixture[str]) -> None:
    """An ID whose severity depends on the situation shows them all, default first, and its Severity
    section; a one-severity ID shows just that one."""
    entry = catalogue.get("DDP302")
    assert entry.severities == ("error", "warning")
    assert cli.main(["explain", "DDP302"]) == 0
    out = capsys.readouterr().out
    assert "severity: warning/error " in out
    assert f"Severity: {entry.sections['Severity']}" in out
    assert cli.main(["explain", "DDP320"]) == 0
    out = capsys.readouterr().out
    assert "severity: error " in out and "Severity:" not in out


@pytest.mark.slow
def test_explain_subprocess() -> None:
    p = ddp_doctor("explain", "DDP320")
    assert p.returncode == 0
    assert "What:" in p.stdout and "Why:" in p.stdout and "Fix:" in p.stdout


@pytest.mark.slow
def test_explain_unknown_id() -> None:
    p = ddp_doctor("explain", "DDP9999")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    assert "no check 'DDP9999'" in p.stderr
    assert "list-checks" in p.stderr


def test_explain_retired_id(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.RETIRED, "DDP998", "merged into DDP320")
    assert cli.main(["explain", "DDP998"]) == 0
    assert "retired" in capsys.readouterr().out


@pytest.mark.slow
def test_preflight_unknown_selector_exits_2() -> None:
    p = ddp_doctor("preflight", "--select", "nonsense", "--timeout", "5")
    assert p.returncode == 2
    assert "nonsense" in p.stderr and "Traceback" not in p.stderr


def test_preflight_unknown_skip_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["preflight", "--skip", "DDP101,bogus"]) == 2
    err = capsys.readouterr().err
    assert "--select/--skip: bogus match no check" in err  # only the unknown one is named


@pytest.mark.slow
@pytest.mark.parametrize("value", ["-1", "0", "abc"])
def test_preflight_bad_timeout_exits_2(value: str) -> None:
    p = ddp_doctor("preflight", f"--timeout={value}")
    assert p.returncode == 2
    assert "--timeout" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_preflight_timeout_separate_negative_value() -> None:
    p = ddp_doctor("preflight", "--timeout", "-1")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr


def test_preflight_bad_nproc_exits_2() -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["preflight", "--nproc-per-node", "0"])
    assert e.value.code == 2


@pytest.mark.slow
def test_env_json() -> None:
    p = ddp_doctor("env", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert isinstance(data, dict) and data


@pytest.mark.slow
def test_env_text() -> None:
    p = ddp_doctor("env")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()


def test_an_option_a_command_does_not_take_is_that_commands_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, prog in ((["preflight", "--bogus"], "ddp-doctor preflight"), (["analyze", "x", "--nope"],
                                                                            "ddp-doctor analyze"),
                       (["--bogus"], "ddp-doctor")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"usage: {prog} ") and f"{prog}: error: unrecognized" in err, err


def test_the_commands_that_record_history_take_its_options() -> None:
    for command in ("preflight", "bench-comm"):
        args = cli.build_parser().parse_args([command, "--no-history", "--history", "h.sqlite"])
        assert args.no_history is True and args.history == "h.sqlite"
