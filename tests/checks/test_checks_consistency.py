from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from helpers.context import make_ctx, torchrun_env

from ddp_doctor import check_runner
from ddp_doctor import checks as catalogue
from ddp_doctor.checks.consistency import format_ranks, group_ranks, ranks_phrase
from ddp_doctor.findings import Finding
from ddp_doctor.preflight_ranks.rank_view import collect_view

Views = dict[int, dict[str, Any]]


def make_view(rank: int, *, host: str = "node-a", local_rank: int | None = None, world_size: int = 2,
              local_world_size: int | None = None, sm_host: str | None = None, device: str | None = None,
              uuid: str | None = None, **over: Any) -> dict[str, Any]:
    """A view like collect_view's, for a homogeneous nccl job unless told otherwise."""
    lws = local_world_size if local_world_size is not None else world_size
    lr = local_rank if local_rank is not None else rank % lws
    view: dict[str, Any] = {
        "rank": rank, "local_rank": lr, "node_rank": rank // lws, "world_size": world_size,
        "local_world_size": lws, "launcher": "torchrun", "backend": "nccl", "hostname": host,
        "sm_host": sm_host, "pid": 1000 + rank, "time": 0.0,
        "device": device or f"cuda:{lr}", "device_uuid": uuid,
        "versions": {"python": "3.11.7", "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3",
                     "transformers": "5.0.0", "accelerate": "1.10.0", "numpy": "2.4.6",
                     "ddp_doctor": "0.1.0"},
        "env": {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0"},
        "entry_script": {"path": "/opt/ml/code/train.py", "sha256": "ab" * 32},
    }
    view.update(over)
    return view


def two_nodes(n: int = 4, per_node: int = 2) -> Views:
    """n ranks, per_node per host, hosts algo-1, algo-2, ..."""
    return {r: make_view(r, host=f"ip-10-0-0-{r // per_node}", sm_host=f"algo-{r // per_node + 1}",
                         world_size=n, local_world_size=per_node) for r in range(n)}


def run(check_id: str, views: Views) -> list[Finding]:
    ctx = make_ctx(torchrun_env(world_size=len(views)))
    return check_runner.run_entry(catalogue.get(check_id), (ctx, views), 0)


CHECK_IDS = ("DDP700", "DDP701", "DDP702", "DDP703", "DDP704", "DDP705", "DDP706")


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_consistent_views_pass_every_check(check_id: str) -> None:
    assert run(check_id, two_nodes()) == []
    assert run(check_id, {0: make_view(0, world_size=1)}) == []


def test_catalogue_entries() -> None:
    catalogue.load_catalogue()
    for i in CHECK_IDS:
        entry = catalogue.get(i)
        assert entry.category == "consistency" and entry.stage == "cross_rank"
        assert set(entry.sections) - {"Severity"} == {"What", "Why", "Fix"}


# --- helpers --------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks, text", [
    ([], ""), ([3], "3"), ([0, 1, 2, 3, 5, 7, 8, 9], "0-3, 5, 7-9"), ([9, 0, 1, 1], "0-1, 9"),
])
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_ranks_phrase_and_groups() -> None:
    assert ranks_phrase([4]) == "rank 4" and ranks_phrase([0, 1, 2]) == "ranks 0-2"
    views = {r: {"v": "a" if r in (1, 2) else "b"} for r in range(4)}
    # equal sizes: the group holding the lowest rank is the reference
    assert group_ranks(views, lambda v: v["v"]) == [("b", [0, 3]), ("a", [1, 2])]


# --- DDP700 versions ------------------------------------------------------------------------

def test_torch_version_differs_between_nodes() -> None:
    views = two_nodes(16, 8)
    for r in range(8, 16):
        views[r]["versions"]["torch"] = "2.12.1"
    views[15]["versions"]["numpy"] = None
    findings = {f.evidence["library"]: f for f in run("DDP700", views)}
    assert set(findings) == {"torch", "numpy"}
    torch_f = findings["torch"]
    # equal halves: the half holding rank 0 is the reference
    assert torch_f.message == "torch differs between ranks: 2.13.0 on ranks 0-7 (algo-1), 2.12.1 on ranks 8-15 (algo-2)"
    assert torch_f.severity == "error" and torch_f.ranks == list(range(8, 16))
    assert "pin" in torch_f.hint.lower()
    numpy_f = findings["numpy"]
    assert numpy_f.severity == "warning" and numpy_f.ranks == [15]
    assert "not installed on rank 15 (algo-2)" in numpy_f.message


# --- DDP701 shared GPU ----------------------------------------------------------------------

def test_everyone_on_cuda0() -> None:
    views = {r: make_view(r, world_size=4, device="cuda:0") for r in range(4)}
    (f,) = run("DDP701", views)
    assert f.severity == "error" and f.ranks == [0, 1, 2, 3]
    assert "ranks 0-3 on host node-a all use cuda:0" in f.message
    assert "torch.cuda.set_device" in f.hint and "device_ids=[local_rank]" in f.hint


def test_same_uuid_reached_by_different_indices() -> None:
    # CUDA_VISIBLE_DEVICES differs per rank: both see "their" GPU as a different index, same UUID
    views = {0: make_view(0, device="cuda:0", uuid="GPU-aaaa"), 1: make_view(1, device="cuda:1", uuid="GPU-aaaa")}
    (f,) = run("DDP701", views)
    assert "GPU GPU-aaaa" in f.message and f.ranks == [0, 1]


def test_same_device_index_on_different_hosts_is_fine() -> None:
    views = {0: make_view(0, host="a", device="cuda:0"), 1: make_view(1, host="b", device="cuda:0")}
    assert run("DDP701", views) == []


def test_distinct_uuids_behind_the_same_index_are_fine() -> None:
    views = {0: make_view(0, device="cuda:0", uuid="GPU-a"), 1: make_view(1, device="cuda:0", uuid="GPU-b")}
    assert run("DDP701", views) == []


def test_one_gpu_reached_through_cuda_visible_devices() -> None:
    # no UUID (no NVML): rank 1's cuda:0 under CUDA_VISIBLE_DEVICES=1 is rank 0's cuda:1
    views = {0: make_view(0, device="cuda:1"), 1: make_view(1, device="cuda:0")}
    views[1]["env"] = {**views[1]["env"], "CUDA_VISIBLE_DEVICES": "1"}
    (f,) = run("DDP701", views)
    assert "all use GPU 1 (through CUDA_VISIBLE_DEVICES)" in f.message and f.ranks == [0, 1]
    views[0]["env"] = {**views[0]["env"], "CUDA_VISIBLE_DEVICES": "0,2"}  # its cuda:1 is GPU 2
    assert run("DDP701", views) == []


def test_cpu_ranks_share_no_gpu() -> None:
    views = {r: make_view(r, device="cpu", backend="gloo") for r in range(2)}
    assert run("DDP701", views) == []


# --- DDP702 / DDP703 local ranks ------------------------------------------------------------

def test_duplicate_local_rank_on_a_host() -> None:
    views = {r: make_view(r, world_size=3, local_rank=0 if r < 2 else 1) for r in range(3)}
    (f,) = run("DDP702", views)
    assert f.message == "ranks 0-1 on host node-a all have LOCAL_RANK=0 and use cuda:0." and f.ranks == [0, 1]
    assert f.severity == "error"
    assert run("DDP703", views) == []  # reported once, by DDP702
    assert run("DDP701", views) == []  # one problem, one finding: DDP702 names its cause


def one_host_two_launchers(**over: Any) -> Views:
    """`ddp-doctor run --nnodes 2 --node-rank K --nproc-per-node 1` twice on one host: node ranks 0
    and 1, each with LOCAL_RANK=0."""
    return {r: make_view(r, world_size=2, local_world_size=1, local_rank=0, **over) for r in range(2)}


def test_two_launchers_on_one_host_sharing_a_gpu_is_an_error() -> None:
    views = one_host_two_launchers()  # nccl: both on cuda:0, CUDA_VISIBLE_DEVICES the same (unset)
    assert [v["node_rank"] for v in views.values()] == [0, 1]
    (f,) = run("DDP702", views)
    assert f.severity == "error" and f.ranks == [0, 1]
    assert f.message == "ranks 0-1 on host node-a all have LOCAL_RANK=0 and use cuda:0."
    assert "CUDA_VISIBLE_DEVICES" in f.hint and "one launcher per node" in f.hint
    same_uuid = one_host_two_launchers(uuid="GPU-aaaa")
    (f,) = run("DDP702", same_uuid)
    assert f.severity == "error" and "use GPU GPU-aaaa" in f.message
    same_visible = one_host_two_launchers(env={"CUDA_VISIBLE_DEVICES": "3"})
    (f,) = run("DDP702", same_visible)
    assert f.severity == "error" and "use GPU 3 (through CUDA_VISIBLE_DEVICES)" in f.message


def test_two_launchers_on_one_host_on_cpu_share_nothing() -> None:
    views = one_host_two_launchers(device="cpu", backend="gloo")
    for check_id in CHECK_IDS:
        assert run(check_id, views) == [], check_id


@pytest.mark.parametrize("per_rank", [
    [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}],  # cuda:0 of each is a different GPU
    [{"env": {"CUDA_VISIBLE_DEVICES": "0"}}, {"env": {"CUDA_VISIBLE_DEVICES": "1"}}],
    [{"env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, {"env": {"CUDA_VISIBLE_DEVICES": "1,0"}}],
])
def test_two_launchers_on_one_host_with_their_own_gpus_are_fine(per_rank: list[dict[str, Any]]) -> None:
    views = {r: make_view(r, world_size=2, local_world_size=1, local_rank=0, **per_rank[r]) for r in range(2)}
    assert run("DDP702", views) == [] and run("DDP701", views) == []


def test_one_launchers_cpu_ranks_with_one_local_rank_warn() -> None:
    # the launcher's LOCAL_RANK overwritten: one node rank, so per-node work runs twice
    views = {r: make_view(r, world_size=2, local_world_size=2, local_rank=0, device="cpu", backend="gloo")
             for r in range(2)}
    assert {v["node_rank"] for v in views.values()} == {0}
    (f,) = run("DDP702", views)
    assert f.severity == "warning" and f.ranks == [0, 1]
    assert f.message == ("ranks 0-1 on host node-a (node rank 0) all have LOCAL_RANK=0; they share no GPU, "
                         "but per-node work guarded by LOCAL_RANK == 0 runs on each of them.")


def test_local_ranks_with_a_gap() -> None:
    views = {r: make_view(r, world_size=3, local_world_size=3, local_rank=[0, 1, 3][r]) for r in range(3)}
    (f,) = run("DDP703", views)
    assert "local ranks 0, 1, 3; expected 0-2" in f.message


def test_local_world_size_does_not_match_ranks_on_host() -> None:
    views = {r: make_view(r, world_size=2, local_world_size=4) for r in range(2)}
    (f,) = run("DDP703", views)
    assert "runs 2 rank(s) (ranks 0-1) but they report LOCAL_WORLD_SIZE=4" in f.message


def test_layout_gaps_ignored_while_ranks_are_missing() -> None:
    views = {r: make_view(r, world_size=4) for r in (0, 1, 3)}
    assert run("DDP703", views) == []


# --- DDP704 layout --------------------------------------------------------------------------

def test_world_size_and_backend_differ() -> None:
    views = two_nodes(4, 2)
    views[3]["world_size"] = 8
    views[2]["backend"] = "gloo"
    msgs = {f.evidence["field"]: f for f in run("DDP704", views)}
    assert "WORLD_SIZE differs between ranks: 4 on ranks 0-2 (algo-1, algo-2), 8 on rank 3 (algo-2)" \
        == msgs["world_size"].message
    assert msgs["world_size"].ranks == [3]
    assert "'nccl' on ranks 0-1, 3" in msgs["backend"].message and msgs["backend"].ranks == [2]


def test_local_world_size_within_and_across_hosts() -> None:
    views = two_nodes(4, 2)
    views[1]["local_world_size"] = 3
    (f,) = run("DDP704", views)
    assert f.severity == "error" and "on one host" in f.message and f.ranks == [1]

    uneven = {r: make_view(r, host="a" if r < 2 else "b", world_size=3, local_world_size=2 if r < 2 else 1,
                           local_rank=r if r < 2 else 0) for r in range(3)}
    (f,) = run("DDP704", uneven)
    assert f.severity == "warning" and "differs between hosts" in f.message and f.ranks == [2]


# --- DDP705 code ----------------------------------------------------------------------------

def test_nodes_run_different_code() -> None:
    views = two_nodes(4, 2)
    for r in (2, 3):
        views[r]["entry_script"] = {"path": "/opt/ml/code/train.py", "sha256": "cd" * 32}
    (f,) = run("DDP705", views)
    assert f.ranks == [2, 3] and f.severity == "error"
    assert f"sha256 {'ab' * 6} (/opt/ml/code/train.py) on ranks 0-1 (algo-1)" in f.message
    assert f"sha256 {'cd' * 6} (/opt/ml/code/train.py) on ranks 2-3 (algo-2)" in f.message


def test_script_missing_on_one_node() -> None:
    views = two_nodes(4, 2)
    views[3]["entry_script"] = None
    (f,) = run("DDP705", views)
    assert "no readable script on rank 3 (algo-2)" in f.message


def test_no_scripts_anywhere_is_fine() -> None:
    views = two_nodes(4, 2)
    for v in views.values():
        v["entry_script"] = None
    assert run("DDP705", views) == []


# --- DDP706 communication env ---------------------------------------------------------------

def test_nccl_env_differs() -> None:
    views = two_nodes(4, 2)
    for r in (2, 3):
        views[r]["env"] = {**views[r]["env"], "NCCL_PROTO": "simple"}
        views[r]["env"].pop("NCCL_DEBUG")
    msgs = {f.evidence["variable"]: f for f in run("DDP706", views)}
    assert set(msgs) == {"NCCL_DEBUG", "NCCL_PROTO"}
    assert msgs["NCCL_PROTO"].message == ("NCCL_PROTO differs between ranks: unset on ranks 0-1 (algo-1), "
                                          "'simple' on ranks 2-3 (algo-2)")
    assert msgs["NCCL_PROTO"].severity == "warning"


def test_per_rank_variables_are_not_compared() -> None:
    views = two_nodes(4, 2)
    for r, v in views.items():
        v["env"] = {**v["env"], "CUDA_VISIBLE_DEVICES": str(r % 2), "SMDATAPARALLEL_LOCAL_RANK": str(r % 2)}
    (f,) = run("DDP706", views)
    assert f.evidence["variable"] == "CUDA_VISIBLE_DEVICES" and f.severity == "info"


def node_views(run_dirs: list[str], user_env: list[dict[str, str]]) -> Views:
    """One rank per node, each under `ddp-doctor run` (its own run directory, its own settings of
    NCCL's log and dumps) on top of the user's environment, through collect_view."""
    from ddp_doctor.training.run.ledger import recorder_env
    views: Views = {}
    for r, (run_dir, mine) in enumerate(zip(run_dirs, user_env)):
        env = {**torchrun_env(rank=r, world_size=2, local_world_size=1), **mine}
        recorder_env(env, run_dir)  # what `ddp-doctor run` sets for its ranks
        views[r] = json.loads(json.dumps(collect_view(make_ctx(env, hostname=f"node-{r}"))))
    return views


def test_ddp_doctors_own_per_node_paths_are_not_compared(tmp_path: Path) -> None:
    views = node_views([str(tmp_path / "run-a"), str(tmp_path / "run-b")], [{}, {}])
    assert run("DDP706", views) == []
    assert "NCCL_DEBUG_FILE" not in views[0]["env"]  # ddp-doctor's, not the user's


def test_the_users_own_settings_are_still_compared(tmp_path: Path) -> None:
    run_dirs = [str(tmp_path / "run-a"), str(tmp_path / "run-b")]
    # set on node 0 only: node 1 has ddp-doctor's NCCL_DEBUG=INFO, which is not the user's
    (f,) = run("DDP706", node_views(run_dirs, [{"NCCL_DEBUG": "WARN"}, {}]))
    assert f.message == "NCCL_DEBUG differs between ranks: 'WARN' on rank 0 (node-0), unset on rank 1 (node-1)"
    assert f.severity == "warning"
    # set differently on each node, and the user's own per-node dump prefix
    findings = run("DDP706", node_views(run_dirs, [
        {"NCCL_DEBUG": "INFO", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/a/fr_"},
        {"NCCL_DEBUG": "WARN", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/b/fr_"}]))
    assert {f.evidence["variable"] for f in findings} == {"NCCL_DEBUG", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}


# --- the pipeline composes: real contexts -> collect_view -> checks -------------------------

def test_views_from_real_contexts(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('v1')\n")
    views: Views = {}
    for r in range(4):
        env = {**torchrun_env(rank=r, world_size=4, local_world_size=2, master_addr="localhost"),
               "GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"}
        ctx = make_ctx(env, hostname=f"node-{r // 2}", entry_script=str(script))
        views[r] = json.loads(json.dumps(collect_view(ctx)))  # as it travels between ranks
    for check_id in CHECK_IDS:
        assert run(check_id, views) == [], check_id

    changed = copy.deepcopy(views)
    script.write_text("print('v2')\n")
    for r in (2, 3):
        env = {**torchrun_env(rank=r, world_size=4, local_world_size=2), "GLOO_SOCKET_IFNAME": "eth0",
               "NCCL_DEBUG": "WARN"}
        changed[r] = collect_view(make_ctx(env, hostname="node-1", entry_script=str(script)))
    findings = {f.id: f for cid in CHECK_IDS for f in run(cid, changed)}
    assert set(findings) == {"DDP705", "DDP706"}
    assert findings["DDP705"].ranks == [2, 3]  # equal halves: rank 0's is the reference
    assert "GLOO_SOCKET_IFNAME" in findings["DDP706"].message
