from __future__ import annotations

import json

import pytest

from ddp_doctor.report.redact import MASK, is_secret_name, redact_env, redact_obj, redact_text

# Planted values: shaped like the real thing, never real.
AWS_KEY_ID = "AKIAABCDEFGHIJKLMNOP"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTEDKEY"
assert len(AWS_SECRET) == 40
HF = "hf_PlantedTokenAbcdefghijklmnopqrstuv"
SESSION = "IQoJb3JpZ2luX2VjEPlantedSessionTokenValue=="
WANDB = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("name", [
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_ACCESS_KEY_ID", "DB_PASSWORD", "my_passwd",
    "OPENAI_APIKEY", "GOOGLE_APPLICATION_CREDENTIALS", "SSH_PRIVATE_KEY", "client_secret", "api-key",
])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["NCCL_SOCKET_IFNAME", "TOKENIZERS_PARALLELISM", "MASTER_ADDR",
                                  "SM_HOSTS", "PATH", "KEYBOARD"])
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_redact_env_masks_secret_names_and_keeps_the_rest() -> None:
    env = {"HF_TOKEN": HF, "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "WANDB_API_KEY": WANDB,
           "NCCL_SOCKET_IFNAME": "eth0", "TOKENIZERS_PARALLELISM": "false", "EMPTY_TOKEN": "",
           "NOTE": f"key {AWS_KEY_ID} here"}
    out = redact_env(env, env={})
    assert out["HF_TOKEN"] == out["AWS_SECRET_ACCESS_KEY"] == out["WANDB_API_KEY"] == MASK
    assert out["NCCL_SOCKET_IFNAME"] == "eth0"
    assert out["TOKENIZERS_PARALLELISM"] == "false"
    assert out["EMPTY_TOKEN"] == ""  # unset-ish stays visible: "is it set?" is useful
    assert out["NOTE"] == f"key {MASK} here"
    assert env["HF_TOKEN"] == HF  # the input is not modified


@pytest.mark.parametrize("text, secret", [
    (f"using key {AWS_KEY_ID} for s3", AWS_KEY_ID),
    (f"ASIA{'Q' * 16} temporary", "ASIA" + "Q" * 16),
    (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET),
    (f'{{"SecretAccessKey": "{AWS_SECRET}"}}', AWS_SECRET),
    (f"login with {HF}", HF),
    (f"-x HF_TOKEN={HF} -x NCCL_DEBUG=WARN", HF),
    (f"export WANDB_API_KEY='{WANDB}'", WANDB),
    ('{"AWS_SESSION_TOKEN": "short-tok"}', "short-tok"),
    ("python train.py --hf-token abc123xyz --lr 3", "abc123xyz"),
    ("python train.py --api_key=zz9zz9", "zz9zz9"),
    ("https://user:pa55word@example.com/repo.git", "pa55word"),
    ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop"),
])
def test_redact_text_removes_secret_shapes(text: str, secret: str) -> None:
    out = redact_text(text, env={})
    assert secret not in out
    assert MASK in out


@pytest.mark.parametrize("text", [
    "NCCL_SOCKET_IFNAME=eth0 NCCL_DEBUG=WARN", "TOKENIZERS_PARALLELISM=false",
    "https://example.com:443/path", "rank 3 failed: Connection refused (127.0.0.1:29500)",
    "torch 2.13.0 on ranks 0-7 (algo-1)", "sha256 " + "a" * 64, "",
])
def test_redact_text_leaves_ordinary_text(text: str) -> None:
    assert redact_text(text, env={}) == text


@pytest.mark.parametrize("flag", ["--password=V", "--password V", "--token V", "--token=V", "--secret=V",
                                  "--api-key V", "PASSWORD=V"])
@pytest.mark.parametrize("after", [")", "),", ");", "…),", ") listening", ",", ")]", ""])
def test_text_redacted_twice_keeps_the_mask_and_what_closes_around_it(flag: str, after: str) -> None:
    """A command line redacted once, then quoted in a message that is redacted again (the report,
    stderr): "pid 7 (python s.py --token ***), its child" stays as it is, the value never back."""
    once = redact_text("python s.py " + flag.replace("V", "hunter2secret"), env={})
    message = f"pid 7 ({once}{after} its child"
    assert "hunter2" not in once and redact_text(message, env={}) == message
    assert redact_text("--token ***abc), x", env={}) == "--token *** x"  # a value that only starts like a mask


def test_redact_text_removes_planted_env_values_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION)
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "correct horse battery")
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to redact by literal match
    try:
        raise RuntimeError(f"request failed: headers={{'x-amz-security': '{SESSION}'}} pw correct horse battery")
    except RuntimeError as e:
        message = str(e)
    out = redact_text(message)
    assert SESSION not in out and "correct horse battery" not in out
    assert out.count(MASK) == 2
    assert redact_text("abc is fine") == "abc is fine"


def test_redact_obj_recurses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", HF)
    report = {
        "findings": [{"message": f"could not log in with {HF}", "evidence": {
            "env": {"HF_TOKEN": HF, "NCCL_DEBUG": "WARN"}, "api_key": {"nested": "x"},
            "has_token": True, "max_tokens": 512, "token_file": None}}],
        "tuple": ("a", AWS_KEY_ID),
    }
    out = redact_obj(report)
    text = json.dumps(out)
    assert HF not in text and AWS_KEY_ID not in text
    ev = out["findings"][0]["evidence"]
    assert ev["env"] == {"HF_TOKEN": MASK, "NCCL_DEBUG": "WARN"}
    assert ev["api_key"] == MASK
    assert ev["has_token"] is True and ev["max_tokens"] == 512 and ev["token_file"] is None
    assert out["tuple"] == ["a", MASK]
    assert report["findings"][0]["evidence"]["env"]["HF_TOKEN"] == HF  # input untouched


def test_redact_text_on_a_large_blob() -> None:
    # how long it takes (linear, no backtracking blow-up) is measured by bench/redact.py
    blob = ("x" * 100_000) + " " + ("abc_def.ghi " * 10_000) + HF
    out = redact_text(blob, env={})
    assert HF not in out
