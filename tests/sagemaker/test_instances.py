"""The one instance table (ddp_doctor.sagemaker.instances): lookups and the lists derived from it."""
from __future__ import annotations

import pytest

from ddp_doctor.sagemaker import instances
from ddp_doctor.sagemaker.instances import lookup, lookup_sagemaker


@pytest.mark.parametrize("name", ["ml.p4d.24xlarge", "p4d.24xlarge", " ML.P4D.24xlarge "])
def test_lookup_accepts_both_spellings(name: str) -> None:
    row = lookup(name)
    assert row is not None and row.name == "p4d.24xlarge" and row.ml_name == "ml.p4d.24xlarge"
    assert row.gpus == 8 and row.efa and row.efa_rdma and row.nvlink and row.smddp == "supported"


def test_lookup_unknown_and_sagemaker_spelling() -> None:
    assert lookup("ml.x9.huge") is None and lookup(None) is None
    assert lookup_sagemaker("ml.g5.12xlarge") is not None
    assert lookup_sagemaker("g5.12xlarge") is None  # not how SageMaker names it


def test_expected_busbw_keeps_its_unverified_figures() -> None:
    rows = {t.name: t for t in instances.TYPES if t.expected_busbw_gbps}
    assert set(rows) == {"p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge",
                         "g5.48xlarge"}
    assert all(t.busbw_note.startswith("unverified") for t in rows.values())
    p4d = rows["p4d.24xlarge"]
    assert (p4d.expected_busbw("intra-node"), p4d.expected_busbw("inter-node")) == (220.0, 40.0)
    assert lookup("ml.g4dn.xlarge").expected_busbw("intra-node") is None  # type: ignore[union-attr]


def test_derived_lists() -> None:
    assert instances.SMDDP_INSTANCES == ("ml.p4d.24xlarge", "ml.p4de.24xlarge")
    assert instances.SMDDP_OLDER_INSTANCES == ("ml.p3.16xlarge", "ml.p3dn.24xlarge")
    assert set(instances.EFA_INSTANCES) == {"ml.g4dn.8xlarge", "ml.g4dn.12xlarge", "ml.g5.48xlarge",
                                            "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge",
                                            "ml.p5.48xlarge", "ml.trn1.32xlarge"}
    assert instances.EFA_RDMA_INSTANCES == ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.trn1.32xlarge")
    assert [t.name for t in instances.TYPES if t.nvlink is False] == ["g5.48xlarge"]
    assert len(instances.BY_NAME) == len(instances.TYPES)


def test_gpu_and_trainium_types() -> None:
    assert instances.is_gpu_type("ml.g5.xlarge") and instances.is_gpu_type("ml.p5.48xlarge")
    assert not instances.is_gpu_type("ml.trn1.32xlarge") and not instances.is_gpu_type("p4d.24xlarge")
    assert instances.is_trn_type("ml.trn1n.32xlarge") and not instances.is_trn_type("ml.m5.xlarge")
