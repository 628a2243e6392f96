"""Bad input is a usage error or a finding, never a traceback: each case on the real
command (`python -m ddp_doctor ...` in a process of its own), asserting the exit code, no traceback,
the one line that says what was wrong, and output of bounded size.

- `run --nproc-per-node 0|abc|-3|gpu-without-CUDA`: exit 2, one line naming the option, the value and
  what torchrun takes (torch.distributed.run's own rule), before any launcher starts;
- `preflight --timeout 1e308` (and run's --timeout / --hang-timeout): exit 2, one rule for a bound
  (ddp_doctor.time_limit.usable_timeout: above 0, finite, at most one day);
- SM_HOSTS or resourceconfig.json nested 60,000 deep: a DDP201 finding naming the source, no
  internal error;
- SM_HOSTS of 8,000 hosts: judged on a bounded sample (the DDP300 finding says how many names were
  looked up), host lists in messages cut to their first names and "+K more";
- sagemaker-check --config in UTF-16 (what Windows PowerShell writes) is read; a file that does not
  decode or a nested --distribution is exit 2 with one line naming it.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers.procs import DDP, Result, assert_clean_output, clean_env, free_port, run

from ddp_doctor.time_limit import MAX_TIMEOUT_S, usable_timeout

DEEP = "[" * 60000 + "]" * 60000  # json.loads: RecursionError; an environment value still fits (128 KiB)
USAGE_OUTPUT_MAX = 2000  # characters a usage error may print (argparse's usage lines included)


def ddp(args: list[str], cwd: Path, timeout: float = 60.0, **env: str) -> Result:
    return run([*DDP, *args], clean_env(**env), str(cwd), timeout=timeout)


def usage_error(res: Result, *needles: str) -> str:
    """The one `error:` line of a usage error, after checking the exit code, that no traceback
    reached the user and that the output is small."""
    assert res.rc == 2, res.output
    assert_clean_output(res)
    assert len(res.output) < USAGE_OUTPUT_MAX, res.output
    lines = [line for line in res.stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def one_rank(**env: str) -> dict[str, str]:
    """The variables of a one-rank launch: the preflight acts as that rank, no local launcher."""
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **env}


def findings(report: Path, cid: str) -> list[dict]:
    with open(report, encoding="utf-8") as f:
        return [x for x in json.load(f)["findings"] if x["id"] == cid]


# ------------------------------------------------------------------ run --nproc-per-node

@pytest.mark.slow
@pytest.mark.parametrize("value,why", [("0", "no process would start"), ("-3", "no process would start"),
                                       ("abc", "no such device type")])
def test_run_nproc_per_node_that_torchrun_cannot_take(tmp_path: Path, value: str, why: str) -> None:
    (tmp_path / "script.py").write_text("print('the script ran')\n")
    res = ddp(["run", "--nproc-per-node", value, "script.py"], tmp_path)
    line = usage_error(res, f"--nproc-per-node {value!r}", why, "torchrun takes a whole number of processes")
    assert line.startswith("ddp-doctor run: error: ")
    assert "the script ran" not in res.output and "DDP003" not in res.output  # no launcher was started


@pytest.mark.slow
def test_run_nproc_per_node_gpu_without_cuda_is_torchs_answer(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: gpu is a good value")
    (tmp_path / "script.py").write_text("print('the script ran')\n")
    usage_error(ddp(["run", "--nproc_per_node=gpu", "script.py"], tmp_path), "'gpu'", "Cuda is not available")


# ------------------------------------------------------------------ --timeout / --hang-timeout

@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["preflight", "--timeout", "1e308"], "'1e308' is more than 86400 seconds"),
    (["preflight", "--timeout", "nan"], "'nan' is no bound"),
    (["preflight", "--timeout", "0"], "must be more than 0 seconds"),
    (["bench-comm", "--timeout", "inf"], "'inf' is no bound"),
    (["run", "--timeout", "1e308", "script.py"], "'1e308' is more than 86400 seconds"),
    (["run", "--hang-timeout", "1e308", "script.py"], "'1e308' is more than 86400 seconds"),
    (["run", "--hang-timeout", "-1", "script.py"], "must be more than 0 seconds"),
])
def test_timeout_no_bound_can_use(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "script.py").write_text("print('the script ran')\n")
    option = next(a for a in args if a.startswith("--"))
    usage_error(ddp(args, tmp_path), f"argument {option}: ", needle, "at most 86400 (one day)")


def test_one_rule_for_a_bound() -> None:
    assert usable_timeout("60") == 60.0 and usable_timeout(" 0.5 ") == 0.5
    assert usable_timeout(str(MAX_TIMEOUT_S)) == MAX_TIMEOUT_S
    for bad in ("0", "-3", "inf", "-inf", "nan", "1e308", "86400.5", "abc", "", "0x10"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            usable_timeout(bad)


def test_run_and_the_cli_share_the_rule() -> None:
    import argparse

    from ddp_doctor.cli.options import timeout_seconds
    from ddp_doctor.cli.run_argv import RunUsageError, doctor_parser
    for bad in ("1e308", "nan", "0"):
        with pytest.raises(argparse.ArgumentTypeError) as cli_error:
            timeout_seconds(bad)
        with pytest.raises(RunUsageError) as run_error:
            doctor_parser().parse_args(["--timeout", bad])
        assert str(cli_error.value) in str(run_error.value)


@pytest.mark.parametrize("text", ["0", "-1", "inf", "nan", "1e308", "abc", "5"])
def test_run_and_the_cli_accept_the_same_bounds(text: str) -> None:
    """The same value through both real parsers (preflight's and run's own): accepted by both with
    the same number, or refused by both; only 5 is a bound."""
    import argparse

    from ddp_doctor.cli.preflight import add_parser
    from ddp_doctor.cli.run_argv import RunUsageError, doctor_parser

    class Refusing(argparse.ArgumentParser):
        def error(self, message: str):  # type: ignore[override]
            raise RunUsageError(message)

    cli = Refusing(prog="ddp-doctor preflight")
    add_parser(cli)
    answers = []
    for parse, option in ((cli.parse_args, "--timeout"), (doctor_parser().parse_args, "--timeout"),
                          (doctor_parser().parse_args, "--hang-timeout")):
        try:
            ns = parse([f"{option}={text}"])
            answers.append(getattr(ns, option[2:].replace("-", "_")))
        except RunUsageError:
            answers.append("refused")
    assert answers == [5.0] * 3 if text == "5" else answers == ["refused"] * 3, answers


# ------------------------------------------------------------------ JSON nested 60,000 deep

@pytest.mark.slow
def test_sm_hosts_nested_60000_deep_is_a_finding(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    res = ddp(["preflight", "--select", "DDP2", "--report", str(report)], tmp_path,
              **one_rank(SM_HOSTS=DEEP, SM_CURRENT_HOST="algo-1"))
    assert res.rc == 3, res.output
    assert_clean_output(res)
    assert "internal error" not in res.output and "RecursionError" not in res.output
    assert len(res.output) < 10_000, len(res.output)
    (f,) = [f for f in findings(report, "DDP201") if f["evidence"]["source"] == "SM_HOSTS"]
    assert f["severity"] == "error" and "nested 60000 levels deep" in f["message"]
    assert len(f["message"]) < 1000


@pytest.mark.slow
def test_resourceconfig_nested_60000_deep_is_a_finding(tmp_path: Path) -> None:
    cfg = tmp_path / "opt-ml" / "input" / "config"
    cfg.mkdir(parents=True)
    (cfg / "resourceconfig.json").write_text('{"current_host": "algo-1", "hosts": ' + DEEP + "}")
    report = tmp_path / "report.json"
    res = ddp(["preflight", "--select", "DDP2", "--report", str(report)], tmp_path,
              **one_rank(DDP_DOCTOR_SM_ROOT=str(tmp_path / "opt-ml")))
    assert res.rc == 3, res.output
    assert_clean_output(res)
    assert "internal error" not in res.output and len(res.output) < 10_000
    (f,) = [f for f in findings(report, "DDP201") if f["evidence"]["source"] == "resourceconfig.json"]
    assert "resourceconfig.json is unreadable: nested 60001 levels deep" in f["message"]


# ------------------------------------------------------------------ 8,000 hosts

@pytest.mark.slow
def test_sm_hosts_of_8000_hosts_is_judged_on_a_sample(tmp_path: Path) -> None:
    hosts = [f"algo-{i}" for i in range(1, 8001)]
    report = tmp_path / "report.json"
    # the helper's bound (120 s) is the bound here: before, the launch was still running at 240 s
    res = ddp(["preflight", "--report", str(report)], tmp_path, timeout=120.0,
              **one_rank(SM_HOSTS=json.dumps(hosts), SM_CURRENT_HOST="algo-1"))
    assert res.rc == 3, res.output
    assert_clean_output(res)
    assert len(res.output) < 20_000, len(res.output)  # was 1.5 MB
    assert os.path.getsize(report) < 200_000
    assert "+7992 more]" in res.output  # host lists: the first names and how many more
    (f,) = findings(report, "DDP300")  # algo-N resolve nowhere here, or within the bound
    assert "a sample of 64 of the job's 8000 host names" in f["message"]
    assert f["evidence"]["checked"] == 64 and f["evidence"]["names"] == 8000
    assert len(f["message"]) < 3000
    assert not findings(report, "DDP002") and not findings(report, "DDP315")


# ------------------------------------------------------------------ sagemaker-check --config / --distribution

def offline_aws(tmp_path: Path) -> dict[str, str]:
    """AWS settings whose calls fail at once (nothing listens at the endpoint), never reaching AWS."""
    return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_MAX_ATTEMPTS": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be-bom", "utf-8-sig"])
def test_sagemaker_check_reads_a_utf16_config(tmp_path: Path, encoding: str) -> None:
    pytest.importorskip("boto3")
    pytest.importorskip("yaml")
    text = "instance_type: ml.p4d.24xlarge\ninstance_count: two\n"
    data = b"\xfe\xff" + text.encode("utf-16-be") if encoding == "utf-16-be-bom" else text.encode(encoding)
    (tmp_path / "job.yaml").write_bytes(data)
    # read and parsed: its own mistake is what is reported (no AWS call is made for a usage error)
    res = ddp(["sagemaker-check", "--config", "job.yaml"], tmp_path, **offline_aws(tmp_path))
    usage_error(res, "--config job.yaml", "instance_count must be a whole number, not 'two'")


@pytest.mark.slow
def test_sagemaker_check_runs_with_a_utf16_config(tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    (tmp_path / "job.json").write_bytes(json.dumps({"instance_type": "ml.p4d.24xlarge"}).encode("utf-16"))
    res = ddp(["sagemaker-check", "--config", "job.json", "--json"], tmp_path, **offline_aws(tmp_path))
    assert res.rc in (0, 3), res.output  # the checks ran (AWS unreachable: DDP901)
    assert_clean_output(res)
    assert json.loads(res.stdout)["status"] in ("pass", "warn", "fail")


@pytest.mark.slow
@pytest.mark.parametrize("data,needle", [
    (b"\xff\xfe" + "instance_count: 2\n".encode("utf-16-le")[:-1], "not valid UTF-16 LE text"),
    ("instance_count: 2\n".encode("utf-16-le"), "holds NUL bytes and has no byte-order mark"),
    ("role: café\n".encode("latin-1"), "not valid UTF-8 text"),
])
def test_sagemaker_check_config_that_does_not_decode(tmp_path: Path, data: bytes, needle: str) -> None:
    pytest.importorskip("boto3")
    (tmp_path / "job.yaml").write_bytes(data)
    res = ddp(["sagemaker-check", "--config", "job.yaml"], tmp_path, **offline_aws(tmp_path))
    usage_error(res, "cannot read --config job.yaml", needle)


@pytest.mark.slow
def test_sagemaker_check_distribution_nested_60000_deep(tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    res = ddp(["sagemaker-check", "--instance-type", "ml.p4d.24xlarge", "--distribution", DEEP], tmp_path,
              **offline_aws(tmp_path))
    usage_error(res, "distribution is nested 60000 levels deep")


@pytest.mark.slow
def test_sagemaker_check_config_nested_60000_deep(tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    (tmp_path / "job.json").write_text('{"distribution": ' + DEEP + "}")
    res = ddp(["sagemaker-check", "--config", "job.json"], tmp_path, **offline_aws(tmp_path))
    usage_error(res, "--config job.json is nested 60001 levels deep")
