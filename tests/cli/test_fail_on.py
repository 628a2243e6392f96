"""--fail-on and DDP_DOCTOR_FAIL_ON on the real command: a bad value is one usage
line (exit 2) before anything starts, naming the option or the variable; `preflight --fail-on warning`
exits 3 on a report whose worst finding is a warning (planted: DDP603, a free-disk threshold no disk
meets), self-launched and as a rank under a launcher (the variable). The rule itself:
tests/test_exit_codes.py; `run` on real ranks: tests/training/test_probes_e2e.py."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import (
    DDP,
    Launch,
    Result,
    assert_clean_output,
    clean_env,
    free_port,
    load_json,
    result_of,
    run,
    run_all,
)

from ddp_doctor.exit_codes import FAIL_ON_ENV

# the one warning of these preflights: less free disk where the job writes than a petabyte-sized threshold
WARNS = ["--select", "DDP603", "--output-dir", ".", "--threshold", "disk_min_free_gib=1e9", "--timeout", "20"]


def usage_line(res: Result) -> str:
    """The one `error:` line of a usage error, after checking the exit code and that no traceback came."""
    assert res.rc == 2, res.output
    assert_clean_output(res)
    lines = [line for line in res.stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("args,env,needle", [
    (["run", "--fail-on", "warn", "script.py"], {}, "argument --fail-on: invalid choice: 'warn'"),
    (["run", "--fail-on", "script.py"], {}, "no script or -m MODULE given"),  # the value took the script
    (["run", "script.py"], {FAIL_ON_ENV: "yes"}, f"{FAIL_ON_ENV}='yes' is not error or warning"),
    (["preflight", "--fail-on", "info"], {}, "argument --fail-on: invalid choice: 'info'"),
    (["preflight"], {FAIL_ON_ENV: "Warning"}, f"{FAIL_ON_ENV}='Warning' is not error or warning"),
])
def test_a_bad_value_is_one_usage_line(tmp_path: Path, args: list[str], env: dict, needle: str) -> None:
    (tmp_path / "script.py").write_text("print('the script ran')\n")
    res = run([*DDP, *args], clean_env(**env), str(tmp_path), timeout=60)
    line = usage_line(res)
    assert line.startswith(f"ddp-doctor {args[0]}: error: ") and needle in line, line
    assert "the script ran" not in res.output


@pytest.fixture(scope="module")
def preflights(tmp_path_factory):
    """Two short preflights with one warning, run together: self-launched with --fail-on warning, and
    one rank under a launcher's variables with DDP_DOCTOR_FAIL_ON=warning."""
    base = tmp_path_factory.mktemp("fail_on")
    for name in ("self_launched", "rank"):
        (base / name).mkdir()
    one_rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), FAIL_ON_ENV: "warning"}
    jobs = {
        "self_launched": Launch([*DDP, "preflight", "--nproc-per-node", "1", "--fail-on", "warning", *WARNS,
                                 "--report", str(base / "self_launched" / "r.json")],
                                clean_env(), str(base / "self_launched"), timeout=120),
        "rank": Launch([*DDP, "preflight", *WARNS, "--report", str(base / "rank" / "r.json")],
                       clean_env(**one_rank), str(base / "rank"), timeout=120),
    }
    return base, run_all(jobs, at_once=2)


@pytest.mark.slow
@pytest.mark.parametrize("name,source", [("self_launched", "--fail-on warning"),
                                         ("rank", f"{FAIL_ON_ENV}=warning")])
def test_preflight_fail_on_warning_exits_3_on_a_warning(preflights, name: str, source: str) -> None:
    base, results = preflights
    res = result_of(results, name)
    assert res.rc == 3, res.output
    rep = load_json(str(base / name / "r.json"))
    assert rep["status"] == "warn" and "DDP603" in {f["id"] for f in rep["findings"] if f["severity"] == "warning"}
    assert not [f for f in rep["findings"] if f["severity"] == "error"], rep["findings"]
    lines = [ln for ln in res.stderr.splitlines() if "exit 3 instead of 0" in ln]
    assert len(lines) == 1 and f"as {source} asks" in lines[0] and "DDP603 (warning)" in lines[0], res.stderr
    assert_clean_output(res)
