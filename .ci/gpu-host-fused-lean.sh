#!/usr/bin/env bash
# On the GPU host, after `source .ci/gpu-host-setup.sh`: the fused backward's shortest useful check, for a call with
# little device time left (session 23). In order, each under its own limit inside SECONDS_TOTAL (default 330):
# the harness's qwen35-bwd rows with the fused backward and with the staged one ($LEAN_VARIANTS, default "1 0", each
# capped at $LEAN_CAP seconds) on $LEAN_HEADS (each row checked against float64 before it is timed), the fused walk's
# step by phase (profile_bwd --fused; LEAN_PHASES= skips it), the backward CP float64 checks with it, then the plain
# autograd checks.
#   bash .ci/gpu-host-fused-lean.sh [SECONDS_TOTAL]      (logs and rows to $OUT/lean/)
set -u
total=${1:-330}
dest=${OUT:-.}/lean
mkdir -p "$dest"
t0=$(date +%s)
left() { echo $(( total - ($(date +%s) - t0) )); }
for v in ${LEAN_VARIANTS:-1 0}; do  # 1: fused, 0: staged
  lim=$(left); (( lim > ${LEAN_CAP:-110} )) && lim=${LEAN_CAP:-110}
  (( lim < 30 )) && { echo "skip fused$v: out of time"; continue; }
  rows=$(mktemp -d /tmp/lean$v-XXXX)
  QLA_BWD_FUSED=$v timeout -s KILL "$lim" python cli.py bwd --backends qla --sweep qwen35-bwd \
    --heads "${LEAN_HEADS:-16/32}" --timers events --out "$rows" --no-report > "$dest/bwd-fused$v.log" 2>&1
  echo "bwd-fused$v rc=$? t=$(( $(date +%s) - t0 )) s"
  cat "$rows"/*.jsonl > "$dest/bwd-fused$v.jsonl" 2>/dev/null
done
if [ -n "${LEAN_PHASES-1}" ]; then  # the fused walk's step by phase (its profile build: clock64 stamps)
  lim=$(left); (( lim > 60 )) && lim=60
  if (( lim >= 20 )); then
    timeout -s KILL "$lim" python -m qla_kernels.gdn.profile_bwd --fused "$dest/fused-phases.json" > "$dest/fused-phases.log" 2>&1
    echo "fused-phases rc=$? t=$(( $(date +%s) - t0 )) s"
  fi
fi
for spec in "cp-check:60:tests/gpu/test_qla_bwd_cp.py:matches_float64" \
            "plain-check:150:tests/gpu/test_qla_bwd.py:autograd_matches and tilelang"; do
  IFS=: read -r name cap file sel <<< "$spec"
  lim=$(left); (( lim > cap )) && lim=$cap
  (( lim < 20 )) && { echo "skip $name: out of time"; continue; }
  QLA_BWD_FUSED=1 timeout -s KILL "$lim" python -m pytest -q -s -rfE "$file" -k "$sel" > "$dest/$name.log" 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - t0 )) s: $(grep -E 'passed|failed' "$dest/$name.log" | tail -1)"
done
