"""The one instance table (ddp_doctor.facts.instances): lookups and the lists derived from it."""
from __future__ import annotations

import pytest

from ddp_doctor.facts import instances
from ddp_doctor.facts.instances import lookup, lookup_sagemaker


@pytest.mark.parametrize("name", ["ml.p4d.24xlarge", "p4d.24xlarge", " ML.P4D.24xlarge "])
def test_lookup_accepts_both_spellings(name: str) -> None:
    row = lookup(name)
    assert row is not None and row.name == "p4d.24xlarge" and row.ml_name == "ml.p4d.24xlarge"
    assert row.gpus == 8 and row.efa and row.efa_rdma and row.nvlink and row.smddp == "supported"


def test_lookup_unknown_and_sagemaker_spelling() -> None:
    assert lookup("ml.x9.huge") is None and lookup(None) is None
    assert lookup_sagemaker("ml.g5.12xlarge") is not None
    assert lookup_sagemaker("g5.12xlarge") is None  # not how SageMaker names it


def test_expected_busbw_figures_name_their_source() -> None:
    rows = {t.name: t for t in instances.TYPES if t.expected_busbw_gbps}
    assert set(rows) == {"p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge",
                         "g5.48xlarge"}
    assert all(t.busbw_note.startswith(("source", "estimate")) for t in rows.values())
    assert all("unverified" not in t.busbw_note for t in rows.values())
    for name in ("p4d.24xlarge", "p5.48xlarge"):  # published nccl-tests runs
        assert rows[name].busbw_note.startswith("source") and "https://github.com/" in rows[name].busbw_note
    p4d = rows["p4d.24xlarge"]
    assert (p4d.expected_busbw("intra-node"), p4d.expected_busbw("inter-node")) == (220.0, 30.0)
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


def test_network_bandwidth_is_known_with_a_source_where_efa_is_and_bounds_the_inter_node_busbw():
    from ddp_doctor.facts.instances import NETWORK_SOURCES, TYPES
    for t in TYPES:
        if t.network_gbps is None:
            continue
        assert NETWORK_SOURCES[t.name]
        inter = t.expected_busbw("inter-node")
        if inter is not None:  # busbw (GB/s) cannot exceed what the network carries (Gbit/s / 8)
            assert inter <= t.network_gbps / 8, t.name
    assert {t.name: t.network_gbps for t in TYPES if t.name in ("p4d.24xlarge", "p5.48xlarge")} == \
        {"p4d.24xlarge": 400, "p5.48xlarge": 3200}
