#!/usr/bin/env bash
# GPU smoke test for ddp-doctor: on a machine with NVIDIA GPUs, run in one go
#   1. the NCCL all_reduce sweep   (ddp-doctor bench-comm; or preflight --select communication)
#   2. the NVML GPU checks         (ddp-doctor preflight --select gpu --verbose)
#   3. the GPU-only tests          (python -m pytest -m gpu)
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

echo
echo "gpu-smoke summary ($gpus GPU(s)):"
failed=0
for i in "${!NAMES[@]}"; do
    printf '  %-50s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    [ "${RESULTS[$i]}" = "PASS" ] || failed=1
done
echo "reports: $OUT"
exit $failed
