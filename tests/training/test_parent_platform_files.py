"""The platform's files of a failed job written by the parent of `ddp-doctor run`: torchelastic's
error file, and SageMaker's failure file only in a SageMaker container, decided from the environment
without importing torch (the parent never loads it: ~1.5 s of CPU before the verdict)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, clean_env

CODE = """
import json, sys
from ddp_doctor.training.run.parent_report import platform_files
platform_files(json.loads(sys.argv[1]))
print(json.dumps({"torch": "torch" in sys.modules}))
"""
# a real failed job's report: the verdict on a rank late to init, judged again from its evidence
EVIDENCE = Path(__file__).resolve().parents[1] / "corpus" / "late_init" / "loads.evidence.json"


@pytest.fixture(scope="module")
def failed(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("failed") / "r.json"
    subprocess.run([*DDP, "analyze", str(EVIDENCE), "--report", str(path)], env=clean_env(),
                   capture_output=True, text=True, timeout=60)
    report = json.loads(path.read_text())
    assert report["status"] == "fail" and report["root_cause"]["id"] == "DDP879", report["root_cause"]
    return report


def _platform_files(tmp_path, report: dict, **env: str) -> dict:
    res = subprocess.run([sys.executable, "-c", CODE, json.dumps(report)],
                         env=clean_env(TORCHELASTIC_ERROR_FILE=str(tmp_path / "error.json"),
                                       DDP_DOCTOR_SM_ROOT=str(tmp_path / "opt_ml"), **env),
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def test_on_sagemaker_the_failure_file_names_the_root_cause_without_torch(tmp_path, failed):
    got = _platform_files(tmp_path, failed, SM_CURRENT_HOST="algo-1", SM_HOSTS='["algo-1"]')
    assert got == {"torch": False}
    failure = (tmp_path / "opt_ml" / "output" / "failure").read_text()
    assert failure.startswith("ddp-doctor: fail") and "DDP879" in failure, failure
    assert "DDP879" in (tmp_path / "error.json").read_text()


def test_elsewhere_only_torchelastics_error_file_and_none_for_a_report_that_passed(tmp_path, failed):
    got = _platform_files(tmp_path, failed)
    assert got == {"torch": False}
    assert (tmp_path / "error.json").is_file() and not (tmp_path / "opt_ml").exists()
    (tmp_path / "error.json").unlink()
    _platform_files(tmp_path, {**failed, "status": "pass"}, SM_CURRENT_HOST="algo-1")
    assert not (tmp_path / "error.json").exists() and not (tmp_path / "opt_ml").exists()
