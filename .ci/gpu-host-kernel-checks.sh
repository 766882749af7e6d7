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

# Session 16: the forward's stage 1 for ws12 is kkt v4t by default (the edge check passed on an H100); A/B
# against v4 through the harness on two head configs (38 qwen35-fwd configs, qla only, CUDA events): rows in
# $dest/kkt-*.jsonl. Session 15's longest-first A/B (1.136x on its eight configs) stays available: LPT=1.
ab() {  # ab NAME LIMIT HEADS [VAR=value ...]: qla on those head configs' qwen35-fwd mixes, rows copied back
  local name=$1 limit=$2 heads=$3; shift 3
  local budget; budget=$(left)
  (( budget < limit )) && limit=$budget
  if (( limit < 20 )); then echo "skip $name: out of time"; return; fi
  env "$@" timeout -s KILL "$limit" python cli.py fwd --backends qla --sweep qwen35-fwd --heads "$heads" \
    --timers events --out "/tmp/$name" --no-report > "$dest/$name.log" 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - t0 )) s"
  cat /tmp/$name/*.jsonl > "$dest/$name.jsonl" 2>/dev/null
}
if [ -n "${LPT:-}" ]; then
  ab lpt-on 50 16/48,8/24
  ab lpt-off 50 16/48,8/24 QLA_LONGEST_FIRST=0
fi

# The one-kernel forward: vs2 / vs2p with session 16's lean auxiliary warpgroup (float64 checks, the profile
# build's phases, then timing against ws12 and vs1), then the kkt A/B.
W=tests/gpu/test_qla_fused_ws.py
step vs-check 150 "$W" -k "matches_reference and vs2"
step vs-profile 80 "$W" -k profile_vs_phases
STEP_ENV="WS_TIMING_IMPLS=ws12,vs1,vs2,vs2p" step vs-time 100 "$W" -k time_fused
ab kkt-v4t 80 2/8,16/64
ab kkt-v4 80 2/8,16/64 QLA_KKT_IMPL=v4
