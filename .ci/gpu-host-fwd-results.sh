#!/usr/bin/env bash
# On the GPU host (H200 or H100: the CLI takes the GPU's name from the device), from the repository root,
# after `source .ci/gpu-host-setup.sh`: the forward's committed
# measurements at this commit, each step under its own time limit so a slow step cannot eat the call:
#   1. qwen35-fwd, qla only, CUDA events (~65 s with the TileLang cache carried),
#   2. the edge-case numerics check, qla against FLA (~160 s: FLA autotunes each shape on a cold host),
#   3. qwen35-fwd, qla only, CUDA graphs (~130-150 s), with whatever time is left.
# The baselines' rows are already in results/H200/qwen35-fwd-fwd.jsonl (they do not change with our commits).
#   bash .ci/gpu-host-fwd-results.sh [SECONDS_TOTAL]      (default 560)
# Logs and rows go to $OUT (or ./fwd-results without $OUT), named fwd-<step>.*; append the rows to
# results/H200/qwen35-fwd-fwd.jsonl and results/H200/numerics/edge-check-fwd.jsonl after reading them.
# A variant under evaluation runs the same way with its switch set (QLA_KKT_IMPL=v4t bash ...): rows record
# the QLA_* variables, and such rows belong under results/H200/dev/, not in the main files.
# FWD_STEPS (default "events edge graph") picks and orders the steps; FWD_BACKENDS (default qla) names the
# timed backends (on a GPU without committed baselines: FWD_BACKENDS=qla,flashqla,fla).
set -u
steps=${FWD_STEPS:-events edge graph}
backends=${FWD_BACKENDS:-qla}
events_limit=${FWD_EVENTS_LIMIT:-130}  # seconds for the events step (more when baselines are timed too)
work=$(mktemp -d /tmp/fwd-XXXX)  # fresh per call: the CLI resumes from rows already in its --out folder
total=${1:-560}
dest=${OUT:-./fwd-results}
mkdir -p "$dest"
prefix=fwd
# shellcheck source=.ci/gpu-host-results-lib.sh
source "$(dirname "$0")/gpu-host-results-lib.sh"
for s in $steps; do
  case $s in
    events) step events "$events_limit" $work/events/qwen35-fwd-fwd.jsonl \
      fwd --sweep qwen35-fwd --backends "$backends" --timers events --out $work/events --no-report ;;
    edge) step edge 220 $work/edge/numerics/check-fwd.jsonl \
      check --sweep edge --backends qla,fla --out $work/edge ;;
    graph) step graph 200 $work/graph/qwen35-fwd-fwd.jsonl \
      fwd --sweep qwen35-fwd --backends "$backends" --timers graph --out $work/graph --no-report ;;
    *) echo "unknown step $s (events, edge, graph)"; exit 2 ;;
  esac
done
