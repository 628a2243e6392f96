"""Known error signatures (ddp_doctor/checks/signatures.py).

(a) classify() on the exact text torch 2.13 (or transformers) prints, captured from the scripts in
    tests/failure_scripts where the error can be produced on CPU; the others (NCCL, CUDA) use the
    text those libraries print on GPU hosts, marked TEXT ONLY below.
(b) every script that produces its error for real, as its run through `ddp-doctor run` (2 ranks
    where the error needs a group, one process otherwise) left it, recorded in the replay corpus
    (tests/corpus/signatures/) and judged again: root cause ID, the rank named, the exit code (the
    script's own: 1 for an uncaught exception), no frame of ddp-doctor in the ranks' tracebacks.
(c) a few of them launched end to end: what only a launch shows (the exit status, the console, no
    traceback of ddp-doctor itself, the evidence file written).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from helpers import corpus
from helpers.procs import load_json, result_of, run_all
from helpers.scenarios import GROUPS, launch

from ddp_doctor import checks as catalogue
from ddp_doctor.checks.rank_endings import training_findings
from ddp_doctor.checks.signatures import SIGNATURES, classify
from ddp_doctor.report.render import render_text
from ddp_doctor.training.evidence_file import verdict

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "failure_scripts"

# ---------------------------------------------------------------------------------------- texts
# "Type: message\n<traceback tail>" as diagnose.failure_text builds it from a rank's exception.

GLOO_CLOSED = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
               "closed by peer [127.0.0.1]:22240. This is typically caused by a remote worker crashing. Check the "
               "logs of the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f\n"
               "  File \".../torch/distributed/distributed_c10d.py\", line 3252, in all_reduce\n    work.wait()\n")

SAMPLES: dict[str, list[str]] = {
    "DDP820": ["ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable "
               "RANK expected, but not set\n  File \".../torch/distributed/rendezvous.py\", line 254, in "
               "_get_env_or_raise\n    raise _env_error(env_var)\n"],
    "DDP821": ["DistNetworkError: The server socket has failed to listen on any local network address. port: "
               "47699, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n"],
    "DDP822": ["ValueError: trying to initialize the default process group twice!\n  File \".../torch/distributed/"
               "distributed_c10d.py\", line 1772, in init_process_group\n"],
    "DDP823": ["RuntimeError: Expected to have finished reduction in the prior iteration before starting a new "
               "one. This error indicates that your module has parameters that were not used in producing loss. "
               "You can enable unused parameter detection by passing the keyword argument "
               "`find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by \nmaking "
               "sure all `forward` function outputs participate in calculating loss. \nIf you already have done "
               "the above, then the distributed data parallel module wasn't able to locate the output tensors in "
               "the return value of your module's `forward` function. Please include the loss function and the "
               "structure of the return value of `forward` of your module when reporting this issue (e.g. list, "
               "dict, iterable).\nParameter indices which did not receive grad for rank 1: 2 3\n In addition, "
               "you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to print "
               "out information about which particular parameters did not receive gradient on this rank as part "
               "of this error\n"],
    # tests/run_scripts/ddp_unused_parameters.py twice: a block checkpointed twice in reentrant mode
    "DDP847": ["RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the "
               "following reasons: 1) Use of a module parameter outside the `forward` function. Please make sure "
               "model parameters are not shared across multiple concurrent forward-backward passes. or try to use "
               "_set_static_graph() as a workaround if this module graph does not change during training loop.2) "
               "Reused parameters in multiple reentrant backward passes. For example, if you use multiple "
               "`checkpoint` functions to wrap the same part of your model, it would result in the same set of "
               "parameters been used by different reentrant backward passes multiple times, and hence marking a "
               "variable ready multiple times. DDP does not support such use cases in default. You can try to use "
               "_set_static_graph() as a workaround if your module graph does not change over iterations.\n"
               "Parameter at index 3 with name block.lin.bias has been marked as ready twice. This means that "
               "multiple autograd engine  hooks have fired for this particular parameter during this iteration.\n"
               "  File \".../torch/autograd/graph.py\", line 979, in _engine_run_backward\n"],
    # TEXT ONLY: NCCL needs GPUs. ProcessGroupNCCL's watchdog message, and the exception it leaves.
    "DDP824": ["DistBackendError: [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated "
               "with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
               "OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 "
               "milliseconds before timing out.\n",
               "RuntimeError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2651, "
               "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800437 milliseconds "
               "before timing out.\n"],
    "DDP825": ["RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
               "Timed out waiting 2000ms for recv operation to complete\n  File \".../torch/distributed/"
               "distributed_c10d.py\", line 3252, in all_reduce\n    work.wait()\n"],
    "DDP826": [GLOO_CLOSED,
               "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer "
               "[10.0.0.2]:40312\n"],
    "DDP827": ["RuntimeError: Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most "
               "recent call last):\n  File \".../torch/storage.py\", line 414, in _new_shared\n    return "
               "cls._new_using_fd_cpu(size)\nRuntimeError: unable to allocate shared memory(shm) for file "
               "</torch_21440_668148441_0>: No space left on device (28)\n",
               # TEXT ONLY: the SIGBUS variant (older torch, or shm exhausted after allocation)
               "RuntimeError: DataLoader worker (pid 4721) is killed by signal: Bus error. It is possible that "
               "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n",
               "RuntimeError: unable to write to file </torch_98_1717181393>: No space left on device (28)\n"],
    # TEXT ONLY: CUDA; the message torch's caching allocator raises.
    "DDP828": ["OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
               "79.15 GiB of which 5.06 MiB is free. Including non-PyTorch memory, this process has 79.14 GiB "
               "memory in use. Of the allocated memory 78.13 GiB is allocated by PyTorch, and 456.05 MiB is "
               "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
               "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"],
    "DDP829": ["ValueError: invalid literal for int() with base 10: '[\"algo-1\",\"algo-2\"]'\n    num_hosts = "
               "int(os.environ[\"SM_HOSTS\"])\n",
               "ValueError: invalid literal for int() with base 10: 'algo-2'\n"],
    "DDP830": ["ModuleNotFoundError: No module named 'smdistributed'\n  File \"/opt/ml/code/train.py\", line 2, in "
               "<module>\n    import smdistributed.dataparallel.torch.distributed as dist\n"],
    "DDP831": ["ModuleNotFoundError: No module named 'smdistributed'\n  File \"/opt/ml/code/train.py\", line 2, in "
               "<module>\n    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401\n"],
    "DDP832": ["ValueError: The batch received was empty, your model won't be able to train on it. Double-check "
               "that your training dataset contains keys expected by the model: inputs,kwargs,label,label_ids.\n"],
    "DDP833": ["ValueError: Default process group has not been initialized, please make sure to call "
               "init_process_group.\n"],
    "DDP834": ["KeyError: 'LOCAL_RANK'\n    local_rank = int(os.environ[\"LOCAL_RANK\"])\n  File \"<frozen os>\", "
               "line 679, in __getitem__\n", "KeyError: 'WORLD_SIZE'\n", "KeyError: 'RANK'\n"],
    "DDP835": ["DistStoreError: Timed out after 3 seconds waiting for clients. 1/2 clients joined.\n"],
    "DDP836": ["RuntimeError: [1]: params[0] in this process with sizes [16, 4] appears not to match sizes of the "
               "same param in process 0.\n",
               # TEXT ONLY: a different number of parameters
               "RuntimeError: DDP expects same model across all ranks, but Rank 1 has 4 params, while rank 0 has "
               "inconsistent 2 params.\n"],
    # TEXT ONLY: CUDA.
    "DDP837": ["AcceleratorError: CUDA error: invalid device ordinal\nGPU device may be out of range, do you have "
               "enough GPUs?\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
               "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
               "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"],
    # TEXT ONLY: NCCL.
    "DDP838": ["DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, "
               "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
               "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
               "error. \nLast error:\nsocketStartConnect: Connect to 10.0.1.23<46271> failed : Software caused "
               "connection abort\n"],
    "DDP839": ["AssertionError: Torch not compiled with CUDA enabled\n  File \".../torch/cuda/__init__.py\", line "
               "522, in _lazy_init\n", "RuntimeError: No CUDA GPUs are available\n",
               # torch.cuda.set_device(local_rank) on a CPU build of torch 2.13 (nanoGPT, pytorch/examples)
               "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'\n  File \".../torch/cuda/"
               "__init__.py\", line 689, in set_device\n    torch._C._cuda_setDevice(device)\n"],
    "DDP840": ["RuntimeError: Distributed package doesn't have NCCL built in\n"],
    # TEXT ONLY (NCCL's heartbeat monitor, GPU hosts): the log of
    # https://github.com/Intellindust-AI-Lab/DEIM/issues/105 and https://github.com/sgl-project/sglang/issues/1691
    "DDP841": ["[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out! Process will be "
               "terminated after dumping debug info. workMetaList_.size()=103\n[rank1]:[F ProcessGroupNCCL.cpp:1169]"
               " [PG 0 Rank 1] [PG 0 Rank 1] ProcessGroupNCCL's watchdog got stuck for 600 seconds without making "
               "progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API hang blocking "
               "the watchdog, and could be triggered by another thread holding the GIL inside a CUDA api, or other "
               "deadlock-prone behaviors.\n",
               "[rank2]:[F1019 01:14:03.356851194 ProcessGroupNCCL.cpp:1224] [PG 3 Rank 2] [PG 3 Rank 2] "
               "ProcessGroupNCCL's watchdog got stuck for 600 seconds without making progress in monitoring "
               "enqueued collectives.\n"],
    # Captured here: gloo, TORCH_DISTRIBUTED_DEBUG=DETAIL, rank 0 all_reduce of 4 floats, rank 1 of 5 (torch 2.13);
    # the same text on GPU: https://github.com/modelscope/ms-swift/pull/9443, https://github.com/pytorch/pytorch/issues/148976
    "DDP842": ["RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
               "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[5], TensorDtypes=Float, "
               "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided (default), "
               "requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 0 "
               "is running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], "
               "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided "
               "(default), requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt)))."
               "Collectives differ in the following aspects:   Tensor Tensor shapes: 5vs 4\n",
               "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
               "CollectiveFingerPrint(SequenceNumber=1OpType=BARRIER), but Rank 2 is running collective: "
               "CollectiveFingerPrint(SequenceNumber=0OpType=BARRIER).\n"],
    # TEXT ONLY (NCCL): https://github.com/NVIDIA/Megatron-LM/issues/661, https://github.com/Peterande/D-FINE/issues/289
    # (not DDP838 "network / system", though the texts contain "NCCL error in:")
    "DDP843": ["DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, invalid "
               "usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3\nncclInvalidUsage: This usually "
               "reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 0 and rank 1 "
               "both on CUDA device 2000\n",
               "[1,2]<stdout>:smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and "
               "rank 0 both on CUDA device 1000\n"],
    # TEXT ONLY (CUDA): https://github.com/pytorch/pytorch/issues/21819
    "DDP844": ["RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
               "asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
               "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n"],
    # TEXT ONLY (CUDA): https://github.com/facebookresearch/pycls/issues/183
    "DDP845": ["RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you "
               "must use the 'spawn' start method\n"],
}

UNRELATED = ["ValueError: bad batch on rank 1\n", "ZeroDivisionError: division by zero\n",
             "OSError: [Errno 28] No space left on device: '/opt/ml/model/checkpoint.pt'\n",
             "KeyError: 'input_ids'\n", "ValueError: invalid literal for int() with base 10: 'abc'\n"]


# ------------------------------------------------------------------------------ catalogue tests

def test_every_signature_is_in_the_registry_with_what_why_fix():
    loaded = catalogue.load_catalogue()
    ids = [s.entry.id for s in SIGNATURES]
    assert len(ids) >= 14 and len(set(ids)) == len(ids)
    for sig in SIGNATURES:
        entry = loaded[sig.entry.id]
        assert entry is sig.entry and entry.category == "training_failure" and entry.stage == "event"
        assert int(entry.id[3:]) >= 820
        assert set(entry.sections) >= {"What", "Why", "Fix"} and all(entry.sections[k] for k in
                                                                    ("What", "Why", "Fix")), entry.id
        assert sig.patterns, entry.id


def test_every_signature_has_a_sample():
    assert set(SAMPLES) == {s.entry.id for s in SIGNATURES}


@pytest.mark.parametrize("sig_id,text", [(k, t) for k, ts in SAMPLES.items() for t in ts])
def test_sample_classifies_to_its_own_signature(sig_id, text):
    """Catalogue order puts no generic pattern before a specific one: each signature's own text
    reaches it, so no earlier signature matches it."""
    sig = classify(text)
    assert sig is not None and sig.entry.id == sig_id, (sig_id, sig and sig.entry.id)


def test_set_device_on_a_cpu_build_is_cuda_not_available():
    """The text this torch raises for torch.cuda.set_device on a CPU build, captured here."""
    import torch
    if torch.backends.cuda.is_built():
        pytest.skip("a CUDA build of torch: set_device raises no AttributeError")
    try:
        torch.cuda.set_device(0)
    except AttributeError as e:
        text = f"{type(e).__name__}: {e}\n"
    else:
        pytest.fail("set_device on a CPU build raised nothing")
    assert text == "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'\n"
    assert classify(text).entry.id == "DDP839"
    assert classify("AssertionError: Torch not compiled with CUDA enabled\n").entry.id == "DDP839"


def test_patterns_match_regardless_of_case():
    assert classify(SAMPLES["DDP833"][0].upper()).entry.id == "DDP833"


@pytest.mark.parametrize("text", UNRELATED)
def test_unrelated_errors_match_no_signature(text):
    assert classify(text) is None


def test_only_lost_peer_signatures_are_consequences():
    assert {s.entry.id for s in SIGNATURES if s.consequence} == {"DDP826"}


# --------------------------------------------------------------- diagnosis of consequences (pure)

def _outcome(text: str, t: float) -> dict:
    kind, _, rest = text.partition(": ")
    message, _, tb = rest.partition("\n")
    return {"exit_code": 1, "time": t, "exception": {"type": kind, "message": message, "traceback": tb, "time": t}}


def test_connection_closed_alone_points_at_the_killed_peer():
    findings, code = training_findings({0: _outcome(GLOO_CLOSED, 10.0)}, {0: 1, 1: -9}, [0, 1])
    by_id = {f.id: f for f in findings}
    assert by_id["DDP802"].ranks == [0] and by_id["DDP802"].evidence["signature"] == "DDP826"
    assert by_id["DDP803"].ranks == [1]
    assert code == 137  # the root-cause rank's own status: SIGKILL as the shell shows it


def test_same_signature_on_two_ranks_is_not_a_consequence():
    a = SAMPLES["DDP823"][0]
    findings, code = training_findings({1: _outcome(a, 10.0), 0: _outcome(a.replace("rank 1:", "rank 0:"), 10.1)},
                                       {0: 1, 1: 1}, [0, 1])
    assert sorted(f.id for f in findings) == ["DDP823", "DDP823"] and code == 1


# ------------------------------------------------------------------ each script, as its run left it
# Every script of tests/failure_scripts run for real under `ddp-doctor run` (helpers/scenarios.py,
# group "signatures": 2 ranks where the error needs a group, one process otherwise), its evidence
# recorded by tests/record_corpus.py into tests/corpus/signatures/ and judged again here.

# expected root-cause ID, its rank(s) (None: both ranks raise it), exit code (the script's own:
# 1 for an uncaught exception)
CASES = {
    "env_not_set": ("DDP820", [0], 1),
    "port_in_use": ("DDP821", [0], 1),
    "init_twice": ("DDP864", [0], 1),  # the probe names both call sites; DDP822 follows
    "unused_parameter": ("DDP823", None, 1),  # both ranks raise it: one finding, ranks 0-1
    "collective_timeout": ("DDP891", [1], 1),  # rank 1 never issued it; DDP825 follows
    "peer_killed": ("DDP803", [1], 137),  # rank 0: DDP802 via DDP826 (a consequence)
    "shm_full": ("DDP827", [0], 1),
    "sm_hosts_int": ("DDP829", [0], 1),
    "smdistributed_deprecated": ("DDP830", [0], 1),
    "smdistributed_missing": ("DDP831", [0], 1),
    "empty_batch": ("DDP860", [0], 1),  # the probe saw the cause; DDP832 is its symptom
    "no_default_group": ("DDP833", [0], 1),
    "rank_env_missing": ("DDP834", [0], 1),
    "store_timeout": ("DDP835", [0], 1),
    "model_mismatch": ("DDP836", [1], 1),
    "cuda_unavailable": ("DDP839", [0], 1),
    "nccl_unavailable": ("DDP840", [0], 1),
    "collective_mismatch": ("DDP842", None, 1),  # both ranks raise it
}
# still listed, after the root cause (a probe's, or the ledgers')
SYMPTOMS = {"init_twice": "DDP822", "empty_batch": "DDP832", "collective_timeout": "DDP825"}
OWN_FRAME = re.compile(r'File "[^"]*[/\\]ddp_doctor[/\\]')


def test_every_failure_script_is_a_recorded_scenario_that_replays_to_its_verdict():
    scripts = sorted(p.stem for p in SCRIPTS.glob("*.py"))
    assert sorted(CASES) == sorted(GROUPS["signatures"]) == scripts
    assert corpus.names("signatures") == scripts
    for name in scripts:
        code, rep, was = corpus.replayed("signatures", name)
        assert verdict(rep, code) == was, name


def check_diagnosis(name: str, rep: dict, code: int) -> None:
    """What a failure script's report must say: its root cause, the rank, the exit code, the
    symptoms kept, and that it followed from the failure itself."""
    want_id, want_ranks, want_rc = CASES[name]
    cause = rep["root_cause"]
    assert rep["phase"] == "training" and cause is not None, rep["findings"]
    assert cause["id"] == want_id, (cause, rep["findings"])
    if want_ranks is None:  # both ranks raise it: one merged finding naming both, or the first
        assert cause["ranks"] and set(cause["ranks"]) <= {0, 1}, cause
    else:
        assert cause["ranks"] == want_ranks, cause
    assert code == want_rc, rep["findings"]
    if name in SYMPTOMS:
        assert SYMPTOMS[name] in {f["id"] for f in rep["findings"]}, rep["findings"]
    # no hang bound (DDP801) and no rank ended by the teardown bound (DDP806, SIGKILL) on the way
    fired = [f for f in rep["findings"] if f["id"] == "DDP801"
             or (f["id"] == "DDP806" and (f.get("evidence") or {}).get("exit_status") == -9)]
    assert not fired, fired


@pytest.mark.parametrize("name", list(CASES))
def test_failure_script_is_diagnosed(name):
    code, rep, _ = corpus.replayed("signatures", name)
    check_diagnosis(name, rep, code)
    assert f"Root cause: {CASES[name][0]}" in render_text(rep)
    # the ranks' own tracebacks, as they raised them, hold no frame of ddp-doctor's
    raised = [o["exception"]["traceback"] for o in corpus.evidence_of("signatures", name)["outcomes"].values()
              if o.get("exception")]
    assert not [t for t in raised if OWN_FRAME.search(t)], raised


def test_consequences_are_labelled():
    """The peer of a killed rank, and of a rank whose model differs, fails with gloo's lost
    connection: labelled DDP802 with the DDP826 signature, never the root cause."""
    for name in ("peer_killed", "model_mismatch"):
        _, rep, _ = corpus.replayed("signatures", name)
        peers = [f for f in rep["findings"] if f["id"] == "DDP802"]
        if name == "model_mismatch" and not peers:
            continue  # the launcher ended rank 0 before its own error was recorded (DDP803)
        assert peers and peers[0]["ranks"] == [0] and peers[0]["evidence"]["consequence"] is True, rep["findings"]
        ev = peers[0]["evidence"]
        if "signature" not in ev:
            # the launcher stopped rank 0 (SIGTERM) before gloo's lost connection reached it: the
            # other form of the same consequence, said so in its message
            assert ev["exit_status"] == -15 and "stopped by the launcher" in peers[0]["message"], peers
            continue
        assert ev["signature"] == "DDP826", peers
    _, rep, _ = corpus.replayed("signatures", "unused_parameter")
    assert {r for f in rep["findings"] if f["id"] == "DDP823" for r in f["ranks"]} <= {0, 1}
    assert not [f for f in rep["findings"] if f["id"] == "DDP802"], rep["findings"]


# ------------------------------------------------------------------------------- end to end
# What only a launch shows, for a few scripts of different kinds: a probe around init (one
# process), a rank killed by a signal, a collective timing out (ledgers, a rank left asleep): the
# exit status, the console, no traceback of ddp-doctor itself, no process left behind, and an
# evidence file that replays to the report's verdict. How long failure -> report takes is printed
# by the fixture and measured by bench/failure_report.py.
LAUNCHED = ("init_twice", "peer_killed", "collective_timeout")


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """The launched scripts, three at a time: name -> (result, report, its evidence file)."""
    base = tmp_path_factory.mktemp("signatures")
    results = run_all({n: launch("signatures", n, base) for n in LAUNCHED})
    out = {}
    for n in LAUNCHED:
        try:
            res = result_of(results, n)
            rep = load_json(str(base / f"{n}.json"))
        except BaseException as e:  # noqa: BLE001 - reported by the case's own test
            out[n] = e
            continue
        failed_at = min(f["time"] for f in rep["findings"] if f.get("phase") == "training")
        out[n] = (res, rep, base / f"{n}.evidence.json", os.path.getmtime(base / f"{n}.json") - failed_at)
    timings = ", ".join(f"{n} {v[3]:.2f}s" for n, v in out.items() if not isinstance(v, BaseException))
    sys.stderr.write(f"\nfailure -> report: {timings}\n")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", LAUNCHED)
def test_failure_script_is_diagnosed_end_to_end(name, e2e):
    got = e2e[name]
    if isinstance(got, BaseException):
        raise got
    res, rep, evidence, _ = got
    check_diagnosis(name, rep, res.rc)
    assert not OWN_FRAME.search(res.output), res.output[-3000:]
    assert f"Root cause: {CASES[name][0]}" in res.stderr
    code, again, was = corpus.judged_again(evidence)
    assert was == verdict(rep, res.rc) == verdict(again, code)
