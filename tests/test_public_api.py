"""The public surface stays small, sorted and cheap to import."""
from __future__ import annotations

import subprocess
import sys

import ddp_doctor


def test_all_is_sorted_and_resolves():
    assert ddp_doctor.__all__ == sorted(ddp_doctor.__all__)
    for name in ddp_doctor.__all__:
        assert getattr(ddp_doctor, name) is not None


def test_import_does_not_import_torch_until_the_api_is_used():
    code = ("import sys, ddp_doctor; assert 'torch' not in sys.modules; "
            "f = ddp_doctor.preflight; assert callable(f); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_unknown_attribute_is_an_attribute_error():
    try:
        ddp_doctor.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("expected AttributeError")
