"""`ddp-doctor env` is meant to be pasted into a public issue: with secrets in SM_USER_ARGS,
SM_HPS, SM_TRAINING_ENV, SM_HP_* and a generic JSON variable, neither the text nor the JSON
output holds one of them, and the harmless values stay readable. A real
subprocess, as a user runs it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.context import NO_SM_ROOT
from helpers.procs import clean_env, run

pytestmark = pytest.mark.slow  # each test runs the CLI in a process of its own

AWS_KEY_ID = "AKIAABCDEFGHIJKLMNOP"
AWS_SECRET = "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"
HF = "hf_abcdefghijklmnopqrstuvwxyz0123456"
WANDB = "0123456789abcdef0123456789abcdef01234567"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
SECRETS = ("hunter2", "abc123", "s3cr3tpw", "pa55word", AWS_KEY_ID, AWS_SECRET, HF, WANDB, JWT, "jwtsig")

ENV = {
    "SM_USER_ARGS": '["--password","hunter2","--api_key","abc123","--epochs","3"]',
    "SM_HPS": json.dumps({"epochs": 3, "db_password": "s3cr3tpw", "hub_token": HF, "model": "bert-base"}),
    "SM_TRAINING_ENV": json.dumps({
        "job_name": "train-1", "hyperparameters": {"epochs": 3, "wandb_key": WANDB},
        "user_args": ["--password=hunter2", "--lr", "0.1"], "module_dir": "https://u:pa55word@example.com/x"}),
    "SM_HP_CREDS": json.dumps([AWS_KEY_ID, AWS_SECRET]),
    "SM_HP_AUTH_HEADER": f"Bearer {JWT}",
    "SM_HP_NOTE": f"header Bearer {JWT}",
    "SM_HP_EPOCHS": "3",
    "DDP_DOCTOR_EXTRA": json.dumps({"service": {"token": "jwtsig", "url": "https://example.com"}}),
}


def _env_output(tmp_path: Path, *args: str) -> str:
    env = clean_env(DDP_DOCTOR_SM_ROOT=NO_SM_ROOT, **ENV)
    res = run([sys.executable, "-m", "ddp_doctor", "env", *args], env, str(tmp_path), timeout=120)
    assert res.rc == 0, res.output
    return res.stdout


def test_env_prints_no_secret_and_keeps_the_harmless_values(tmp_path: Path) -> None:
    text = _env_output(tmp_path)
    for secret in SECRETS:
        assert secret not in text, secret
    lines = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in text.splitlines() if "=" in line}
    assert json.loads(lines["SM_USER_ARGS"]) == ["--password", "***", "--api_key", "***", "--epochs", "3"]
    hps = json.loads(lines["SM_HPS"])
    assert hps == {"epochs": 3, "db_password": "***", "hub_token": "***", "model": "bert-base"}
    assert lines["SM_HP_EPOCHS"] == "3" and lines["SM_HP_AUTH_HEADER"] == "***"
    assert '"job_name": "train-1"' in lines["SM_TRAINING_ENV"] and '"--lr", "0.1"' in lines["SM_TRAINING_ENV"]


def test_env_json_prints_no_secret(tmp_path: Path) -> None:
    data = json.loads(_env_output(tmp_path, "--json"))
    text = json.dumps(data)
    for secret in SECRETS:
        assert secret not in text, secret
    assert json.loads(data["env"]["DDP_DOCTOR_EXTRA"]) == {"service": {"token": "***", "url": "https://example.com"}}
