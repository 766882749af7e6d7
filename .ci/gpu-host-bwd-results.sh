#!/usr/bin/env bash
# On the GPU host (H200 or H100: the CLI takes the GPU's name from the device), from the repository root,
# after `source .ci/gpu-host-setup.sh`: the backward's committed measurements at this commit, each step
# under its own time limit so a slow step cannot eat the call:
#   events  qwen35-bwd, `qla-bench bwd`, CUDA events (~90 s for qla alone with the TileLang cache carried),
#   edge    the edge-case numerics check of the backward, qla against FLA (FLA autotunes each shape cold),
#   train   qwen35-bwd, `--mode train` (forward + backward as one step), CUDA events.
# The baselines' rows (FLA, FlashQLA) are already in results/H200/qwen35-bwd-{bwd,train}.jsonl; they do not
# change with our commits. BWD_STEPS (default "events edge train") picks and orders the steps, BWD_BACKENDS
# (default qla) names the timed backends (on a GPU without committed baselines: BWD_BACKENDS=qla,flashqla,fla).
#   bash .ci/gpu-host-bwd-results.sh [SECONDS_TOTAL]      (default 560)
# Logs and rows go to $OUT (or ./bwd-results), named bwd-<step>.*; append the rows to
# results/<GPU>/qwen35-bwd-bwd.jsonl, qwen35-bwd-train.jsonl and numerics/edge-check-bwd.jsonl after reading
# them (rows made with a QLA_* switch set belong under results/<GPU>/dev/).
set -u
steps=${BWD_STEPS:-events edge train}
backends=${BWD_BACKENDS:-qla}
work=$(mktemp -d /tmp/bwd-XXXX)  # fresh per call: the CLI resumes from rows already in its --out folder
total=${1:-560}
dest=${OUT:-./bwd-results}
mkdir -p "$dest"
t0=$(date +%s)
left() { echo $(( total - ($(date +%s) - t0) )); }

step() {  # step NAME LIMIT ROWS-FILE CLI-ARGS...: run the CLI, then copy its rows back even when it was killed
  local name=$1 limit=$2 rows=$3; shift 3
  local budget; budget=$(left)
  (( budget < limit )) && limit=$budget
  if (( limit < 30 )); then echo "skip $name: out of time"; return; fi
  timeout -s KILL "$limit" python cli.py "$@" > "$dest/bwd-$name.log" 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - t0 )) s" | tee -a "$dest/bwd-$name.log"
  [ -f "$rows" ] && cp "$rows" "$dest/bwd-$name.jsonl"
}

# rows record the commit: gpu-host-setup.sh exports QLA_GIT_SHA from .gpuhost/sha
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$dest/bwd-gpu.txt" 2>&1
echo "commit ${QLA_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null)}; QLA_* $(env | grep '^QLA_' | tr '\n' ' ')" \
  >> "$dest/bwd-gpu.txt"
for s in $steps; do
  case $s in
    events) step events 200 "$work/events/qwen35-bwd-bwd.jsonl" \
      bwd --sweep qwen35-bwd --backends "$backends" --timers events --out "$work/events" --no-report ;;
    edge) step edge 220 "$work/edge/numerics/check-bwd.jsonl" \
      check --sweep edge --mode bwd --backends qla,fla --out "$work/edge" ;;
    train) step train 200 "$work/train/qwen35-bwd-train.jsonl" \
      bwd --mode train --sweep qwen35-bwd --backends "$backends" --timers events --out "$work/train" --no-report ;;
    *) echo "unknown step $s (events, edge, train)"; exit 2 ;;
  esac
done
