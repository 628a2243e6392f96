"""Redaction of secrets in everything ddp-doctor writes (reports, views, terminal, failure files).

Three layers, because a secret can turn up anywhere:
- by name: variables and dict keys named like secrets (`HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`, ...)
  keep their name and lose their value; so does the value after a secret-named flag in an
  argument list (`["--password", "x"]`, `--password=x`, `--password x`);
- by shape: AWS access key ids (and a 40-character secret next to one), AWS secret keys after a
  key-ish name, Hugging Face tokens, W&B keys (40 hex digits), JWTs, `NAME=value` pairs with a
  secret name, passwords in URLs, bearer tokens;
- by value: the current values of secret-named environment variables are removed wherever they
  appear, e.g. inside an exception message that quotes a request.

A string that holds JSON (SM_USER_ARGS, SM_HPS, SM_TRAINING_ENV, any variable set to a JSON list
or object) is redacted as the structure it is, by key names and argument lists, then written back
as JSON; one that is not JSON is redacted as text.
"""
from __future__ import annotations

import functools
import json
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
    r"SECRET|TOKEN(?!IZ)|PASSWORD|PASSWD|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|CREDENTIAL|PRIVATE[_-]?KEY"
    r"|(?<![A-Za-z0-9])AUTH(?![A-Za-z0-9])", re.IGNORECASE)
# TOKEN(?!IZ): TOKENIZERS_PARALLELISM and friends are settings, not secrets. AUTH only as a word of
# its own (--auth, HTTP_AUTH, auth_header): "Authorization: Bearer ..." keeps its shape rule, and
# "AuthorizationError: ..." stays readable.
_COUNT_WORD = re.compile(r"TOKEN(?!IZ)", re.IGNORECASE)  # max_tokens, num_tokens: counts, not secrets


def is_secret_name(name: str) -> bool:
    """Is a variable / key with this name a secret?"""
    return name.upper() in SECRET_NAMES or bool(_SECRET_WORD.search(name))


def _numbers_may_stay(name: str) -> bool:
    """A number under this secret-looking name says how much, not what (max_tokens: 512): the
    name's only secret word is TOKEN. Under password, secret, api_key... a number is masked too."""
    return name.upper() not in SECRET_NAMES and not _SECRET_WORD.search(_COUNT_WORD.sub("", name))


# Bounded, and anchored at the start of an identifier, so a long unbroken blob costs linear time.
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]{0,127}"
_AWS_ID = r"(?:AKIA|ASIA)[A-Z0-9]{16}"
_AWS_SECRET = r"[A-Za-z0-9/+=]{40}"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # ["--password", "x"], ['--api_key', 'x']: an argument list written out (JSON, a Python repr,
    # escaped inside JSON); never the next flag ("--use_auth", "--lr")
    (re.compile(rf"(?P<name>--?{_NAME})(?P<sep>\\?[\"']\s*,\s*\\?[\"'])(?P<value>(?!--)[^\s\"'\\][^\"'\\]*)"),
     "pair"),
    # NAME=value, NAME: value in JSON/YAML-ish text ("HF_TOKEN": "hf_..."), --name=value, -x NAME=value
    (re.compile(rf"(?<![A-Za-z0-9_.])(?P<name>{_NAME})(?P<sep>[\"']?\s*(?:=|:)\s*[\"']?)"
                rf"(?P<value>[^\s\"',;&}}\]]+)"), "pair"),
    # --hf-token VALUE (a command-line option followed by its value)
    (re.compile(rf"(?P<name>--{_NAME})(?P<sep>\s+)(?P<value>[^\s\"'-][^\s\"']*)"), "pair"),
    # a 40-char AWS secret access key next to an access key id, either side ("AKIA... wJalr...")
    (re.compile(rf"\b{_AWS_ID}\b(?P<sep>[\s\"',:;=|]{{1,8}}){_AWS_SECRET}(?![A-Za-z0-9/+=])"), "aws"),
    (re.compile(rf"(?<![A-Za-z0-9/+=]){_AWS_SECRET}(?P<sep>[\s\"',:;=|]{{1,8}}){_AWS_ID}\b"), "aws"),
    # AWS access key ids
    (re.compile(rf"\b{_AWS_ID}\b"), "whole"),
    # 40-char AWS secret access keys after a key-ish name (aws_secret_access_key = ..., SecretAccessKey: ...)
    (re.compile(r"(?P<keep>(?i:secret|key)[\w-]*[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])"),
     "keep"),
    # Hugging Face tokens
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), "whole"),
    # W&B API keys: 40 lowercase hex digits (not part of a longer hex run: sha256 digests stay)
    (re.compile(r"(?<![A-Za-z0-9])[0-9a-f]{40}(?![A-Za-z0-9])"), "whole"),
    # JWTs: base64url header and payload, both JSON objects ("eyJ" is '{"'), then the signature
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), "whole"),
    # user:password@ in URLs
    (re.compile(r"(?P<keep>://[^/\s:@]+:)[^@\s/]+(?=@)"), "keep"),
    # Authorization: Bearer <token>
    (re.compile(r"(?P<keep>(?i:bearer)\s+)[A-Za-z0-9._~+/=-]{8,}"), "keep"),
)


def secret_values(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Current values of secret-named variables long enough to redact by literal match, longest
    first (so a value that contains another is removed whole)."""
    env = os.environ if env is None else env
    values = {v for k, v in env.items() if v and len(v) >= MIN_LITERAL_LEN and is_secret_name(k)}
    return tuple(sorted(values, key=len, reverse=True))


# A masked value and what may close around it in a message (a parenthesis, a comma, a cut's "…"):
# never a secret's own characters (no letter or digit).
_MASKED = re.compile(re.escape(MASK) + r"[)\]}>.,;:!?…]*")


def _sub_pattern(pattern: re.Pattern[str], kind: str, text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        if kind == "whole":
            return MASK
        if kind == "keep":
            return m.group("keep") + MASK
        if kind == "aws":
            return MASK + m.group("sep") + MASK
        name, value = m.group("name"), m.group("value")
        # a value already masked stays as it is, with what closes around it: text redacted once
        # (a command line) is redacted again inside a message, "(... --token ***), its child"
        if not is_secret_name(name) or _MASKED.fullmatch(value) \
                or (_NUMBER.fullmatch(value) and _numbers_may_stay(name)):
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
    something); a value that is JSON (a list or an object: SM_USER_ARGS, SM_HPS, SM_TRAINING_ENV)
    is redacted as that structure (:func:`redact_obj`) and written back as JSON; every other value
    goes through :func:`redact_text`."""
    literals = secret_values(env)
    out: dict[str, str] = {}
    for k, v in mapping.items():
        if is_secret_name(k):
            out[k] = MASK if v else v
        else:
            out[k] = _redact_str(v, literals) if isinstance(v, str) else v
    return out


JSON_LIMIT = 1_000_000  # characters: a longer string is redacted as text, never parsed
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_FLAG = re.compile(rf"(?P<flag>--?(?P<name>{_NAME}))(?:=(?P<value>.*))?", re.DOTALL)
_AWS_ID_RE = re.compile(rf"\b{_AWS_ID}\b")
_AWS_SECRET_RE = re.compile(_AWS_SECRET)


def _stays(name: str, value: Any) -> bool:
    """Does `value` stay readable under the secret-looking `name`? None and booleans say whether,
    not what ("has_token": true); a number says how much only under a count-like name
    (max_tokens: 512, "--max_tokens", "512"); anything else is masked."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, (int, float)) or (isinstance(value, str) and _NUMBER.fullmatch(value.strip())):
        return _numbers_may_stay(name)
    return False


def _redact_str(text: str, literals: tuple[str, ...]) -> str:
    """One string: JSON (a list or an object) is redacted as the structure it holds and written
    back as JSON (unchanged text when nothing in it was secret); anything else as text."""
    if not text:
        return text
    if text.lstrip()[:1] in ("[", "{") and len(text) <= JSON_LIMIT:
        try:
            parsed = json.loads(text)
            if isinstance(parsed, (list, dict)):
                safe = _redact_obj(parsed, literals)
                return text if safe == parsed else json.dumps(safe, ensure_ascii=False)
        except (ValueError, RecursionError):
            pass  # not JSON after all (or absurdly deep): the text rules apply
    return _redact_text(text, literals)


def _aws_pair_in(values: Iterable[Any]) -> bool:
    """Does a container hold an AWS access key id? Then a 40-character secret-shaped string beside
    it (["AKIA...", "wJalr..."], {"id": "AKIA...", "key2": "wJalr..."}) is its secret key."""
    return any(isinstance(v, str) and ("AKIA" in v or "ASIA" in v) and _AWS_ID_RE.search(v) for v in values)


@functools.lru_cache(maxsize=4096)
def _redact_key(key: str, literals: tuple[str, ...]) -> str:
    """A dict key through the text rules (a key can be a URL with a password); keys repeat in
    every entry of a ledger or a report, hence the cache."""
    return _redact_text(key, literals)


def _redact_list(items: Any, literals: tuple[str, ...]) -> list[Any]:
    """A list, as an argument list too: the value after a secret-named flag (["--password", "x"])
    is masked, as is the value of a secret-named `--flag=value`; a following flag is not a value."""
    pair = _aws_pair_in(items)
    out: list[Any] = []
    flag_name: str | None = None  # a secret-named flag whose value comes next
    for x in items:
        name, flag_name = flag_name, None
        if name is not None and not (isinstance(x, str) and x.startswith("--")):
            out.append(x if _stays(name, x) else MASK)
            continue
        if isinstance(x, str):
            m = _FLAG.fullmatch(x)
            if m and is_secret_name(m.group("name")):
                value = m.group("value")
                if value is None:
                    flag_name = m.group("name")
                elif value and value != MASK and not _stays(m.group("name"), value):
                    out.append(f"{m.group('flag')}={MASK}")
                    continue
            elif pair and _AWS_SECRET_RE.fullmatch(x.strip()):
                out.append(MASK)
                continue
        out.append(_redact_obj(x, literals))
    return out


def _redact_obj(obj: Any, literals: tuple[str, ...]) -> Any:
    if isinstance(obj, str):
        return _redact_str(obj, literals)
    if isinstance(obj, Mapping):
        pair = _aws_pair_in(obj.values())
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            key = _redact_key(k, literals) if isinstance(k, str) and k else k
            if isinstance(k, str) and is_secret_name(k) and not _stays(k, v):
                out[key] = MASK
            elif pair and isinstance(v, str) and _AWS_SECRET_RE.fullmatch(v.strip()):
                out[key] = MASK
            else:
                out[key] = _redact_obj(v, literals)
        return out
    if isinstance(obj, (list, tuple)):
        return _redact_list(obj, literals)
    return obj


def redact_obj(obj: Any, env: Mapping[str, str] | None = None) -> Any:
    """Redact a JSON-like structure recursively: values under secret-named keys masked, lists also
    read as argument lists (the value after a secret-named flag masked), strings that hold JSON
    redacted as that structure, other strings through :func:`redact_text`. Tuples come back as
    lists (JSON has no tuples)."""
    return _redact_obj(obj, secret_values(env))
