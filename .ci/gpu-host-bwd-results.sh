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
prefix=bwd
# shellcheck source=.ci/gpu-host-results-lib.sh
source "$(dirname "$0")/gpu-host-results-lib.sh"
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
