#!/usr/bin/env bash
# Shared by .ci/gpu-host-fwd-results.sh and .ci/gpu-host-bwd-results.sh (sourced, after they set `total`,
# `dest` and `prefix`): a time budget for the whole call and one CLI step under its own limit.
t0=$(date +%s)
left() { echo $(( total - ($(date +%s) - t0) )); }

step() {  # step NAME LIMIT ROWS-FILE CLI-ARGS...: run the CLI, then copy its rows back even when it was killed
  local name=$1 limit=$2 rows=$3; shift 3
  local budget; budget=$(left)
  (( budget < limit )) && limit=$budget
  if (( limit < 30 )); then echo "skip $name: out of time"; return; fi
  timeout -s KILL "$limit" python cli.py "$@" > "$dest/$prefix-$name.log" 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - t0 )) s" | tee -a "$dest/$prefix-$name.log"
  [ -f "$rows" ] && cp "$rows" "$dest/$prefix-$name.jsonl"
}

# rows record the commit: gpu-host-setup.sh exports QLA_GIT_SHA from .gpuhost/sha
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$dest/$prefix-gpu.txt" 2>&1
echo "commit ${QLA_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null)}; QLA_* $(env | grep '^QLA_' | tr '\n' ' ')" \
  >> "$dest/$prefix-gpu.txt"
