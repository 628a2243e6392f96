"""Redaction of secrets in everything ddp-doctor writes (reports, views, terminal, failure files).

Three layers, because a secret can turn up anywhere:
- by name: variables and dict keys named like secrets (`HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`, ...)
  keep their name and lose their value;
- by shape: AWS access key ids, AWS secret keys after a key-ish name, Hugging Face tokens,
  `NAME=value` pairs with a secret name, passwords in URLs, bearer tokens;
- by value: the current values of secret-named environment variables are removed wherever they
  appear, e.g. inside an exception message that quotes a request.
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping

MASK = "***"
# Values shorter than this are not redacted by literal match: replacing "true" or "1" everywhere
# would mangle reports without protecting anything.
MIN_LITERAL_LEN = 8

SECRET_NAMES = frozenset({
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY",
})
_SECRET_WORD = re.compile(
    r"SECRET|TOKEN(?!IZ)|PASSWORD|PASSWD|API[_-]?KEY|CREDENTIAL|PRIVATE[_-]?KEY", re.IGNORECASE)
# TOKEN(?!IZ): TOKENIZERS_PARALLELISM and friends are settings, not secrets.


def is_secret_name(name: str) -> bool:
    """Is a variable / key with this name a secret?"""
    return name.upper() in SECRET_NAMES or bool(_SECRET_WORD.search(name))


# Bounded, and anchored at the start of an identifier, so a long unbroken blob costs linear time.
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]{0,127}"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # NAME=value, NAME: value in JSON/YAML-ish text ("HF_TOKEN": "hf_..."), --name=value, -x NAME=value
    (re.compile(rf"(?<![A-Za-z0-9_.])(?P<name>{_NAME})(?P<sep>[\"']?\s*(?:=|:)\s*[\"']?)"
                rf"(?P<value>[^\s\"',;&}}\]]+)"), "pair"),
    # --hf-token VALUE (a command-line option followed by its value)
    (re.compile(rf"(?P<name>--{_NAME})(?P<sep>\s+)(?P<value>[^\s\"'-][^\s\"']*)"), "pair"),
    # AWS access key ids
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), "whole"),
    # 40-char AWS secret access keys after a key-ish name (aws_secret_access_key = ..., SecretAccessKey: ...)
    (re.compile(r"(?P<keep>(?i:secret|key)[\w-]*[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])"),
     "keep"),
    # Hugging Face tokens
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), "whole"),
    # user:password@ in URLs
    (re.compile(r"(?P<keep>://[^/\s:@]+:)[^@\s/]+(?=@)"), "keep"),
    # Authorization: Bearer <token>
    (re.compile(r"(?P<keep>(?i:bearer)\s+)[A-Za-z0-9._~+/=-]{8,}"), "keep"),
)


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """Current values of secret-named variables long enough to redact by literal match, longest
    first (so a value that contains another is removed whole)."""
    env = os.environ if env is None else env
    values = {v for k, v in env.items() if v and len(v) >= MIN_LITERAL_LEN and is_secret_name(k)}
    return sorted(values, key=len, reverse=True)


def _sub_pattern(pattern: re.Pattern[str], kind: str, text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        if kind == "whole":
            return MASK
        if kind == "keep":
            return m.group("keep") + MASK
        if not is_secret_name(m.group("name")) or m.group("value") == MASK:
            return m.group(0)
        return m.group("name") + m.group("sep") + MASK
    return pattern.sub(repl, text)


def _redact_text(text: str, literals: Iterable[str]) -> str:
    for value in literals:
        if value in text:
            text = text.replace(value, MASK)
    for pattern, kind in _PATTERNS:
        text = _sub_pattern(pattern, kind, text)
    return text


def redact_text(text: str, env: Mapping[str, str] | None = None) -> str:
    """`text` with secret-looking values replaced by ``***``. `env` (default: os.environ) supplies
    the secret values to remove by literal match."""
    if not isinstance(text, str) or not text:
        return text
    return _redact_text(text, secret_values(env))


def redact_env(mapping: Mapping[str, str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of an environment mapping: secret-named variables become ``***`` (when set to
    something), every other value goes through :func:`redact_text`."""
    literals = secret_values(env)
    out: dict[str, str] = {}
    for k, v in mapping.items():
        if is_secret_name(k):
            out[k] = MASK if v else v
        else:
            out[k] = _redact_text(v, literals) if isinstance(v, str) else v
    return out


def _redact_obj(obj: Any, literals: list[str]) -> Any:
    if isinstance(obj, str):
        return _redact_text(obj, literals) if obj else obj
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            # None, booleans and numbers under a secret-named key say whether/how much, not what:
            # keep them ("has_token": true); anything else is masked whole.
            if isinstance(k, str) and is_secret_name(k) and not (v is None or isinstance(v, (bool, int, float))):
                out[k] = MASK
            else:
                out[k] = _redact_obj(v, literals)
        return out
    if isinstance(obj, (list, tuple)):
        return [_redact_obj(x, literals) for x in obj]
    return obj


def redact_obj(obj: Any, env: Mapping[str, str] | None = None) -> Any:
    """Redact a JSON-like structure recursively: strings through :func:`redact_text`, values under
    secret-named keys masked. Tuples come back as lists (JSON has no tuples)."""
    return _redact_obj(obj, secret_values(env))
