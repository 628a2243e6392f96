"""The communication suite on real gloo ranks: the sweep inside a preflight, bench-comm's table and
plot, a faulty transport, a real straggler, and two simulated nodes measured intra and inter.

The launches whose assertions do not depend on timing (a faulty transport, bench-comm's table, the
usage error, the two simulated nodes) are started together by one module fixture, a few at a time,
and each test reads its own. The sweep (which must raise no straggler or bandwidth warning) and the
planted straggler are timing judgements: they run alone, in their own tests.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers.procs import (
    DDP,
    Launch,
    assert_clean_output,
    clean_env,
    finish,
    free_port,
    ids,
    load_json,
    outputs,
    result_of,
    run,
    run_all,
    start,
)

pytestmark = pytest.mark.slow
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ROOT = str(Path(__file__).resolve().parents[2])
NODES = ["algo-1", "algo-2"]


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def node_launches(base: Path, rank_args: list, nproc: int) -> dict[str, Launch]:
    """What helpers.nodes.run_nodes starts, one torchrun per simulated host, as launches."""
    from helpers.nodes import hosts_file, on_node
    hosts_path = hosts_file(base, NODES)
    port = free_port()
    return {host: Launch(on_node(host, hosts_path, [
        *TORCHRUN, "--nnodes", str(len(NODES)), "--node-rank", str(i), "--nproc-per-node", str(nproc),
        "--master-addr", NODES[0], "--master-port", str(port), "-m", "ddp_doctor", *rank_args]),
        clean_env(), str(base), timeout=180) for i, host in enumerate(NODES)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(name -> result or exception, name -> directory)."""
    from helpers.nodes import namespaces_work
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("faulty", "bench", "no_mpl", "nodes")}
    fake = dirs["no_mpl"] / "hide"  # a sitecustomize-free way to hide matplotlib: a module that fails to import
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden for a test')\n")
    bench_args = [*DDP, "bench-comm", "--max-bytes", "256K", "--iters", "3", "--warmup", "2", "--timeout", "20",
                  "--report", str(dirs["bench"] / "r.json")]
    launches = {
        "faulty": Launch([*DDP, "preflight", "--timeout", "20", "--report", str(dirs["faulty"] / "r.json"),
                          "--comm-max-bytes", "64K", "--select", "DDP401,DDP402"],
                         clean_env(DDP_DOCTOR_CHECK_MODULES="tests.plugins.faulty_transport", PYTHONPATH=ROOT),
                         str(dirs["faulty"])),
        "bench": Launch(bench_args + (["--plot", str(dirs["bench"] / "bw.png")] if have_matplotlib() else []),
                        clean_env(), str(dirs["bench"])),
        "no_mpl": Launch([*DDP, "bench-comm", "--plot", str(dirs["no_mpl"] / "x.png")],
                         clean_env(PYTHONPATH=f"{fake}{os.pathsep}{ROOT}"), str(dirs["no_mpl"])),
    }
    if namespaces_work():  # the two nodes must start together: all start at once (the usage error is short)
        launches.update(node_launches(dirs["nodes"], ["preflight", "--timeout", "30", "--report",
                                                      str(dirs["nodes"] / "r.json"), "--select", "DDP401,DDP403",
                                                      "--comm-max-bytes", "16K"], nproc=2))
    done = run_all(launches, at_once=len(launches))
    return done, dirs


def test_preflight_sweep_all_sizes_correct(tmp_path):
    report = tmp_path / "r.json"
    # a generous noise margin for the straggler checks: other tests may share these 2 cores
    res = run([*DDP, "preflight", "--timeout", "20", "--report", str(report), "--comm-max-bytes", "1M",
               "--straggler-min-ms", "50", "--select", "communication"], clean_env(), str(tmp_path))
    assert res.rc == 0, res.output
    rep = load_json(str(report))
    ar = rep["measurements"]["all_reduce"]
    assert [m["bytes"] for m in ar] == [4096 << i for i in range(9)]
    for m in ar:
        assert m["correct"] and m["wrong"] == 0 and m["busbw_gbps"] > 0 and m["time_us"] > 0
        assert m["busbw_gbps"] == pytest.approx(m["algbw_gbps"])  # 2 ranks: 2(n-1)/n = 1
    assert all(m["correct"] for m in rep["measurements"]["broadcast"] + rep["measurements"]["all_gather"])
    assert not ids(rep) & {"DDP401", "DDP402", "DDP403", "DDP404", "DDP405", "DDP406", "DDP407"}, rep["findings"]
    assert "all_reduce: 1048576 bytes" in res.stdout
    assert_clean_output(res)


def test_faulty_transport_is_an_error_naming_the_rank(runs):
    done, dirs = runs
    report = dirs["faulty"] / "r.json"
    res = result_of(done, "faulty")
    assert res.rc == 3, res.output
    rep = load_json(str(report))
    assert {"DDP401", "DDP402"} <= ids(rep, "error")
    ar = [f for f in rep["findings"] if f["id"] == "DDP401"][0]
    assert 1 in ar["ranks"] and "wrong" in ar["message"]
    assert all(not m["correct"] and m["wrong"] >= 1 for m in rep["measurements"]["all_reduce"])
    assert_clean_output(res)


def test_bench_comm_prints_table_and_writes_plot(runs):
    done, dirs = runs
    report, png = dirs["bench"] / "r.json", dirs["bench"] / "bw.png"
    have_mpl = have_matplotlib()
    res = result_of(done, "bench")
    assert res.rc == 0, res.output
    lines = res.stdout.splitlines()
    header = [i for i, line in enumerate(lines) if "busbw(GB/s)" in line and "#wrong" in line]
    assert len(header) == 1, res.stdout
    rows = lines[header[0] + 1: header[0] + 8]
    assert [int(r.split()[0]) for r in rows] == [4096 << i for i in range(7)]
    assert all(r.split()[2:4] == ["float", "sum"] and r.split()[-1] == "0" for r in rows)
    rep = load_json(str(report))
    assert all(m["iters"] == 3 and m["correct"] for m in rep["measurements"]["all_reduce"])
    assert "broadcast" not in rep["measurements"]  # only the sweep
    assert "ddp-doctor bench-comm: PASS" in res.stdout and "ddp-doctor preflight:" not in res.stdout
    if have_mpl:
        assert png.read_bytes()[:4] == b"\x89PNG" and f"Plot: {png}" in res.stdout
    assert_clean_output(res)


def test_bench_comm_plot_without_matplotlib_is_a_usage_error(runs):
    done, _ = runs
    res = result_of(done, "no_mpl")  # matplotlib hidden by a module of that name that fails to import
    assert res.rc == 2 and "pip install 'ddp-doctor[plot]'" in res.stderr


# Busy loops that start once their parent (the rank) has loaded torch, so the rank starts at full
# speed, and end as soon as the rank does.
HOG = """
import os, time
p = os.getppid()
def loaded():
    try:
        with open(f"/proc/{p}/maps") as f:
            return "libtorch_cpu" in f.read()
    except OSError:
        return True
while os.getppid() == p and not loaded():
    time.sleep(0.05)
while os.getppid() == p:
    pass
"""
# The rank and its three busy loops share one CPU and one session: sessions are scheduling
# groups (autogroup), so the four split that group's share of the CPU and the rank gets a
# quarter of it whatever else the machine runs.
WITH_HOGS = 'cpu=$1; hog=$2; py=$3; shift 3; for i in 1 2 3 4 5 6 7; do taskset -c "$cpu" "$py" -c "$hog" & done; ' \
            'exec taskset -c "$cpu" "$@"'


def test_straggler_rank_is_named(tmp_path):
    # A real slow rank: rank 1 runs on CPU 1 beside seven busy loops of its own session and gets
    # about an eighth of that CPU, while rank 0 has CPU 0 to itself. The fixed work then takes
    # rank 1 about 8x as long in every round (DDP405 needs 1.5x the others' median, 10 ms more, and
    # a sign test over the rounds, twice), and its CPU shows the other work that slows it. Under the
    # whole suite the other worker's launches share CPU 0 with rank 0 too: with three loops (4x) rank
    # 1 was then once not slow beyond doubt in both measurements; at 8x it stays well past 1.5x.
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        pytest.skip("needs 2 CPUs and taskset to make one rank really slower")
    report = tmp_path / "r.json"
    port = free_port()
    procs = []
    for r, cpu in ((0, cpus[0]), (1, cpus[1])):
        env = clean_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        args = ["preflight", "--timeout", "30", "--report", str(report), "--select", "DDP405"]
        if r == 0:
            cmd = ["taskset", "-c", str(cpu), *DDP, *args]
        else:
            cmd = ["sh", "-c", WITH_HOGS, "sh", str(cpu), HOG, sys.executable, *DDP, *args]
        procs.append(start(cmd, env, str(tmp_path)))
    results = [finish(p, 120) for p in procs]
    assert results[0].rc == 0, results[0].output
    rep = load_json(str(report))
    slow = [f for f in rep["findings"] if f["id"] == "DDP405"]
    assert slow and slow[0]["ranks"] == [1] and "rank 1" in slow[0]["message"], rep["findings"]
    others = slow[0]["evidence"]["other_cores_on_rank_cpus"]
    if others["1"] - others["0"] >= 0.25:  # rank 1's CPU busier with other work: the cause, said
        assert slow[0]["severity"] == "warning" and "cores of rank 1's CPUs" in slow[0]["message"], slow
    else:  # this machine's other work came to rank 0's CPU as much: the host was busy, a doubt
        assert slow[0]["severity"] == "info" and "the host was busy" in slow[0]["message"], slow


def test_two_simulated_nodes_measure_intra_and_inter_apart(runs):
    from helpers.nodes import require_namespaces
    require_namespaces()
    done, dirs = runs
    report = dirs["nodes"] / "r.json"
    results = [result_of(done, host) for host in NODES]
    assert all(r.rc == 0 for r in results), outputs(results)
    rep = load_json(str(report))
    m = rep["measurements"]
    assert rep["world"]["nnodes"] == 2 and rep["world"]["world_size"] == 4
    for name, label in (("all_reduce", "world"), ("all_reduce_intra", "intra-node"),
                        ("all_reduce_inter", "inter-node")):
        assert [e["bytes"] for e in m[name]] == [4096, 8192, 16384], name
        assert all(e["group"] == label and e["correct"] for e in m[name]), m[name]
    assert m["all_reduce"][0]["nranks"] == 4
    assert m["all_reduce_intra"][0]["nranks"] == 2 and m["all_reduce_inter"][0]["nranks"] == 2
    # both inter-node groups were swept at once: DDP403 judges each against its share (sharing)
    assert all(e["sharing"] == 2 for e in m["all_reduce_inter"]), m["all_reduce_inter"]
    assert all("sharing" not in e for e in m["all_reduce"] + m["all_reduce_intra"])
