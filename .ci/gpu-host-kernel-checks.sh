#!/usr/bin/env bash
# On the H200 host, from the repository root, after `source .ci/gpu-host-setup.sh`: the GPU checks of the
# bundled kernels that are prepared but not yet run (kernels/NOTES.md, "GPU check for the next session"),
# in order of what the next decision needs (the default forward last: the smoke sweep also covers it), each under its own time limit so one hang cannot eat the call.
#   bash .ci/gpu-host-kernel-checks.sh [SECONDS_TOTAL]      (default 540)
# Logs and the timing/profile JSONs go to $OUT/kchecks/ (or ./kchecks without $OUT).
set -u
total=${1:-540}
dest=${OUT:-.}/kchecks
mkdir -p "$dest"
t0=$(date +%s)
left() { echo $(( total - ($(date +%s) - t0) )); }

step() {  # step NAME LIMIT PYTEST-ARGS...
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  (( budget < limit )) && limit=$budget
  if (( limit < 20 )); then echo "skip $name: out of time"; return; fi
  OUT=$dest timeout -k 5 "$limit" python -m pytest -q -s -rfE "$@" > "$dest/$name.log" 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - t0 )) s: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$dest/$name.log" | tail -1)"
}

W=tests/gpu/test_qla_fused_ws.py
K=tests/gpu/test_qla_kkt_v3.py
step ws-check 90 "$W" -k "not time and not profile"
step bwd-dstate 60 tests/gpu/test_qla_bwd_dstate.py
step bwd 200 tests/gpu/test_qla_bwd.py
step ws-time 60 "$W" -k "time or profile"
step cp-check 60 tests/gpu/test_qla_cp.py -k "not time"
step cp-time 40 tests/gpu/test_qla_cp.py -k time
step kkt-check 60 "$K" -k "not time"
step kkt-time 40 "$K" -k time
step fwd-default 90 tests/gpu/test_qla_fwd.py
