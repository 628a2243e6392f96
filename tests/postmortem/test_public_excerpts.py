"""Failures only NCCL on real GPUs shows, which cannot run here: consoles shaped line for line as
public logs of such failures show them (short excerpts, values changed; the source of each shape
is cited), read by `ddp-doctor analyze`. Each must name the rank the evidence points to, or say
what it cannot tell."""
from __future__ import annotations

from ddp_doctor.postmortem.analyze import analyze

# NCCL's watchdog timeout and its progress line, then the abort (uncaught c10::DistBackendError),
# as torchrun's console shows them, torch 2.x. Shapes from:
# https://github.com/XPixelGroup/BasicSR/issues/737 (ranks 0-2 timing out on one SeqNum),
# https://github.com/hiyouga/LlamaFactory/issues/7396 ("[PG 1 Rank 0] ... last completed NCCL work"),
# https://github.com/pytorch/pytorch/issues/118369 (the watchdog thread terminating the process).
WAIT = ("[rank{r}]:[E626 06:24:44.9038 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) "
        "ran for 600020 milliseconds before timing out.")
PROGRESS = ("[rank{r}]:[E626 06:24:44.9064 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
            "Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, "
            "last completed NCCL work: 807.")
ABORT = ["terminate called after throwing an instance of 'c10::DistBackendError'",
         "  what():  [PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread terminated with exception: "
         "[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, "
         "NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.",
         "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent "
         "call first):", "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57"]
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
{failures}
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-06-26_06:24:45
  host      : gpu-node-1
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 1000)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 1000
============================================================
"""


def _failure(i: int, rank: int, code: int, signal: str) -> str:
    return (f"[{i}]:\n  time      : 2025-06-26_06:24:46\n  host      : gpu-node-1\n  rank      : {rank} (local_rank: "
            f"{rank})\n  exitcode  : {code} (pid: {1000 + rank})\n  error_file: <N/A>\n  traceback : Signal "
            f"{-code} ({signal}) received by PID {1000 + rank}")


def test_an_nccl_watchdog_timeout_names_the_rank_that_never_reached_the_collective(tmp_path):
    """Ranks 0, 2 and 3 time out in all_reduce #808; rank 1 printed its training lines and no
    wait: it completed #807 with the others (the watchdog says so) and never issued #808."""
    lines = [f"[default{r}]:step 12000 loss 0.4 rank {r}" for r in range(4)]
    lines.append("[default1]:[rank1]: saving checkpoint shard 3 of 8 to /fsx/ckpt/step12000")
    for r in (0, 2, 3):
        lines += [f"[default{r}]:" + WAIT.format(r=r), f"[default{r}]:" + PROGRESS.format(r=r)]
        lines += [f"[default{r}]:" + ln.format(r=r) for ln in ABORT]
    failures = "\n".join([_failure(1, 1, -15, "SIGTERM"), _failure(2, 2, -6, "SIGABRT"), _failure(3, 3, -6, "SIGABRT")])
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n" + SUMMARY.format(failures=failures))
    rep, _ = analyze([str(tmp_path / "console.log")])
    cause = rep["root_cause"]
    assert cause["id"] == "DDP891" and cause["ranks"] == [1], rep["findings"]
    assert "wait in all_reduce #808" in cause["message"] and "never issued #808 (its last was #807)" in cause["message"]
    assert "saving checkpoint shard 3 of 8" in cause["message"]  # where it was: its output's last line
    waited = [f for f in rep["findings"] if f["severity"] == "error" and f["id"] != "DDP891"]
    assert waited and all(f["caused_by"] for f in waited), waited  # the ranks that only waited: consequences
    assert any(f["id"] == "DDP824" and f["ranks"] == [0, 2, 3] for f in waited), waited


def test_duplicate_gpu_is_named_on_every_rank_from_nccls_error(tmp_path):
    """Every rank on one GPU: NCCL's "Duplicate GPU detected" raised on each rank. Shape from
    https://github.com/Peterande/D-FINE/issues/289 and https://github.com/csguoh/MambaIR/issues/39."""
    lines = []
    for r in (0, 1):
        lines += [f"[rank{r}]: Traceback (most recent call last):",
                  f'[rank{r}]:   File "/job/train.py", line 40, in <module>',
                  f"[rank{r}]:     model = DistributedDataParallel(model, device_ids=[0])",
                  f"[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
                  f"c10d/ProcessGroupNCCL.cpp:1691, invalid usage (run with NCCL_DEBUG=WARN for details), "
                  f"NCCL version 2.19.3",
                  f"[rank{r}]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
                  f"[rank{r}]: Last error:",
                  f"[rank{r}]: Duplicate GPU detected : rank {r} and rank {1 - r} both on CUDA device 2000"]
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
    rep, _ = analyze([str(tmp_path)])
    assert rep["root_cause"]["id"] == "DDP843", rep["findings"]
    assert sorted(r for f in rep["findings"] if f["id"] == "DDP843" for r in f["ranks"]) == [0, 1], rep["findings"]
    assert rep["world"]["backend"] == "nccl"


def test_the_network_nccl_chose_is_in_the_report(tmp_path):
    """NCCL's OFI plugin failed and NCCL fell back to TCP sockets; another job used EFA. Shapes from
    https://github.com/aws/deep-learning-containers/issues/2675 (the fallback) and
    https://github.com/NVIDIA/nccl/issues/527 ("Using network AWS Libfabric")."""
    socket = ["ip-10-0-0-1:123:890 [0] ofi_init:1355 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
              "ip-10-0-0-1:123:890 [0] NCCL INFO NET/IB : No device found.",
              "ip-10-0-0-1:123:890 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
              "ip-10-0-0-1:123:890 [0] NCCL INFO Using network Socket"]
    efa = ["ip-10-0-0-2:417:417 [0] NCCL INFO NET/OFI Selected Provider is efa",
           "ip-10-0-0-2:417:417 [0] NCCL INFO Using network AWS Libfabric"]
    for name, lines in (("socket", socket), ("efa", efa)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "console.log").write_text("".join(f"[default0]:{ln}\n" for ln in lines))
        rep, _ = analyze([str(tmp_path / name)])
        assert rep["world"]["nccl_network"] == {"socket": "Socket", "efa": "AWS Libfabric"}[name], rep["world"]
        # on an EFA instance type: sockets are DDP335 only between hosts (one host needs no network)
        for count, expected in ((1, []), (2, ["DDP335"] if name == "socket" else [])):
            rep, _ = analyze([str(tmp_path / name)], world={"instance_type": "p4d.24xlarge", "instance_count": count,
                                                            "instance_type_from": "--instance-type"})
            assert [f["id"] for f in rep["findings"] if f["id"] == "DDP335"] == expected, (name, count)
