"""The session preflight of the CI runner: ``ddp-doctor preflight`` self-launched on real ranks,
once, on the controller, before the tests. What it must cover comes from the collected
distributed tests (with xdist: from every worker, through the exchange directory). Its verdict
becomes the item ``ddp_doctor::preflight``, lines in the terminal summary and JUnit suite
properties; a failed one skips (or deselects) the distributed tests.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from ddp_doctor.pytest_plugin.marker import LAUNCHER_PREFIXES, SPEC, is_distributed, mark_spec, resolved_backend
from ddp_doctor.pytest_plugin.settings import DEFAULT_WORLD_SIZE, Settings
from ddp_doctor.pytest_plugin.state import State, get_state, visible_gpus
from ddp_doctor.report.render import all_reduce_figure

PREFLIGHT_NODEID = "ddp_doctor::preflight"
VERDICT_FILE = "verdict.json"   # in the xdist exchange directory, written by the controller
REQUEST_PREFIX = "request-"     # request-<workerid>.json: what one worker's tests need


# ---------------------------------------------------------------- what to check
def wanted(state: State, dist_items: int) -> bool:
    p = state.settings.preflight
    return p == "true" or (p == "auto" and dist_items > 0)


def request(state: State, items: list[pytest.Item]) -> dict[str, Any]:
    """What the session preflight must cover: the largest gloo world size, whether NCCL is used.
    Each marked item's MarkSpec is kept in its stash on the way."""
    gloo_ws, nccl, n = 0, False, 0
    for item in items:
        if not is_distributed(item):
            continue
        n += 1
        spec = mark_spec(item, state.settings)
        item.stash[SPEC] = spec
        if spec.error:
            continue
        backend = resolved_backend(spec, visible_gpus(state)) if spec.backend == "auto" else spec.backend
        if backend == "gloo":
            gloo_ws = max(gloo_ws, spec.world_size)
        else:
            nccl = True
    return {"items": n, "gloo_world_size": gloo_ws, "nccl": nccl}


def preflight_rankss(req: dict[str, Any], gpus: int) -> list[tuple[str, int]]:
    """(backend, ranks) to check: NCCL with one rank per GPU when there are GPUs; gloo at the
    largest world size the gloo tests ask for (2 when nothing says otherwise)."""
    runs: list[tuple[str, int]] = []
    if gpus > 0:
        runs.append(("nccl", gpus))
    if req.get("gloo_world_size") or not runs:
        runs.append(("gloo", max(int(req.get("gloo_world_size") or 0), 1) if req.get("items") else DEFAULT_WORLD_SIZE))
    return runs


# ---------------------------------------------------------------- xdist: workers ask, the controller answers
def write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def send_request(state: State, workerid: str, req: dict[str, Any]) -> None:
    if state.exchange:
        write_json(os.path.join(state.exchange, f"{REQUEST_PREFIX}{workerid}.json"), req)


def merged_requests(exchange: str) -> dict[str, Any] | None:
    """Every worker's request as one, or None when no worker sent one."""
    reqs = []
    for name in sorted(os.listdir(exchange)):
        if name.startswith(REQUEST_PREFIX):
            try:
                with open(os.path.join(exchange, name), encoding="utf-8") as f:
                    reqs.append(json.load(f))
            except (OSError, ValueError):
                continue
    if not reqs:
        return None
    return {"items": sum(r["items"] for r in reqs),
            "gloo_world_size": max([r["gloo_world_size"] for r in reqs] or [0]),
            "nccl": any(r["nccl"] for r in reqs)}


def publish_verdict(state: State) -> None:
    assert state.exchange is not None
    write_json(os.path.join(state.exchange, VERDICT_FILE), state.verdict)


def verdict_of(state: State) -> dict[str, Any] | None:
    """The session preflight's verdict; an xdist worker reads the controller's on first use."""
    if state.verdict is None and state.worker and state.exchange:
        try:
            with open(os.path.join(state.exchange, VERDICT_FILE), encoding="utf-8") as f:
                state.verdict = json.load(f)
        except (OSError, ValueError):
            return None
    return state.verdict


def failed(v: dict[str, Any] | None) -> bool:
    return v is not None and v["status"] in ("fail", "error")


# ---------------------------------------------------------------- running it
def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_one_preflight(backend: str, nproc: int, report: str, settings: Settings) -> dict[str, Any]:
    """`ddp-doctor preflight` self-launched on `nproc` ranks in a subprocess, bounded."""
    from ddp_doctor.processes.tree import own_session_dying_with_parent  # its own session, ends when we do
    t = settings.preflight_timeout
    cmd = [sys.executable, "-m", "ddp_doctor", "preflight", "--nproc-per-node", str(nproc),
           "--backend", backend, "--timeout", f"{t:g}", "--report", report, "--json",
           "--quiet"]  # its stderr is read here, not shown: no progress lines
    if settings.expect_gpus is not None:
        cmd += ["--expect-gpus", str(settings.expect_gpus)]
    cmd += settings.preflight_args
    bound = 3 * t + 90
    t0 = time.monotonic()
    try:
        os.remove(report)
    except OSError:
        pass
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_clean_env(), preexec_fn=own_session_dying_with_parent)
    timed_out = False
    try:
        _, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, err = proc.communicate()
    seconds = time.monotonic() - t0
    rep: dict[str, Any] | None = None
    try:
        with open(report, encoding="utf-8") as f:
            rep = json.load(f)
    except (OSError, ValueError):
        rep = None
    run: dict[str, Any] = {"backend": backend, "world_size": nproc, "exit_code": proc.returncode,
                           "seconds": round(seconds, 2), "report": report, "all_reduce": None,
                           "root_cause": None}
    if rep is not None:
        from ddp_doctor.report.render import render_text
        run["status"] = rep.get("status", "fail")
        cause = rep.get("root_cause")
        run["root_cause"] = cause and {k: cause.get(k) for k in ("id", "title", "message", "ranks")}
        ar = (rep.get("measurements") or {}).get("all_reduce") or []
        if ar:
            big = max(ar, key=lambda m: m.get("bytes", 0))
            run["all_reduce"] = {k: big.get(k) for k in ("bytes", "time_us", "busbw_gbps", "correct", "nranks")}
        run["text"] = render_text(rep, report_path=report)
    if timed_out:
        run["status"] = "error"
        run["line"] = f"ddp-doctor preflight ({backend}, {nproc} ranks) did not finish within {bound:g} s"
    elif rep is None or proc.returncode not in (0, 3):
        run["status"] = "error" if rep is None else run["status"]
        tail = [x for x in (err or "").strip().splitlines() if x.strip()][-1:] or ["no output"]
        run["line"] = f"ddp-doctor preflight ({backend}, {nproc} ranks) exited with status {proc.returncode}: {tail[0]}"
        run["text"] = (run.get("text") or "") + "\n" + (err or "")[-4000:]
    elif proc.returncode == 3 or run["status"] == "fail":
        c = run["root_cause"] or {}
        run["status"] = "fail"
        run["line"] = f"{c.get('id', '?')} {c.get('title', '')}: {c.get('message', '')} ({backend}, {nproc} ranks)"
    else:
        run["line"] = f"{run['status']} ({backend}, {nproc} ranks)"
    run["line"] = " ".join(run["line"].split())[:300]
    return run


def run_session_preflight(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """Every run the request needs; the verdict is the worst of them."""
    s = state.settings
    base = os.path.abspath(s.report or "ddp-doctor-report.json")
    runs = []
    plan = preflight_rankss(req, visible_gpus(state))
    for i, (backend, n) in enumerate(plan):
        path = base if i == 0 else f"{os.path.splitext(base)[0]}.{backend}.json"
        runs.append(run_one_preflight(backend, n, path, s))
    bad = [r for r in runs if r["status"] in ("fail", "error")]
    status = "error" if any(r["status"] == "error" for r in bad) else "fail" if bad else \
        ("warn" if any(r["status"] == "warn" for r in runs) else "pass")
    line = bad[0]["line"] if bad else "; ".join(r["line"] for r in runs)
    return {"status": status, "line": line, "runs": runs, "report": base,
            "expect_gpus": s.expect_gpus, "visible_gpus": visible_gpus(state)}


# ---------------------------------------------------------------- reporting it
class PreflightItem(pytest.Item):
    """`ddp_doctor::preflight`: passes or fails with the session preflight's verdict."""

    def runtest(self) -> None:
        v = verdict_of(get_state(self.config))
        if v is None:
            pytest.skip("the runner preflight did not run (no verdict from the controller)")
        for line in summary_lines(v):
            self.user_properties.append(("ddp_doctor", line))
        if v["status"] in ("fail", "error"):
            raise PreflightFailed(v)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, PreflightFailed):
            return excinfo.value.text()
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, PREFLIGHT_NODEID


def add_item(session: pytest.Session, items: list[pytest.Item]) -> None:
    """`ddp_doctor::preflight` first, so a broken runner is the first thing reported."""
    items.insert(0, PreflightItem.from_parent(session, name=PREFLIGHT_NODEID, nodeid=PREFLIGHT_NODEID))


class PreflightFailed(Exception):
    def __init__(self, verdict: dict[str, Any]) -> None:
        super().__init__(verdict["line"])
        self.verdict = verdict

    def text(self) -> str:
        v = self.verdict
        parts = [f"runner preflight failed: {v['line']}", ""]
        parts += [r.get("text", "") for r in v["runs"]]
        parts.append(f"\nreport: {v['report']}")
        return "\n".join(p for p in parts if p is not None)


def summary_lines(v: dict[str, Any]) -> list[str]:
    lines = [f"verdict: {v['status'].upper()}" + (f" - {v['line']}" if v["status"] in ("fail", "error") else "")]
    if v.get("expect_gpus") is not None:
        lines.append(f"GPUs: {v['visible_gpus']} visible, {v['expect_gpus']} expected")
    for r in v["runs"]:
        ar = r.get("all_reduce")
        fig = f"all_reduce {all_reduce_figure(ar)}" if ar else "no all_reduce measured"
        lines.append(f"{r['backend']} x {r['world_size']} ranks: {r['status']} in {r['seconds']:.1f} s; {fig}; "
                     f"report {r['report']}")
    return lines


def write_summary(terminalreporter: Any, v: dict[str, Any]) -> None:
    tr = terminalreporter
    tr.section("ddp-doctor runner preflight", sep="-", bold=True,
               red=v["status"] in ("fail", "error"), green=v["status"] == "pass")
    for line in summary_lines(v):
        tr.write_line(line)


def suite_properties(v: dict[str, Any]) -> list[tuple[str, str]]:
    props = [("ddp_doctor_status", v["status"]), ("ddp_doctor_report", v["report"]),
             ("ddp_doctor_visible_gpus", str(v["visible_gpus"]))]
    if v["status"] in ("fail", "error"):
        props.append(("ddp_doctor_root_cause", v["line"]))
    if v.get("expect_gpus") is not None:
        props.append(("ddp_doctor_expect_gpus", str(v["expect_gpus"])))
    for r in v["runs"]:
        k = f"ddp_doctor_{r['backend']}"
        props += [(f"{k}_world_size", str(r["world_size"])), (f"{k}_status", r["status"]),
                  (f"{k}_seconds", f"{r['seconds']:.2f}")]
        ar = r.get("all_reduce")
        if ar:
            props += [(f"{k}_all_reduce_bytes", str(ar["bytes"])),
                      (f"{k}_all_reduce_time_us", f"{ar['time_us']:.1f}"),
                      (f"{k}_all_reduce_busbw_gbps", f"{ar['busbw_gbps']:.4f}"),
                      (f"{k}_all_reduce_correct", str(bool(ar["correct"])).lower())]
    return props


def add_suite_properties(config: pytest.Config, v: dict[str, Any]) -> None:
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest without junitxml
        return
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for name, value in suite_properties(v):
        xml.add_global_property(name, value)
