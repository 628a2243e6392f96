#!/usr/bin/env bash
# GPU smoke test for ddp-doctor: on a machine with NVIDIA GPUs, run in one go
#   1. the NCCL all_reduce sweep   (ddp-doctor bench-comm; or preflight --select communication)
#   2. the NVML GPU checks         (ddp-doctor preflight --select gpu --verbose)
#   3. the GPU-only tests          (python -m pytest -m gpu)
#   4. the pytest plugin's session preflight with --ddp-expect-gpus
#   5. the EFA / NCCL network checks with NCCL's INFO log captured (which network NCCL chose)
#   6. NCCL's flight recorder dumps read by `ddp-doctor run`: a 2-rank collective mismatch diagnosed
#      from NCCL's dumps (2 GPUs or more; skipped otherwise)
# and print what passed. Exit status: 0 all steps passed; 1 a step failed; 77 no GPU present
# (nothing was tested). Reports go to $DDP_DOCTOR_SMOKE_OUT (default: a new temporary directory).
# Usage: scripts/gpu-smoke.sh            (from anywhere; runs from the repository root)
set -u
cd "$(dirname "$0")/.." || exit 1
PY="${PYTHON:-python}"
OUT="${DDP_DOCTOR_SMOKE_OUT:-$(mktemp -d -t ddp-doctor-smoke.XXXXXX)}"
mkdir -p "$OUT"

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
torch_gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "${gpus:-0}" -eq 0 ] || [ "${torch_gpus:-0}" -eq 0 ]; then
    echo "gpu-smoke: NO GPU PRESENT (nvidia-smi lists ${gpus:-0} GPU(s), torch sees ${torch_gpus:-0})."
    echo "gpu-smoke: nothing was tested; run this on a host with NVIDIA GPUs, a driver and a CUDA build of torch."
    exit 77
fi
echo "gpu-smoke: nvidia-smi lists $gpus GPU(s), torch sees $torch_gpus; reports in $OUT"

declare -a NAMES=() RESULTS=()
step() {  # step NAME COMMAND...: run, record PASS/FAIL by exit status
    local name="$1"; shift
    echo
    echo "==> $name: $*"
    "$@"
    local rc=$?
    NAMES+=("$name")
    if [ $rc -eq 0 ]; then RESULTS+=("PASS"); else RESULTS+=("FAIL (exit $rc)"); fi
}

if "$PY" -m ddp_doctor bench-comm --help >/dev/null 2>&1; then
    step "NCCL sweep (bench-comm)" "$PY" -m ddp_doctor bench-comm --report "$OUT/bench-comm.json"
else
    echo "gpu-smoke: \`ddp-doctor bench-comm\` is not available; using preflight --select communication"
    step "NCCL sweep (preflight --select communication)" \
        "$PY" -m ddp_doctor preflight --select communication --verbose --report "$OUT/communication.json"
fi
step "NVML GPU checks (preflight --select gpu)" \
    "$PY" -m ddp_doctor preflight --select gpu --verbose --report "$OUT/gpu.json"
step "GPU tests (pytest -m gpu)" "$PY" -m pytest -m gpu -q -rs
# The pytest plugin's session preflight on this runner, expecting the GPUs torch sees.
step "pytest plugin session preflight (--ddp-expect-gpus $torch_gpus)" \
    "$PY" -m pytest -p no:cacheprovider --ddp-doctor --ddp-expect-gpus "$torch_gpus" -q tests/test_public_api.py
# EFA and NCCL's network: the preflight with NCCL's INFO log for INIT,NET captured (DDP330-DDP335;
# silent off EFA instances). Prints which network NCCL chose.
efa_and_network() {
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$OUT/nccl-debug.%h.%p.log" \
        "$PY" -m ddp_doctor preflight --select network --verbose --report "$OUT/network.json"
    local rc=$?
    echo "NCCL chose:"; grep -h -E "NET/|Using network" "$OUT"/nccl-debug.*.log 2>/dev/null | sort -u | head -5
    return $rc
}
step "EFA / NCCL network checks (preflight --select network)" efa_and_network

nccl_flight_recorder() {  # 2 NCCL ranks, one extra all_reduce on rank 0: the report names the cause from NCCL's dumps
    local runs="$OUT/nccl-fr-runs"
    mkdir -p "$runs"
    timeout 600 "$PY" -m ddp_doctor run --nproc-per-node 2 --run-dir "$runs" --report "$OUT/nccl-fr.json" \
        tests/run_scripts/nccl_mismatch.py
    echo "ddp-doctor run exited $? (a failing job is expected); checking the report and the dumps"
    "$PY" -c 'import glob, json, sys
rep = json.load(open(sys.argv[1])); cause = (rep.get("root_cause") or {}).get("id")
dumps = sorted(glob.glob(sys.argv[2] + "/ddp-doctor-run-*/nccl-fr-rank-*"))
print("root cause:", cause, (rep.get("root_cause") or {}).get("message")); print("dumps:", dumps)
sys.exit(0 if cause in ("DDP890", "DDP891") and dumps else 1)' "$OUT/nccl-fr.json" "$runs"
}
NCCL_FR_STEP="NCCL flight recorder dumps (2 ranks, run --report)"
if [ "${torch_gpus:-0}" -ge 2 ]; then
    step "$NCCL_FR_STEP" nccl_flight_recorder
else
    echo
    echo "==> $NCCL_FR_STEP: skipped, needs 2 GPUs (torch sees $torch_gpus)"
    NAMES+=("$NCCL_FR_STEP")
    RESULTS+=("SKIPPED (needs 2 GPUs)")
fi

echo
echo "gpu-smoke summary ($gpus GPU(s)):"
failed=0
for i in "${!NAMES[@]}"; do
    printf '  %-50s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    case "${RESULTS[$i]}" in PASS|SKIPPED*) ;; *) failed=1 ;; esac
done
echo "reports: $OUT"
exit $failed
