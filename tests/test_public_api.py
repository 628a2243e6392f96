"""The public surface stays small, sorted and cheap to import."""
from __future__ import annotations

import subprocess
import sys

import pytest

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


def test_preflight_stays_the_function_once_its_machinery_is_imported():
    # The API's own imports must not shadow it: a submodule named `preflight` would replace the
    # package attribute, and a second `ddp_doctor.preflight()` call would hit a module.
    code = ("import ddp_doctor, ddp_doctor.api, ddp_doctor.preflight_ranks.one_rank; "
            "assert callable(ddp_doctor.preflight), ddp_doctor.preflight; "
            "from ddp_doctor import preflight; assert callable(preflight)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_old_entrypoint_paths_still_import():
    code = ("from ddp_doctor.training import DoctorCallback, DoctorLightningCallback; "
            "from ddp_doctor.training.callback import DoctorCallback as A; "
            "from ddp_doctor.training.lightning import DoctorLightningCallback as B; "
            "import ddp_doctor.training.hf_trainer, ddp_doctor.training.plain_loop; "
            "from ddp_doctor import check_sampler; from ddp_doctor.sagemaker import check_job; "
            "assert DoctorCallback is A and DoctorLightningCallback is B")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
