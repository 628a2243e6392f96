"""The preflight's report at 4,096 ranks: 512 nodes x 8 ranks, every view made by
the real view builder, every rank's final findings by the real checks' entries, the real cross_rank
stage, build_report and render_text (helpers/scale_world.py). The report stays small and complete:
one finding per problem with every rank it is on, per-rank evidence capped with a count of what
was left out, a text verdict that fits a screen. A small world's report is what it was before.
Timings are bench/report_scale.py's, never asserted here."""
from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.scale_world import build_world, reporting_rank

from ddp_doctor.findings import Finding, brief_ranks
from ddp_doctor.report.build import FOLD_AT, MAX_KEPT, merge_findings
from ddp_doctor.report.render import SCREEN_LINES, WIDTH, verdict_line
from ddp_doctor.report.schema import validate_report
from ddp_doctor.report.sinks import report_json

NODES, PER_NODE = 512, 8
WORLD = NODES * PER_NODE
# The report's size bound. A rank's entry (its host, GPU, 8 library versions, 7 communication
# variables) is about 580 bytes, one line each: the data `ddp-doctor diff` and the history compare,
# kept whole, 2.4 MB at 4,096 ranks. Everything else (about 200 KB here) holds the full rank list of
# each finding (about 6 bytes a rank named, a few findings span the world) and evidence capped at
# MAX_KEPT entries each: it must not grow with the ranks beyond those lists.
RANK_ENTRY_BYTES = 650
FINDINGS_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def at_scale() -> Any:
    world = build_world(NODES, PER_NODE)
    return world, reporting_rank(world)


def _node(n: int) -> list[int]:
    return list(range(n * PER_NODE, (n + 1) * PER_NODE))


def _by_id(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in report["findings"]:
        out.setdefault(f["id"], []).append(f)
    return out


@pytest.mark.slow
def test_the_json_report_is_valid_and_small(at_scale: Any) -> None:
    _, verdict = at_scale
    report = verdict.report
    assert validate_report(report) == []
    text = report_json(report)
    assert json.loads(text) == json.loads(json.dumps(report))  # only the whitespace is its own
    entries = report_json({"ranks": report["ranks"]})
    rest = report_json({k: v for k, v in report.items() if k != "ranks"})
    assert len(report["ranks"]) == WORLD and len(entries) < RANK_ENTRY_BYTES * WORLD
    assert len(entries.splitlines()) == WORLD + 4  # one line a rank
    assert len(rest) < FINDINGS_BYTES, len(rest)
    assert len(text) < RANK_ENTRY_BYTES * WORLD + FINDINGS_BYTES


@pytest.mark.slow
def test_each_problem_is_one_finding_on_exactly_its_ranks(at_scale: Any) -> None:
    world, verdict = at_scale
    where = world.problems
    found = _by_id(verdict.report)
    lost = set(where.lost_ranks)
    alive = [r for r in range(WORLD) if r not in lost]
    leaders = [r for r in range(0, WORLD, PER_NODE) if r not in lost]
    assert {i: len(fs) for i, fs in found.items()} == {
        "DDP003": 1, "DDP700": 3, "DDP701": 3, "DDP705": 1, "DDP302": 1, "DDP601": 1, "DDP505": 1,
        "DDP706": 1, "DDP508": PER_NODE}  # nothing else: no check crashed or ran out of time

    (gone,) = found["DDP003"]
    assert gone["ranks"] == list(where.lost_ranks) and verdict.report["root_cause"]["id"] == "DDP003"
    assert gone["message"] == "ranks 5, 900, 2001 checked in but sent no final findings within 60 s"

    old = _node(where.old_image_node)
    assert sorted(f["evidence"]["library"] for f in found["DDP700"]) == ["cuda", "nccl", "torch"]
    for f in found["DDP700"]:
        assert f["ranks"] == old
        groups = f["evidence"]["groups"]
        assert [len(g["ranks"]) for g in groups] == [WORLD - PER_NODE, PER_NODE]
        assert sorted(r for g in groups for r in g["ranks"]) == list(range(WORLD))  # the full lists stay

    assert sorted(f["ranks"] for f in found["DDP701"]) == [
        [n * PER_NODE, n * PER_NODE + 5] for n in where.no_set_device_nodes]
    (code,) = found["DDP705"]
    assert code["ranks"] == list(where.stale_script_ranks)

    # the same warning on every rank that reported: one finding, every rank
    (same,) = found["DDP302"]
    assert same["ranks"] == alive and "per_rank" not in same["evidence"]
    assert same["message"].startswith("NCCL_SOCKET_IFNAME='^docker,ens' leaves only")

    # one warning a node, its own evidence on each: per-rank evidence capped, the rest counted
    (ram,) = found["DDP601"]
    assert ram["ranks"] == leaders
    assert len(ram["evidence"]["per_rank"]) == MAX_KEPT
    assert ram["evidence"]["per_rank_left_out"] == len(leaders) - MAX_KEPT
    assert list(ram["evidence"]["per_rank"])[:2] == ["0", "8"]

    # a message of its own on each of 200 nodes (a leftover process's pid): one finding, examples kept
    (busy,) = found["DDP505"]
    nodes = list(where.leftover_nodes)
    assert len(nodes) == 200 >= FOLD_AT and busy["ranks"] == [n * PER_NODE for n in nodes]
    first = 40_000 + nodes[0] * 37
    assert busy["message"] == (f"GPU 0: 2048 MiB of 81559 MiB already in use (limit 1024 MiB): pid {first} "
                               "(2048 MiB) (and 199 more like it with other values on 199 more rank(s); "
                               "evidence.variants)")
    variants = busy["evidence"]["variants"]
    assert len(variants) == MAX_KEPT and busy["evidence"]["variants_left_out"] == 199 - MAX_KEPT
    second = first + 37  # the next node's leftover process
    assert variants[0] == {
        "ranks": [nodes[1] * PER_NODE],
        "message": f"GPU 0: 2048 MiB of 81559 MiB already in use (limit 1024 MiB): pid {second} (2048 MiB)",
        "evidence": {"gpu": "GPU 0", "used_mib": 2048, "total_mib": 81559,
                     "processes": [{"pid": second, "used_bytes": 2048 << 20}]}}

    # a value of its own on each node: the message names 5 of them, the evidence 16, the rest counted
    (env,) = found["DDP706"]
    assert env["ranks"] == list(range(PER_NODE, WORLD))
    assert env["message"].endswith(f"{NODES - 5} more values")
    assert len(env["evidence"]["groups"]) == 16 and env["evidence"]["groups_left_out"] == NODES - 16

    for f in found["DDP508"]:  # every rank's GPU k: one finding per k, on the ranks with local rank k
        k = int(f["message"].split(":")[0].split()[1])
        assert f["ranks"] == [r for r in range(k, WORLD, PER_NODE) if r not in lost]


@pytest.mark.slow
def test_the_text_fits_a_screen(at_scale: Any) -> None:
    _, verdict = at_scale
    lines = verdict.text.splitlines()
    assert len(lines) <= SCREEN_LINES, verdict.text
    assert max(len(line) for line in lines) <= WIDTH, verdict.text
    assert lines[0] == ("ddp-doctor preflight: FAIL (8 error(s), 4 warning(s)) - 4096 rank(s) on 512 node(s), "
                        "launcher torchrun, backend nccl")
    assert "Root cause: DDP003 A rank ended without a report [ranks 5, 900, 2001]" in lines
    for check_id in ("DDP700", "DDP701", "DDP705", "DDP302", "DDP601", "DDP505", "DDP706"):
        assert sum(line.startswith(f"  {check_id} ") for line in lines) == 1, check_id  # one title an ID
    assert "  DDP601 Little RAM available [ranks 0, 8, 16, 24, 32, 40 and 506 more rank(s) in 506 runs]" in lines
    assert "  DDP302 NCCL_SOCKET_IFNAME excludes every interface but loopback [ranks 0-4, 6-899, 901-2000, " \
           "2002-4095]" in lines
    assert lines[-2:] == ["Info: 8 (shown with --verbose or in the JSON report)",
                          "Report: /fsx/runs/ddp-doctor-report.json"]
    assert len(verdict_line(verdict.report)) <= WIDTH


def test_a_healthy_world_at_scale_passes_with_no_finding() -> None:
    verdict = reporting_rank(build_world(NODES, PER_NODE, problems=False))
    assert verdict.report["status"] == "pass" and verdict.report["findings"] == []
    assert verdict.text.splitlines() == [
        "ddp-doctor preflight: PASS (0 error(s), 0 warning(s)) - 4096 rank(s) on 512 node(s), launcher "
        "torchrun, backend nccl", "Report: /fsx/runs/ddp-doctor-report.json"]


def F(rank: int, message: str, **evidence: Any) -> Finding:
    return Finding(id="DDP800", category="training_failure", severity="error", title="A rank raised",
                   message=message, hint="Fix it.", ranks=[rank], evidence=evidence, time=float(rank))


def test_the_same_finding_on_4096_ranks_is_one_and_merges_again() -> None:
    (f,) = merge_findings([F(r, f"rank {r} raised ValueError: bad batch") for r in range(WORLD)])
    assert f.ranks == list(range(WORLD)) and f.message == "ranks 0-4095 raised ValueError: bad batch"
    # every other rank: the message names 6 runs and counts the rest; the finding keeps them all
    evens = [F(r, f"rank {r} raised ValueError: bad batch", pid=1000 + r) for r in range(0, WORLD, 2)]
    (f,) = merge_findings(evens)
    assert f.ranks == list(range(0, WORLD, 2))
    assert f.message == "ranks 0, 2, 4, 6, 8, 10 and 2042 more rank(s) in 2042 runs raised ValueError: bad batch"
    assert len(f.evidence["per_rank"]) == MAX_KEPT and f.evidence["per_rank_left_out"] == WORLD // 2 - MAX_KEPT
    # the merged finding read back from a report merges with a late rank's: its brief list is its own
    (again,) = merge_findings([Finding.from_dict(f.to_dict()), F(1, "rank 1 raised ValueError: bad batch", pid=7)])
    assert again.ranks == [0, 1, *range(2, WORLD, 2)]
    assert again.message == "ranks 0-2, 4, 6, 8, 10, 12 and 2041 more rank(s) in 2041 runs raised ValueError: bad batch"
    assert again.evidence["per_rank_left_out"] == WORLD // 2 + 1 - MAX_KEPT


@pytest.mark.parametrize("ranks, text", [
    ([], ""), ([3], "3"), (range(0, 12, 2), "0, 2, 4, 6, 8, 10"),
    (range(0, 14, 2), "0, 2, 4, 6, 8, 10 and 1 more rank(s) in 1 run"),
    ([*range(0, 12, 2), *range(20, 30), 40], "0, 2, 4, 6, 8, 10 and 11 more rank(s) in 2 runs"),
])
def test_brief_ranks(ranks: Any, text: str) -> None:
    assert brief_ranks(ranks) == text


def test_a_brief_mention_of_one_more_run_merges_again() -> None:
    seven = [F(r, f"rank {r} raised X") for r in range(0, 14, 2)]
    (f,) = merge_findings(seven)
    assert f.message == "ranks 0, 2, 4, 6, 8, 10 and 1 more rank(s) in 1 run raised X"
    (again,) = merge_findings([f, F(20, "rank 20 raised X")])
    assert again.message == "ranks 0, 2, 4, 6, 8, 10 and 2 more rank(s) in 2 runs raised X"


def test_a_checks_own_per_rank_evidence_is_capped_too() -> None:
    # rank_endings' "ranks 0-4095 each raised X", each rank's own text under per_rank
    f = Finding(id="DDP800", category="training_failure", severity="error", title="A rank raised",
                message="ranks 0-4095 each raised X", hint="Fix it.", ranks=list(range(WORLD)),
                evidence={"per_rank": {str(r): {"error": f"X on rank {r}"} for r in range(WORLD)}})
    (merged,) = merge_findings([f])
    assert merged.ranks == list(range(WORLD)) and merged.message == f.message
    assert list(merged.evidence["per_rank"]) == [str(r) for r in range(MAX_KEPT)]
    assert merged.evidence["per_rank_left_out"] == WORLD - MAX_KEPT


def W(rank: int, message: str) -> Finding:
    return Finding(id="DDP816", category="host", severity="warning", title="Leftover processes",
                   message=message, hint="End them.", ranks=[rank], time=float(rank))


def test_fewer_findings_than_fold_at_that_differ_in_a_value_stay_apart() -> None:
    few = [W(r, f"rank {r}: WORLD_SIZE={r + 2}") for r in range(FOLD_AT - 1)]
    assert len(merge_findings(few)) == FOLD_AT - 1
    (folded,) = merge_findings(few + [W(FOLD_AT - 1, f"rank {FOLD_AT - 1}: WORLD_SIZE={FOLD_AT + 1}")])
    assert folded.ranks == list(range(FOLD_AT))
    assert folded.message == f"rank 0: WORLD_SIZE=2 (and {FOLD_AT - 1} more like it with other values on " \
                             f"{FOLD_AT - 1} more rank(s); evidence.variants)"


# The text a world of 2 nodes x 4 ranks with the same problems gave before the report was made to
# scale (the JSON's findings too, but for the rank lists' whitespace): at a small world nothing changed.
SMALL_TEXT = """\
ddp-doctor preflight: FAIL (6 error(s), 4 warning(s)) - 8 rank(s) on 2 node(s), launcher torchrun, backend nccl
Root cause: DDP003 A rank ended without a report [ranks 5, 7]
  ranks 5, 7 checked in but sent no final findings within 60 s
  Fix: Read that rank's stderr above; a signal such as SIGKILL usually means the host ran out of memory or the job \
was cancelled.
  Next: look into it before running again (cause: unknown; the evidence does not say whether a retry would pass)
Other errors:
  DDP700 Library versions differ between ranks [ranks 4-7]
      torch differs between ranks: 2.13.0+cu128 on ranks 0-3 (ip-10-1-0-4), 2.12.1+cu126 on ranks 4-7 (ip-10-1-0-5)
      Fix: Pin the versions in requirements.txt or the container image and use the same image on every node.
  DDP700 Library versions differ between ranks [ranks 4-7]
      cuda differs between ranks: 12.8 on ranks 0-3 (ip-10-1-0-4), 12.6 on ranks 4-7 (ip-10-1-0-5)
      Fix: Pin the versions in requirements.txt or the container image and use the same image on every node.
  DDP700 Library versions differ between ranks [ranks 4-7]
      nccl differs between ranks: 2.27.3 on ranks 0-3 (ip-10-1-0-4), 2.26.2 on ranks 4-7 (ip-10-1-0-5)
      Fix: Pin the versions in requirements.txt or the container image and use the same image on every node.
  DDP701 Two ranks use the same GPU [ranks 4, 7]
      ranks 4, 7 on host ip-10-1-0-5 all use GPU GPU-00000001-0000-4e1a-9c3b-000000000008 (rank: device 4: cuda:0, \
7: cuda:0).
      Fix: Call torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) before init_process_group, and wrap the model \
with DistributedDataParallel(model, device_ids=[local_rank]).
  DDP705 Nodes run different code [rank 7]
      The training script differs between ranks: sha256 5e5e5e5e5e5e (/fsx/code/train.py) on ranks 0-6 \
(ip-10-1-0-4, ip-10-1-0-5), sha256 a7a7a7a7a7a7 (/fsx/code/train.py) on rank 7 (ip-10-1-0-5)
      Fix: Ship the code to every node from one source (the same image, a shared file system, or SageMaker's \
source_dir) and re-launch.
Warnings:
  DDP302 NCCL_SOCKET_IFNAME excludes every interface but loopback [ranks 0-4, 6]
      NCCL_SOCKET_IFNAME='^docker,ens' leaves only the loopback interface 'lo' of lo, docker0, ens5; ranks on \
other nodes cannot reach this one through it.
      Fix: Exclude fewer interfaces, or name the interface to use (NCCL_SOCKET_IFNAME=eth0).
  DDP505 GPU memory already in use [rank 0]
      GPU 0: 2048 MiB of 81559 MiB already in use (limit 1024 MiB): pid 40000 (2048 MiB)
      Fix: Look at `nvidia-smi` and end the processes listed (`kill <pid>`); on a shared host pick free GPUs with \
CUDA_VISIBLE_DEVICES.
  DDP601 Little RAM available [ranks 0, 4]
      2.0 GiB of 1007.6 GiB RAM available for 4 rank(s); expected at least 4.0 GiB
      Fix: Use fewer DataLoader workers or ranks per node, free the memory other processes hold, or use more \
memory (a larger instance; a container's limit, Kubernetes' resources.limits.memory).
  DDP706 Communication settings differ between ranks [ranks 4-7]
      NCCL_TOPO_DUMP_FILE differs between ranks: '/fsx/topo/ip-10-1-0-4.xml' on ranks 0-3 (ip-10-1-0-4), \
'/fsx/topo/ip-10-1-0-5.xml' on ranks 4-7 (ip-10-1-0-5)
      Fix: Set these variables in the launch command or the job's environment, the same for every node, not in \
per-node shell profiles.
Info: 4 (shown with --verbose or in the JSON report)
Report: /fsx/runs/ddp-doctor-report.json"""


def test_a_small_world_reads_as_before() -> None:
    verdict = reporting_rank(build_world(2, 4))
    assert verdict.text == SMALL_TEXT
    found = _by_id(verdict.report)
    (ram,) = found["DDP601"]  # each rank's own evidence, keyed by its rank, as before
    assert sorted(ram["evidence"]["per_rank"]) == ["0", "4"] and "per_rank_left_out" not in ram["evidence"]
    for f in found["DDP700"]:
        assert "groups_left_out" not in f["evidence"] and len(f["evidence"]["groups"]) == 2
    (gpu,) = found["DDP701"]
    assert gpu["evidence"]["devices"] == {"4": "cuda:0", "7": "cuda:0"} and "devices_left_out" not in gpu["evidence"]
    assert [f["id"] for f in found["DDP508"]] == ["DDP508"] * 4  # a finding per GPU, below FOLD_AT


def test_errors_that_may_be_the_root_cause_are_never_folded() -> None:
    """Independent errors alike but for their numbers stay apart: the root cause is the earliest
    of them and names its own rank, not every rank that failed alike after it."""
    from ddp_doctor.report.build import build_report
    errors = [F(r, f"rank {r} raised ValueError: bad batch at step {100 + r}") for r in range(3, 3 + 2 * FOLD_AT)]
    rep = build_report(world={}, ranks=[], findings=errors)
    assert len(rep["findings"]) == 2 * FOLD_AT
    assert rep["root_cause"]["ranks"] == [3] and "step 103" in rep["root_cause"]["message"]
