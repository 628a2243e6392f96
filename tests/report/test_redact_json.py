"""Secrets inside JSON environment values (SM_USER_ARGS, SM_HPS, SM_TRAINING_ENV, SM_HP_*, any
variable set to a JSON list or object) and argument lists, by key name and by value shape.
Planted values: shaped like the real thing, never real."""
from __future__ import annotations

import json

import pytest

from ddp_doctor.report.redact import MASK, is_secret_name, redact_env, redact_obj, redact_text

AWS_KEY_ID = "AKIAABCDEFGHIJKLMNOP"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTEDKEY"
HF = "hf_abcdefghijklmnopqrstuvwxyz0123456"
WANDB = "0123456789abcdef0123456789abcdef01234567"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
URL = "https://alice:s3cretpass@git.example.com/repo.git"
assert len(AWS_SECRET) == 40 and len(WANDB) == 40

# (what the secret is, the value that must not survive)
SHAPES = [
    ("aws key id", AWS_KEY_ID), ("hf token", HF), ("wandb key", WANDB), ("jwt", JWT),
    ("url password", "s3cretpass"),
]


def _one(name: str, value: str) -> str:
    return redact_env({name: value}, env={})[name]


def test_sm_user_args_json_list_masks_values_after_secret_flags_and_keeps_the_rest() -> None:
    out = _one("SM_USER_ARGS", '["--password","hunter2","--api_key","abc","--lr","0.1","--epochs","3"]')
    assert json.loads(out) == ["--password", MASK, "--api_key", MASK, "--lr", "0.1", "--epochs", "3"]


@pytest.mark.parametrize("flag", ["--password", "--passwd", "--secret", "--token", "--api_key", "--apikey",
                                  "--access_key", "--private-key", "--credentials", "--auth", "-api-key",
                                  "--hub_token", "--db_passphrase"])
def test_every_secret_named_flag_masks_its_value_in_both_forms(flag: str) -> None:
    out = json.loads(_one("SM_USER_ARGS", json.dumps([flag, "hunter2", f"{flag}=hunter3", "--seed", "7"])))
    assert out == [flag, MASK, f"{flag}={MASK}", "--seed", "7"]


def test_a_flag_after_a_secret_flag_is_not_taken_for_its_value() -> None:
    out = json.loads(_one("SM_USER_ARGS", '["--use_auth", "--lr", "0.1", "--token"]'))
    assert out == ["--use_auth", "--lr", "0.1", "--token"]  # a boolean flag, then another flag


def test_counts_named_like_tokens_stay_readable_passwords_do_not() -> None:
    out = json.loads(_one("SM_USER_ARGS", '["--max_tokens", "512", "--password", "1234", "--max_tokens=64"]'))
    assert out == ["--max_tokens", "512", "--password", MASK, "--max_tokens=64"]
    hps = json.loads(_one("SM_HPS", '{"max_new_tokens": 128, "password": 123456, "use_auth_token": true}'))
    assert hps == {"max_new_tokens": 128, "password": MASK, "use_auth_token": True}


def test_sm_hps_masks_by_key_name_and_value_shape() -> None:
    hps = {"password": "hunter2", "learning_rate": 0.001, "model": "bert-base", "db_url": URL,
           "note": f"push with {HF}", "wandb_project": "demo", "report_to": WANDB, "header": f"Bearer {JWT}"}
    out = json.loads(_one("SM_HPS", json.dumps(hps)))
    assert out["password"] == MASK
    assert out["learning_rate"] == 0.001 and out["model"] == "bert-base" and out["wandb_project"] == "demo"
    assert out["db_url"] == "https://alice:***@git.example.com/repo.git"
    assert out["note"] == f"push with {MASK}" and out["report_to"] == MASK and out["header"] == f"Bearer {MASK}"


def test_sm_training_env_nested_hyperparameters_and_user_args() -> None:
    training_env = {
        "job_name": "train-1", "current_host": "algo-1", "hosts": ["algo-1", "algo-2"],
        "hyperparameters": {"epochs": 3, "hf_token": HF, "api-key": "abc", "optimizer": "adamw"},
        "user_args": ["--epochs", "3", "--secret", "s3cr3t", f"--wandb_api_key={WANDB}"],
        "additional_framework_parameters": {"sagemaker_distributed_dataparallel_enabled": False},
        "creds": {"aws_access_key_id": AWS_KEY_ID, "aws_secret_access_key": AWS_SECRET},
    }
    raw = json.dumps(training_env)
    out = _one("SM_TRAINING_ENV", raw)
    for secret in (HF, "s3cr3t", WANDB, AWS_KEY_ID, AWS_SECRET, '"abc"'):
        assert secret not in out, secret
    parsed = json.loads(out)  # still JSON
    assert parsed["hyperparameters"] == {"epochs": 3, "hf_token": MASK, "api-key": MASK, "optimizer": "adamw"}
    assert parsed["user_args"] == ["--epochs", "3", "--secret", MASK, f"--wandb_api_key={MASK}"]
    assert parsed["hosts"] == ["algo-1", "algo-2"] and parsed["job_name"] == "train-1"
    assert parsed["additional_framework_parameters"] == training_env["additional_framework_parameters"]


@pytest.mark.parametrize("what, secret", SHAPES)
def test_each_value_shape_in_sm_hp_and_in_a_generic_json_value(what: str, secret: str) -> None:
    value = URL if what == "url password" else secret
    for name, text in (("SM_HP_NOTE", f"using {value} now"), ("SM_HP_CONFIG", json.dumps({"x": value})),
                       ("MY_TOOL_CONFIG", json.dumps([{"endpoint": f"at {value}"}, 3]))):
        out = _one(name, text)
        assert secret not in out and MASK in out, (name, out)


def test_an_aws_secret_next_to_its_key_id_is_masked_in_text_lists_and_objects() -> None:
    for text in (f"{AWS_KEY_ID} {AWS_SECRET}", f"{AWS_KEY_ID}:{AWS_SECRET}", f"{AWS_SECRET},{AWS_KEY_ID}"):
        out = redact_text(text, env={})
        assert AWS_SECRET not in out and AWS_KEY_ID not in out, out
    for value in ([AWS_KEY_ID, AWS_SECRET], {"id": AWS_KEY_ID, "s": AWS_SECRET}):
        out = _one("SM_HP_CREDS", json.dumps(value))
        assert AWS_SECRET not in out and AWS_KEY_ID not in out, out
    # without a key id beside it, a 40-character string is only a 40-character string
    assert _one("SM_HP_IDS", json.dumps(["run", AWS_SECRET])) == json.dumps(["run", AWS_SECRET])


def test_secret_named_hp_variables_are_masked_whole() -> None:
    out = redact_env({"SM_HP_PASSWORD": "hunter2", "SM_HP_API_KEY": "abc", "SM_HP_HF_TOKEN": HF,
                      "SM_HP_EPOCHS": "3"}, env={})
    assert out == {"SM_HP_PASSWORD": MASK, "SM_HP_API_KEY": MASK, "SM_HP_HF_TOKEN": MASK, "SM_HP_EPOCHS": "3"}


@pytest.mark.parametrize("value", [
    '["--epochs","3","--model","bert"]', '{"epochs": 3, "model": "bert"}', '[1, 2, 3]', "[not json",
    '{"hosts": ["algo-1"], "current_host": "algo-1"}', "algo-1,algo-2",
])
def test_non_secret_values_come_back_unchanged(value: str) -> None:
    assert _one("SM_SOMETHING", value) == value  # not even re-spaced


def test_argument_lists_written_out_as_text_are_redacted_too() -> None:
    for text in ('argv ["--password", "hunter2"]', "sys.argv ['train.py', '--api_key', 'hunter2']",
                 '{"args": "[\\"--token\\", \\"hunter2\\"]"}', "--password=hunter2", "--password hunter2"):
        out = redact_text(text, env={})
        assert "hunter2" not in out and MASK in out, out
    assert redact_text('["--use_auth", "--lr", "0.1"]', env={}) == '["--use_auth", "--lr", "0.1"]'


def test_json_inside_a_report_string_is_redacted_structurally() -> None:
    rep = {"findings": [{"evidence": {"env": {"SM_USER_ARGS": '["--password","hunter2"]'},
                                      "argv": ["train.py", "--hf-token", HF, "--lr", "3"]}}]}
    out = redact_obj(rep, env={})
    ev = out["findings"][0]["evidence"]
    assert json.loads(ev["env"]["SM_USER_ARGS"]) == ["--password", MASK]
    assert ev["argv"] == ["train.py", "--hf-token", MASK, "--lr", "3"]
    assert redact_obj(out, env={}) == out  # redacting twice changes nothing


@pytest.mark.parametrize("name", ["access_key", "AUTH", "http_auth", "basic-auth", "db_passphrase", "--auth"])
def test_more_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["author", "AuthorizationError", "authority", "OAUTHLIB_INSECURE_TRANSPORT"])
def test_names_that_only_contain_auth_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


def test_ordinary_report_text_stays() -> None:
    for text in ("AuthorizationError: User is not authorized to call sagemaker:CreateTrainingJob",
                 "sha256 " + "a" * 64, "commit 0123456", "max_tokens=512"):
        assert redact_text(text, env={}) == text
