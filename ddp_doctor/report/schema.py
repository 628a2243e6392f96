"""The report's JSON Schema (draft 2020-12, schema.json beside this module) and a validator for it
that needs no dependency.

`report_schema()` returns the schema (`ddp-doctor schema` prints it); `validate_report(report)`
returns the ways a report breaks it, as "where: what" lines (empty: valid). The built-in validator
knows the keywords schema.json uses (SUPPORTED_KEYWORDS; tests/report/test_schema.py keeps the two
in step and compares its verdicts with the `jsonschema` package's). Under the test suite
(TEST_ERRORS_ENV set), every report ddp-doctor writes is validated as it is written, in whatever
process writes it, and a broken one is recorded for the suite to fail on; users' runs never
validate.
"""
from __future__ import annotations

import copy
import json
import os
import re
import time
from typing import Any

SCHEMA_FILE = "schema.json"

# The keywords the built-in validator applies; annotations ($schema, $id, title, description, $defs)
# are read past. schema.json uses no others.
SUPPORTED_KEYWORDS = frozenset({
    "type", "const", "enum", "pattern", "minimum", "required", "properties", "additionalProperties",
    "items", "anyOf", "$ref",
})
ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "$defs"})

# Set by tests/conftest.py to a directory: a report that fails validation when written leaves a
# file there (path and errors), which the suite turns into a test failure. Not DDP_DOCTOR_*: the
# tests strip those from the environments they give ranks.
TEST_ERRORS_ENV = "PYTEST_DDP_DOCTOR_SCHEMA_ERRORS"

_cache: dict[str, Any] = {}


def report_schema() -> dict[str, Any]:
    """The report's JSON Schema (a fresh copy: the caller may change it)."""
    if "schema" not in _cache:
        from importlib import resources  # when needed: importing the sinks stays cheap
        text = resources.files("ddp_doctor.report").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
        _cache["schema"] = json.loads(text)
    return copy.deepcopy(_cache["schema"])


def validate_report(report: Any) -> list[str]:
    """The ways `report` (a parsed JSON report) breaks the schema, one "path: problem" line each,
    at most 50; [] when it is valid."""
    if "schema" not in _cache:
        report_schema()
    root = _cache["schema"]
    errors: list[str] = []
    _check(report, root, root, "$", errors)
    return errors[:50]


_TYPES = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    return a == b


def _resolve(root: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        raise ValueError(f"only local $ref is supported, not {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(value: Any, schema: Any, root: dict[str, Any], where: str, errors: list[str]) -> None:
    if schema is True or schema is None:
        return
    if schema is False:
        errors.append(f"{where}: not allowed")
        return
    if "$ref" in schema:
        _check(value, _resolve(root, schema["$ref"]), root, where, errors)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            errors.append(f"{where}: {_short(value)} is not of type {' or '.join(types)}")
            return
    if "const" in schema and not _same(value, schema["const"]):
        errors.append(f"{where}: {_short(value)} is not {_short(schema['const'])}")
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        errors.append(f"{where}: {_short(value)} is not one of {_short(schema['enum'])}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {_short(value)} does not match {schema['pattern']!r}")
    if "minimum" in schema and _TYPES["number"](value) and value < schema["minimum"]:
        errors.append(f"{where}: {value} is less than {schema['minimum']}")
    if "anyOf" in schema:
        tried = [_errors_of(value, s, root, where) for s in schema["anyOf"]]
        if all(tried):
            # say why the alternative of the value's type failed ("null or a finding": the finding's)
            near = [t for t in tried if not (len(t) == 1 and t[0].startswith(f"{where}: ")
                                             and " is not of type " in t[0])]
            errors.extend(near[0] if len(near) == 1 else
                          [f"{where}: {_short(value)} matches none of: " + " | ".join("; ".join(t) for t in tried)])
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], root, f"{where}[{i}]", errors)
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(f"{where}: required key {key!r} is missing")
        props = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                _check(item, props[key], root, f"{where}.{key}", errors)
            elif "additionalProperties" in schema:
                extra = schema["additionalProperties"]
                if extra is False:
                    errors.append(f"{where}: key {key!r} is not in the schema")
                else:
                    _check(item, extra, root, f"{where}.{key}", errors)


def _errors_of(value: Any, schema: Any, root: dict[str, Any], where: str) -> list[str]:
    out: list[str] = []
    _check(value, schema, root, where, out)
    return out


def record_if_invalid(text: str, path: str) -> None:
    """Under the test suite only (TEST_ERRORS_ENV names a directory): validate the report text about
    to be written to `path`; when it breaks the schema, leave its errors in that directory. Never
    raises: the report is written either way."""
    directory = os.environ.get(TEST_ERRORS_ENV)
    if not directory:
        return
    try:
        errors = validate_report(json.loads(text))
    except Exception as e:  # noqa: BLE001 - the validator itself failed: that is a finding for the suite too
        errors = [f"validation crashed: {type(e).__name__}: {e}"]
    if not errors:
        return
    try:
        name = f"{os.getpid()}-{time.time_ns()}.json"
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump({"path": os.path.abspath(path), "errors": errors}, f, indent=1)
    except OSError:
        pass
