"""What a run leaves in its run directory is private and redacted: every
directory 0700, every file 0600, and no file holds the secrets rank 1's exception quoted. Real
processes: under torchrun (the run directory in $TMPDIR, by job id) and under ddp-doctor's own
launch with --run-dir (kept). The two launches start together; each test reads its own."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPT = str(Path(__file__).resolve().parents[1] / "run_scripts" / "rank1_raises_with_secrets.py")
SECRETS = ("hunter2", "hf_abcdefghijklmnopqrstuvwxyz0123456")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "ddp_doctor", "run", "--skip", "communication", "--report", "r.json", SCRIPT]
OWN = [*DDP, "run", "--nproc-per-node", "2", "--skip", "communication", "--run-dir", "D", "--report", "r.json",
       "--trace", "t.json", SCRIPT]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("private")
    launches = {}
    for name, cmd in (("torchrun", TORCHRUN), ("own", OWN)):
        (base / name / "tmp").mkdir(parents=True)
        env = clean_env(TMPDIR=str(base / name / "tmp"))
        launches[name] = Launch(cmd, env, str(base / name), 180)
    return {"base": base, "results": run_all(launches, at_once=2)}


def _assert_private_and_redacted(top: Path) -> int:
    """Every directory under `top` (itself included) 0700, every file 0600, no secret in any;
    returns how many files were read."""
    files = 0
    for root, _dirs, names in os.walk(top):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700, f"{root}: {oct(os.stat(root).st_mode)}"
        for name in names:
            path = Path(root) / name
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, f"{path}: {oct(os.lstat(path).st_mode)}"
            data = path.read_bytes()
            for secret in SECRETS:
                assert secret.encode() not in data, f"{secret} in {path}"
            files += 1
    return files


def _check_report(where: Path) -> None:
    rep = load_json(str(where / "r.json"))
    assert rep["status"] == "fail" and rep["root_cause"]["ranks"] == [1], rep
    assert "password=***" in rep["root_cause"]["message"]
    text = (where / "r.json").read_text()
    assert not any(secret in text for secret in SECRETS)


def test_under_torchrun_the_run_directory_in_tmpdir_is_private_and_redacted(runs):
    res = result_of(runs["results"], "torchrun")
    assert res.rc != 0, res.output
    where = runs["base"] / "torchrun"
    run_dirs = sorted((where / "tmp").glob("ddp-doctor-run-*"))
    assert len(run_dirs) == 1, list((where / "tmp").iterdir())
    assert _assert_private_and_redacted(run_dirs[0]) >= 4, sorted(os.listdir(run_dirs[0]))
    outcome = load_json(str(run_dirs[0] / "rank-1.json"))
    assert outcome["exception"]["type"] == "RuntimeError"
    assert "password=***" in outcome["exception"]["message"] and "password=***" in outcome["exception"]["traceback"]
    _check_report(where)


def test_with_run_dir_the_kept_run_directory_is_private_and_redacted(runs):
    res = result_of(runs["results"], "own")
    assert res.rc != 0, res.output
    where = runs["base"] / "own"
    kept = where / "D"
    run_dirs = sorted(kept.glob("ddp-doctor-run-*"))
    assert len(run_dirs) == 1, list(kept.iterdir())
    assert (run_dirs[0] / "preflight").is_dir() and (run_dirs[0] / "trace.json").is_file(), os.listdir(run_dirs[0])
    assert _assert_private_and_redacted(kept) >= 4  # D itself (made by ddp-doctor), preflight/ too
    _check_report(where)
