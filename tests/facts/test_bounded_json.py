"""The one reader of JSON and text a user or a platform hands ddp-doctor (ddp_doctor/facts/env_values.py):
bounded_json refuses text too large or nested too deep before json.loads recurses, decode_text and
read_text_file read a file by its byte-order mark; and their users (SM_* variables, the config
files under /opt/ml/input/config, sagemaker-check's --config) turn a refusal into a finding or a
usage error naming the source. Failing and passing cases of each."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_doctor.facts import sagemaker_env as sm
from ddp_doctor.facts.env_values import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    Invalid,
    bounded_json,
    decode_text,
    env_json,
    json_depth,
    read_text_file,
)

DEEP = "[" * 60000 + "]" * 60000


# ------------------------------------------------------------------ json_depth

@pytest.mark.parametrize("text,depth", [
    ("", 0), ("3", 0), ('"[[["', 0), ("[]", 1), ("[[1], [2]]", 2), ('{"a": {"b": [1]}}', 3),
    ('["[[[[", "]]]]"]', 1),                 # brackets inside strings do not count
    ('["a\\"[[[", "\\\\", [1]]', 2),         # nor after an escaped quote; an escaped backslash ends nothing
    ('["unterminated [[[[', 1),              # all after an unterminated string is inside it
    (DEEP, 60000),
    ("[]" * 1000, 1),
])
def test_json_depth(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_json_depth_is_linear_on_escaped_quotes() -> None:
    # an unterminated string of escaped quotes: a backtracking pattern would take hours on this
    text = '"' + '\\"' * (MAX_JSON_BYTES // 4)
    assert json_depth(text) == 0


# ------------------------------------------------------------------ bounded_json

@pytest.mark.parametrize("text,value", [
    ('["algo-1", "algo-2"]', ["algo-1", "algo-2"]),
    ('{"a": "[[[[[[", "b": {"c": [1, 2]}}', {"a": "[[[[[[", "b": {"c": [1, 2]}}),
    ("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, json.loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)),
    ("3", 3),
])
def test_bounded_json_reads_what_is_within_bounds(text: str, value: object) -> None:
    assert bounded_json(text) == value


@pytest.mark.parametrize("text,why", [
    (DEEP, "nested 60000 levels deep (ddp-doctor reads at most 100)"),
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested 101 levels deep"),
    ('{"a": ' * 5000 + "1" + "}" * 5000, "nested 5000 levels deep"),
    ("[" * 60000, "nested 60000 levels deep"),  # no JSON either: refused before json.loads sees it
    ("algo-1,algo-2", "not valid JSON (Expecting value)"),
    ("", "not valid JSON"),
    ('"' + '\\"' * 1000, "not valid JSON (Unterminated string"),
])
def test_bounded_json_refuses_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError) as e:
        bounded_json(text)
    assert type(e.value) is ValueError and why in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 200


def test_bounded_json_size() -> None:
    assert bounded_json('"' + "x" * 100 + '"', max_bytes=102) == "x" * 100
    with pytest.raises(ValueError, match=r"larger than 101 bytes \(102 bytes\)"):
        bounded_json('"' + "x" * 100 + '"', max_bytes=101)
    with pytest.raises(ValueError, match="larger than 10 bytes"):  # counted in UTF-8 bytes, not characters
        bounded_json('"' + "é" * 5 + '"', max_bytes=10)
    with pytest.raises(ValueError, match="nested 3 levels deep"):
        bounded_json("[[[1]]]", max_depth=2)


def test_env_json_uses_the_bounds() -> None:
    assert env_json({"X": '["a"]'}, "X") == ["a"] and env_json({}, "X") is None
    got = env_json({"X": DEEP}, "X")
    assert isinstance(got, Invalid) and "nested 60000 levels deep" in got.why
    assert env_json({"X": "{bad"}, "X") == Invalid("{bad", "not valid JSON (Expecting property name enclosed "
                                                          "in double quotes)")


# ------------------------------------------------------------------ decode_text / read_text_file

TEXT = '{"instance_type": "ml.p4d.24xlarge", "role": "café"}'


@pytest.mark.parametrize("data", [
    TEXT.encode("utf-8"),
    b"\xef\xbb\xbf" + TEXT.encode("utf-8"),
    TEXT.encode("utf-16"),                          # BOM and the machine's order (PowerShell: LE)
    b"\xff\xfe" + TEXT.encode("utf-16-le"),
    b"\xfe\xff" + TEXT.encode("utf-16-be"),
    b"\xff\xfe\x00\x00" + TEXT.encode("utf-32-le"),
    b"\x00\x00\xfe\xff" + TEXT.encode("utf-32-be"),
], ids=["utf-8", "utf-8-bom", "utf-16", "utf-16-le-bom", "utf-16-be-bom", "utf-32-le-bom", "utf-32-be-bom"])
def test_decode_text_by_its_byte_order_mark(data: bytes) -> None:
    assert decode_text(data) == TEXT  # the mark itself is dropped


@pytest.mark.parametrize("data,why", [
    (TEXT.encode("latin-1"), "not valid UTF-8 text (byte 49: invalid continuation byte); save it as UTF-8"),
    (b"\xff\xfe" + TEXT.encode("utf-16-le")[:-1], "not valid UTF-16 LE text"),
    (b"\xfe\xff" + b"\xd8\x00\x00a", "not valid UTF-16 BE text"),  # a lone surrogate
    (TEXT.encode("utf-16-le"), "holds NUL bytes and has no byte-order mark (UTF-16 without one?)"),
    (b'{"a": 1}\x00', "holds NUL bytes"),
], ids=["latin-1", "utf-16-le-truncated", "utf-16-be-lone-surrogate", "utf-16-without-bom", "nul"])
def test_decode_text_that_does_not_decode(data: bytes, why: str) -> None:
    with pytest.raises(ValueError) as e:
        decode_text(data)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_read_text_file(tmp_path: Path) -> None:
    p = tmp_path / "job.json"
    p.write_bytes(TEXT.encode("utf-16"))
    assert read_text_file(str(p)) == TEXT
    with pytest.raises(ValueError, match="larger than 10 bytes"):
        read_text_file(str(p), max_bytes=10)
    with pytest.raises(FileNotFoundError):
        read_text_file(str(tmp_path / "missing.json"))


# ------------------------------------------------------------------ SageMaker's variables and files

def test_sm_variables_nested_too_deep_are_errors_naming_them() -> None:
    env = {"SM_HOSTS": DEEP, "SM_TRAINING_ENV": DEEP, "SM_FRAMEWORK_PARAMS": '{"a": ' * 200 + "1" + "}" * 200,
           "SM_DISTRIBUTION_INSTANCE_GROUPS": DEEP, "SM_CURRENT_HOST": "algo-1"}
    view = sm.read(env, "/nonexistent/ddp-doctor-tests")
    assert view is not None and view.hosts is None
    assert "nested 60000 levels deep" in view.errors["SM_HOSTS"]
    assert len(view.errors["SM_HOSTS"]) < 500  # the raw value is quoted clipped
    assert "SM_TRAINING_ENV is nested 60000 levels deep" in view.errors["SM_TRAINING_ENV"]
    assert "SM_FRAMEWORK_PARAMS is nested 200 levels deep" in view.errors["SM_FRAMEWORK_PARAMS"]


@pytest.mark.parametrize("name,text,why", [
    ("resourceconfig.json", '{"hosts": ' + DEEP + "}", "is unreadable: nested 60001 levels deep"),
    ("resourceconfig.json", b"\xff\xfe{\x00\x00", "is unreadable: not valid UTF-16 LE text (byte 4: truncated data)"),
    ("hyperparameters.json", '{"a": ' * 5000 + "1" + "}" * 5000, "is unreadable: nested 5000 levels deep"),
    ("hyperparameters.json", json.dumps({"epochs": "3", "deep": DEEP}), "the value of 'deep' is nested 60000"),
])
def test_config_files_that_cannot_be_read_are_errors_naming_them(tmp_path: Path, name: str, text: str | bytes,
                                                             why: str) -> None:
    cfg = tmp_path / "input" / "config"
    cfg.mkdir(parents=True)
    (cfg / "resourceconfig.json").write_text('{"hosts": ["algo-1"], "current_host": "algo-1"}')
    path = cfg / name
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    view = sm.read({}, str(tmp_path))
    assert view is not None and why in view.errors[name] and str(path) in view.errors[name]


def test_config_files_in_utf16_with_a_mark_are_read(tmp_path: Path) -> None:
    cfg = tmp_path / "input" / "config"
    cfg.mkdir(parents=True)
    (cfg / "resourceconfig.json").write_bytes(json.dumps({"hosts": ["algo-1"], "current_host": "algo-1"})
                                              .encode("utf-16"))
    (cfg / "hyperparameters.json").write_text(json.dumps({"epochs": "3", "name": '"x"'}))
    view = sm.read({}, str(tmp_path))
    assert view is not None and view.errors == {} and view.rc_hosts == ["algo-1"]
    assert view.hyperparameters == {"epochs": 3, "name": "x"}


# ------------------------------------------------------------------ sagemaker-check --config

def test_load_spec_file_in_any_common_encoding(tmp_path: Path) -> None:
    from ddp_doctor.sagemaker.spec import load_spec_file
    for i, data in enumerate([b"\xef\xbb\xbf", b""]):
        p = tmp_path / f"job{i}.json"
        p.write_bytes(data + b'{"instance_type": "ml.p4d.24xlarge", "instance_count": 2}')
        assert load_spec_file(str(p)).instance_count == 2
    p = tmp_path / "job.json"
    p.write_bytes('{"instance_count": 2}'.encode("utf-16"))
    assert load_spec_file(str(p)).instance_count == 2
    pytest.importorskip("yaml")
    p = tmp_path / "job.yaml"
    p.write_bytes("instance_count: 3\nsubnets: [subnet-a]\n".encode("utf-16"))
    spec = load_spec_file(str(p))
    assert spec.instance_count == 3 and spec.subnets == ("subnet-a",)


@pytest.mark.parametrize("name,text,why", [
    ("job.json", '{"distribution": ' + DEEP + "}", "--config {path} is nested 60001 levels deep"),
    ("job.json", "{bad", "--config {path} is not valid JSON"),
    ("job.yaml", "distribution: " + DEEP + "\n", "--config {path} cannot be read: it is nested more than 100 levels"),
    ("job.yaml", "subnets: &a [subnet-a, *a]\n", "a structure that holds itself (the alias *a is inside &a)"),
    ("job.yaml", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)), "once its aliases are expanded"),
    ("job.yaml", "instance_count: [1\n", "--config {path} is not valid YAML"),
    ("job.yaml", "instance_typ: x\n", "--config {path}: unknown job setting(s): instance_typ"),
])
def test_load_spec_file_refuses_with_one_line(tmp_path: Path, name: str, text: str, why: str) -> None:
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    from ddp_doctor.sagemaker.spec import SpecError, load_spec_file
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec_file(str(p))
    assert why.format(path=p) in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_distribution_text_is_bounded() -> None:
    from ddp_doctor.sagemaker.spec import JobSpec, SpecError
    assert JobSpec.from_dict({"distribution": '{"torch_distributed": {"enabled": true}}'}).distribution_name \
        == "torch_distributed"
    with pytest.raises(SpecError, match="distribution is nested 60000 levels deep"):
        JobSpec.from_dict({"distribution": DEEP})
