"""Host checks (DDP600-DDP699) on this machine's real measurements: the failing cases come from
thresholds set through ctx.options (e.g. more free disk than the disk has), not from mocks, and
/dev/shm is tested for real in a private mount namespace with a small tmpfs."""
from __future__ import annotations

import functools
import json
import resource
import subprocess
from collections import namedtuple

import pytest
from helpers.context import make_ctx, torchrun_env
from helpers.procs import DDP, clean_env, load_json

from ddp_doctor import check_runner, cli, registry
from ddp_doctor import checks as catalogue
from ddp_doctor.checks import host
from ddp_doctor.cli.preflight import check_options
from ddp_doctor.exit_codes import EXIT_USAGE

HOST_IDS = sorted(c.id for c in catalogue.load_catalogue().values() if c.category == "host" and c.stage == "local")
HUGE = 10 ** 12


def ctx_for(local_rank=0, lws=2, env=None, **options):
    e = torchrun_env(rank=local_rank, world_size=lws)
    e.update(env or {})
    return make_ctx(e, options=options)


def run(check_id, ctx):
    return check_runner.run_entry(catalogue.get(check_id), (ctx,), ctx.rank)


def test_ids_and_docs():
    assert HOST_IDS[0] == "DDP600" and all("DDP600" <= i <= "DDP699" for i in HOST_IDS)
    for i in HOST_IDS:
        assert set(registry.REGISTRY[i].sections) - {"Severity"} == {"What", "Why", "Fix"}, i


def test_this_machine_passes_with_defaults():
    ctx = ctx_for(env={"OMP_NUM_THREADS": "1"})
    found = [f for i in HOST_IDS for f in run(i, ctx)]
    assert [f for f in found if f.severity != "info"] == [], found


def test_only_local_rank_zero_reports():
    ctx = ctx_for(local_rank=1, shm_min_mib=HUGE, ram_min_mib_per_rank=HUGE, disk_min_free_gib=HUGE,
                  open_files_min=HUGE)
    assert [f for i in HOST_IDS for f in run(i, ctx)] == []


# -- DDP600 /dev/shm -------------------------------------------------------------------------

def test_shm_threshold_from_options():
    f = run("DDP600", ctx_for(shm_min_mib=HUGE))
    assert f[0].severity == "warning" and "/dev/shm is" in f[0].message and "DataLoader" in f[0].message
    assert run("DDP600", ctx_for(shm_min_mib=1)) == []


@functools.lru_cache(maxsize=1)
def shm_namespace_works() -> bool:
    try:
        r = subprocess.run(["unshare", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm && df -k /dev/shm"],
                           capture_output=True, text=True, timeout=10)
        return r.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def preflight_with_shm(tmp_path, size: str):
    if not shm_namespace_works():
        pytest.skip("needs `unshare --mount` and `mount -t tmpfs` (root, mount namespaces permitted) "
                    "to give /dev/shm a private size")
    report = tmp_path / "r.json"
    cmd = " ".join([*DDP, "preflight", "--select", "host", "--timeout", "20", "--report", str(report)])
    res = subprocess.run(["unshare", "--mount", "sh", "-c",
                          f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {cmd}"],
                         env=clean_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    return res, load_json(str(report))


@pytest.mark.slow
def test_docker_default_shm_warns_for_real(tmp_path):
    res, rep = preflight_with_shm(tmp_path, "64m")
    assert res.returncode == 0, res.stdout + res.stderr  # a warning, not an error
    shm = [f for f in rep["findings"] if f["id"] == "DDP600"]
    assert shm and shm[0]["severity"] == "warning" and "64 MiB" in shm[0]["message"], rep["findings"]
    assert rep["status"] == "warn" and shm[0]["ranks"] == [0]
    assert "DDP600" in res.stdout and "64 MiB" in res.stdout


@pytest.mark.slow
def test_large_shm_passes_for_real(tmp_path):
    res, rep = preflight_with_shm(tmp_path, "2g")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not [f for f in rep["findings"] if f["id"] == "DDP600"]


# -- DDP601 RAM --------------------------------------------------------------------------------

def test_ram_available():
    f = run("DDP601", ctx_for(ram_min_mib_per_rank=HUGE))
    assert f[0].severity == "warning" and "RAM available for 2 rank(s)" in f[0].message
    assert run("DDP601", ctx_for(ram_min_mib_per_rank=1)) == []


@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_a_containers_memory_limit_comes_before_the_machines(tmp_path, layout):
    # a pod limited to 1.5 GiB, 1 GiB of it used, on a machine with plenty: 512 MiB left for 2 ranks
    files = ({"memory.max": str(3 << 29), "memory.current": str(1 << 30)} if layout == "v2" else
             {"memory/memory.limit_in_bytes": str(3 << 29), "memory/memory.usage_in_bytes": str(1 << 30)})
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    [f] = run("DDP601", ctx_for(env={"DDP_DOCTOR_CGROUP_ROOT": str(tmp_path)}, ram_min_mib_per_rank=512))
    assert f.message.startswith("512 MiB of 1.5 GiB memory under the container's limit (cgroup memory.max) "
                                "available for 2 rank(s)"), f.message
    assert f.evidence["container_limit_bytes"] == 3 << 29
    assert run("DDP601", ctx_for(env={"DDP_DOCTOR_CGROUP_ROOT": str(tmp_path)}, ram_min_mib_per_rank=200)) == []
    # no limit (v2 "max", v1's near-2**63): the machine's figures
    (tmp_path / ("memory.max" if layout == "v2" else "memory/memory.limit_in_bytes")).write_text(
        "max\n" if layout == "v2" else "9223372036854771712\n")
    assert run("DDP601", ctx_for(env={"DDP_DOCTOR_CGROUP_ROOT": str(tmp_path)}, ram_min_mib_per_rank=512)) == []


# -- DDP602 CPUs ----------------------------------------------------------------------------------

def test_omp_threads_oversubscribe():
    cpus = host.usable_cpus()
    f = run("DDP602", ctx_for(env={"OMP_NUM_THREADS": str(cpus)}, lws=2))
    assert f[0].severity == "warning" and f"{cpus} x 2 rank(s) = {2 * cpus} threads on {cpus} CPU(s)" in f[0].message
    assert f[0].hint.startswith(f"Set OMP_NUM_THREADS={max(1, cpus // 2)}")


def test_more_ranks_than_cpus():
    cpus = host.usable_cpus()
    f = run("DDP602", ctx_for(env={"OMP_NUM_THREADS": "1"}, lws=cpus + 1))
    assert f and f"{cpus + 1} ranks on this node but only {cpus} CPU(s)" in f[0].message


def test_omp_unset_is_info_and_one_thread_passes():
    f = run("DDP602", ctx_for(lws=2))
    assert f[0].severity == "info" and "OMP_NUM_THREADS is unset" in f[0].message
    assert run("DDP602", ctx_for(env={"OMP_NUM_THREADS": "1"}, lws=1)) == []


# -- DDP603 disk ---------------------------------------------------------------------------------

def test_free_disk_failing_and_passing(tmp_path):
    out = tmp_path / "checkpoints" / "run-1"  # not created yet: its nearest parent is measured
    env = {"SM_MODEL_DIR": str(tmp_path / "model"), "HF_HOME": str(tmp_path / "hf")}
    f = run("DDP603", ctx_for(env=env, output_dir=str(out), disk_min_free_gib=HUGE))
    assert len(f) == 1 and f[0].severity == "warning"  # one file system, one finding naming all three
    for name in ("--output-dir", "SM_MODEL_DIR", "HF_HOME"):
        assert name in f[0].message
    assert run("DDP603", ctx_for(env=env, output_dir=str(out), disk_min_free_gib=0.001)) == []


def test_default_hf_cache_location(tmp_path):
    locs = dict(host.output_locations(ctx_for(env={"HOME": str(tmp_path)})))
    assert locs["Hugging Face cache"] == str(tmp_path / ".cache" / "huggingface")


# -- DDP604 open files ----------------------------------------------------------------------------

def test_open_files_limit_real():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        f = run("DDP604", ctx_for())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert f[0].severity == "warning" and "open-files limit is 1024" in f[0].message
    assert run("DDP604", ctx_for(open_files_min=16)) == []


# -- DDP605 kernel, DDP606 swap -----------------------------------------------------------------

def test_kernel_version_parse():
    assert host.kernel_version("4.14.326-245.539.amzn2.x86_64") == (4, 14)
    assert host.kernel_version("6.18.44-fc") == (6, 18) and host.kernel_version("weird") is None


def test_old_kernel_warns(monkeypatch):
    monkeypatch.setattr(host.platform, "release", lambda: "5.4.0-1103-aws")
    f = run("DDP605", ctx_for())
    assert f[0].severity == "warning" and "kernel 5.4.0-1103-aws is older than 5.5" in f[0].message
    monkeypatch.setattr(host.platform, "release", lambda: "5.15.0-1051-aws")
    assert run("DDP605", ctx_for()) == []


def test_swap(monkeypatch):
    import psutil
    Swap = namedtuple("Swap", "total used free percent sin sout")
    monkeypatch.setattr(psutil, "swap_memory", lambda: Swap(8 << 30, 2 << 30, 6 << 30, 25.0, 0, 0))
    f = run("DDP606", ctx_for())
    assert f[0].severity == "info" and "2.0 GiB of 8.0 GiB swap in use" in f[0].message
    monkeypatch.setattr(psutil, "swap_memory", lambda: Swap(0, 0, 0, 0.0, 0, 0))
    assert run("DDP606", ctx_for()) == []


# -- options from the command line ---------------------------------------------------------------

def test_cli_threshold_and_output_dir(tmp_path):
    args = cli.build_parser().parse_args(["preflight", "--threshold", "shm_min_mib=512", "--threshold",
                                          "gpu_busy_mib=2048", "--output-dir", str(tmp_path)])
    assert check_options(args) == {"shm_min_mib": 512.0, "gpu_busy_mib": 2048.0, "output_dir": str(tmp_path)}


def test_cli_threshold_errors(capsys):
    assert cli.main(["preflight", "--threshold", "no_such_key=1"]) == EXIT_USAGE
    assert "unknown key" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["preflight", "--threshold", "shm_min_mib"])
    assert e.value.code == 2


@pytest.mark.slow
def test_output_dir_reaches_the_ranks(tmp_path):
    report = tmp_path / "r.json"
    res = subprocess.run([*DDP, "preflight", "--select", "DDP603", "--timeout", "20", "--report", str(report),
                          "--output-dir", str(tmp_path / "out"), "--threshold", f"disk_min_free_gib={HUGE}"],
                         env=clean_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    disk = [f for f in load_json(str(report))["findings"] if f["id"] == "DDP603"]
    assert disk and "--output-dir" in disk[0]["message"], json.dumps(disk)
