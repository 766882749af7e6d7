#!/usr/bin/env bash
# On the H200 host, from the repository root, after `source .ci/gpu-host-setup.sh`: the GPU checks of the
# bundled kernels that are prepared but not yet run (kernels/NOTES.md, "Next"), in order of what the next
# decision needs, each under its own time limit (SIGKILL) so one hang cannot eat the call.
#   bash .ci/gpu-host-kernel-checks.sh [SECONDS_TOTAL]      (default 540)
# Logs and the timing/profile JSONs go to $OUT/kchecks/ (or ./kchecks without $OUT).
set -u
total=${1:-540}
dest=${OUT:-.}/kchecks
mkdir -p "$dest"
t0=$(date +%s)
left() { echo $(( total - ($(date +%s) - t0) )); }

step() {  # [VAR=value ...] step NAME LIMIT PYTEST-ARGS...: the assignments reach pytest through `env`
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  (( budget < limit )) && limit=$budget
  if (( limit < 20 )); then echo "skip $name: out of time"; return; fi
  OUT=$dest env ${STEP_ENV:-} timeout -s KILL "$limit" python -m pytest -q -s -rfE "$@" > "$dest/$name.log" 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - t0 )) s: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$dest/$name.log" | tail -1)"
}

# Session 15: the longest-first grid order against the input order on the eight qwen35-fwd configs whose short
# sequence comes first and whose CTAs queue (the cost model: 1.19x on them); rows in $dest/lpt-*.jsonl.
lpt() {  # lpt NAME LIMIT [VAR=value ...]: qla on those configs, CUDA events, rows copied back
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  (( budget < limit )) && limit=$budget
  if (( limit < 20 )); then echo "skip $name: out of time"; return; fi
  env "$@" timeout -s KILL "$limit" python cli.py fwd --backends qla --heads 16/48,8/24 \
    --seqlens 8192+24576,4096+28672,2048+6144,1024+7168 --timers events --out "/tmp/$name" --no-report \
    > "$dest/$name.log" 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - t0 )) s"
  cat /tmp/$name/*.jsonl > "$dest/$name.jsonl" 2>/dev/null
}
if [ -z "${SKIP_LPT:-}" ]; then  # SKIP_LPT=1: when the call's sweep already timed the default order
  lpt lpt-on 50
  lpt lpt-off 50 QLA_LONGEST_FIRST=0
fi

# Then the one-kernel forward (first run in session 15, on an H100: correct; steps still under SIGKILL limits):
# vs1 (session 14, Agb from stage 1) and vs2 / vs2p (session 15, Agb formed in the kernel's auxiliary
# warpgroup), float64 checks then timing; then session 14's kkt v4t and the harness's kernel-profile tests.
W=tests/gpu/test_qla_fused_ws.py
K=tests/gpu/test_qla_kkt_v3.py
step vs-check 120 "$W" -k "matches_reference and (vs1 or vs2)"
STEP_ENV="WS_TIMING_IMPLS=ws12,vs1,vs2,vs2p" step vs-time 90 "$W" -k time_fused
STEP_ENV="QLA_KKT_TEST_IMPLS=v4,v4t" step kkt-v4t-check 100 "$K" -k "not time and not profile"
STEP_ENV="QLA_KKT_TEST_IMPLS=v4,v4t" step kkt-v4t-time 50 "$K" -k "time_kkt"
step harness-profiles 60 tests/gpu/test_harness_gpu.py -k kernel_profile
