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

# ab NAME LIMIT HEADS [VAR=value ...]: $AB_BACKENDS (default qla) on those head configs' qwen35-fwd mixes
# (CUDA events), rows copied back to $dest/NAME.jsonl.
ab() {
  local name=$1 limit=$2 heads=$3; shift 3
  local budget; budget=$(left)
  (( budget < limit )) && limit=$budget
  if (( limit < 20 )); then echo "skip $name: out of time"; return; fi
  env "$@" timeout -s KILL "$limit" python cli.py fwd --backends "${AB_BACKENDS:-qla}" --sweep qwen35-fwd \
    --heads "$heads" --timers events --out "/tmp/$name" --no-report > "$dest/$name.log" 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - t0 )) s"
  cat /tmp/$name/*.jsonl > "$dest/$name.jsonl" 2>/dev/null
}

# Session 26 (S26_V10=1): kkt v10, the forward-only stage 1 with the gate inside L and fp16 whole-tile doublings
# (compiled on the CPU, never run): Agb against float64 and v4t's, the inference forward with it against float64,
# stage 1 and forward timings against v4t, then the harness's rows on the many-head configs FlashInfer leads, v4t
# first, v10 second; the profile builds of v10 and v4 (phases per CTA). Cache: `--only "kkt v10"`, `--only "kkt v4t agb"`,
# `--only "kkt v4 profile"`, `--only "ws rev9"`, `--only "cp combine"`.
if [ -n "${S26_V10:-}" ]; then
  step v10-check 200 tests/gpu/test_qla_kkt_v10.py -k "not time and not profile"
  step v10-timing 150 tests/gpu/test_qla_kkt_v10.py -k time
  step v10-profile 120 tests/gpu/test_qla_kkt_v10.py -k profile
  ab v10-base-rows 100 "${V10_HEADS:-16/64,8/32}"
  ab v10-rows 100 "${V10_HEADS:-16/64,8/32}" QLA_KKT_IMPL=v10
  exit 0
fi

# Session 26 (S26_VS4=1): vs4, the one-kernel forward with kkt v10's inverse in its auxiliary warpgroup (compiled on
# the CPU, never run): its float64 cases, the WG1/WG3 profile beside vs2's and vs3's, the forward's time against
# kkt + ws12 and vs3. Cache: `--only vs4`, `--only vs3`, `--only "vs2 profile"`, `--only "vs3 profile"`,
# `--only "ws rev9 bv128"`, `--only "kkt v4t agb"`.
if [ -n "${S26_VS4:-}" ]; then
  step vs4-check 150 tests/gpu/test_qla_fused_ws.py -k "vs4 and not timing and not profile"
  step vs4-profile 180 tests/gpu/test_qla_fused_ws.py -k test_profile_vs_phases
  STEP_ENV=WS_TIMING_IMPLS=ws12,vs3,vs4 step vs4-timing 150 tests/gpu/test_qla_fused_ws.py -k test_time_fused_variants
  exit 0
fi

# Session 25 (S25_VS3=1): vs3, the one-kernel forward's auxiliary warpgroup with its gate scan by warp shuffles under
# Q K^T (fused_fwd_vs's fast_gates; compiled on the CPU, never run): its float64 cases (bf16, fp16, GVA 1-4, T = 1,
# T = 65, ragged, an initial state), then the profile build beside vs2's on the same inputs (WG3's phases: did the
# scan's ~1.4 K and the gate vectors' ~0.5 K cycles a chunk go?), then the whole forward's time against kkt + ws12
# and vs2. Cache: `--only vs3`, `--only "vs2 bfloat16"`, `--only "vs2 profile"`, `--only "vs3 profile"`,
# `--only "ws rev9 bv128"`, `--only "kkt v4t agb"`.
if [ -n "${S25_VS3:-}" ]; then
  step vs3-check 150 tests/gpu/test_qla_fused_ws.py -k "vs3 and not timing and not profile"
  step vs3-profile 120 tests/gpu/test_qla_fused_ws.py -k test_profile_vs_phases
  STEP_ENV=WS_TIMING_IMPLS=ws12,vs2,vs3 step vs3-timing 150 tests/gpu/test_qla_fused_ws.py -k test_time_fused_variants
  exit 0
fi

# Session 24 (S24_WS12=1): stage 0 in the ws12 formation ($QLA_BWD_STATES=ws12: Agb from the stored A0, then the
# rev 9 walk storing its states; prepared on the CPU, off by default): the float64 checks of the whole backward with
# it (plain, then CP), then the harness's qwen35-bwd rows with it and with ws5 on $WS12_HEADS, each checked against
# float64 first: their dg errors against the committed FLA rows of the same inputs are the point (rounding_study_dg_fla
# predicts a median ratio of 0.72-0.90x against ws5's ~1.0x), their times the cost.
if [ -n "${S24_WS12:-}" ]; then
  step ws12-states 60 tests/gpu/test_qla_bwd.py -k chunk_states_ws5_matches_v2  # ws5, ws12 against v2, every chunk
  STEP_ENV=QLA_BWD_STATES=ws12 step ws12-check 200 tests/gpu/test_qla_bwd.py -k "autograd_matches and tilelang"
  STEP_ENV=QLA_BWD_STATES=ws12 step ws12-cp-check 100 tests/gpu/test_qla_bwd_cp.py -k matches_float64
  for v in ws12 ws5; do
    budget=$(left); (( budget < 40 )) && { echo "skip bwd-$v: out of time"; continue; }
    lim=$(( budget < 200 ? budget : 200 ))
    rows=$(mktemp -d /tmp/bwd-$v-XXXX)
    QLA_BWD_STATES=$v timeout -s KILL "$lim" python cli.py bwd --backends qla --sweep qwen35-bwd \
      --heads "${WS12_HEADS:-2/4,4/8}" --timers events --out "$rows" --no-report > "$dest/bwd-$v.log" 2>&1
    echo "bwd-$v rc=$? t=$(( $(date +%s) - t0 )) s"
    cat "$rows"/*.jsonl > "$dest/bwd-$v.jsonl" 2>/dev/null
  done
  exit 0
fi

# Session 23 (S23_CP_PIECES=1): the forward's CP pieces forced ($QLA_CP_PIECE) against the cost model's choice on
# the head configs of FlashQLA's five remaining wins (16/16 1x8192 and 1x2048, 2/8 1x8192, 8/24 4096+28672 and
# 28672+4096), every mix of those heads, one run per piece length.
if [ -n "${S23_CP_PIECES:-}" ]; then
  ab cp-model 120 16/16,2/8,8/24
  for p in 16 32 64; do
    ab "cp-piece$p" 120 16/16,2/8,8/24 QLA_CP_PIECE=$p
  done
  exit 0
fi

# Session 28 (S28_WS=1): the warp-specialised fused backward ($QLA_BWD_FUSED=ws and ws2, bwd/fused_ws.py; CPU-checked
# and compiled, never run): the float64 checks of the whole backward with it (plain, then CP; a hang in its hand-offs
# is killed at the step's limit), the profile build's phases per role (ws and ws2), then the harness's qwen35-bwd rows
# on $WS_HEADS for each of $WS_VARIANTS (default: ws, ws2 and the stages) in one call, then the kernel table at 16/32.
# Cache: `--only "bwd fused ws"` (with its profiles), `--only "pass A"`, plus the staged backward's and the forward's.
# Session 29: WS_CHECK names the variant the float64 checks, the phases and the kernel table run (default ws); for
# ws3, the early-release schedule (CPU-checked and compiled, never run):
#   S28_WS=1 WS_CHECK=ws3 WS_VARIANTS="ws3 ws 0" WS_HEADS=16/32,2/4 bash .ci/gpu-host-kernel-checks.sh
if [ -n "${S28_WS:-}" ]; then
  wc=${WS_CHECK:-ws}
  STEP_ENV=QLA_BWD_FUSED=$wc step $wc-check 200 tests/gpu/test_qla_bwd.py -k "autograd_matches and tilelang"
  STEP_ENV=QLA_BWD_FUSED=$wc step $wc-cp-check 100 tests/gpu/test_qla_bwd_cp.py -k matches_float64
  budget=$(left)
  if (( budget >= 60 )); then  # the roles' phases per chunk (the profile build)
    timeout -s KILL 60 python -m qla_kernels.gdn.profile_bwd --ws "$dest/$wc-phases.json" "$wc" \
      > "$dest/$wc-phases.log" 2>&1
    echo "$wc-phases rc=$? t=$(( $(date +%s) - t0 )) s"
  fi
  for v in ${WS_VARIANTS:-ws ws2 0}; do
    budget=$(left); (( budget < 40 )) && { echo "skip bwd-fused$v: out of time"; continue; }
    lim=$(( budget < 120 ? budget : 120 ))
    rows=$(mktemp -d /tmp/bwd-ws$v-XXXX)
    QLA_BWD_FUSED=$v timeout -s KILL "$lim" python cli.py bwd --backends qla --sweep qwen35-bwd \
      --heads "${WS_HEADS:-16/32,2/4}" --timers events --out "$rows" --no-report > "$dest/bwd-fused$v.log" 2>&1
    echo "bwd-fused$v rc=$? t=$(( $(date +%s) - t0 )) s"
    cat "$rows"/*.jsonl > "$dest/bwd-fused$v.jsonl" 2>/dev/null
  done
  budget=$(left)
  if (( budget >= 30 )); then
    QLA_BWD_FUSED=$wc timeout -s KILL "$budget" python cli.py kernels --mode bwd --backends qla --heads 16/32 \
      --seqlens 1x32768,8192x4 --calls 5 -o "$dest/kernels-$wc" > "$dest/kernels-$wc.log" 2>&1
    echo "kernels-$wc rc=$? t=$(( $(date +%s) - t0 )) s"
  fi
  exit 0
fi

# Session 23 (S23_FUSED=1): the fused backward ($QLA_BWD_FUSED=1, off by default until this runs): the float64
# checks of the whole backward with it (plain, then CP), then the harness's qwen35-bwd rows with it (all 32 configs,
# to set against the committed staged rows of the same GPU; with FUSED_AB=1 instead both ways, one after the other,
# on $FUSED_HEADS), the prefetching walk ($QLA_BWD_FUSED=2) on $PREFETCH_HEADS, then the kernel table at 16/32.
if [ -n "${S23_FUSED:-}" ]; then
  STEP_ENV=QLA_BWD_FUSED=1 step fused-check 200 tests/gpu/test_qla_bwd.py -k "autograd_matches and tilelang"
  STEP_ENV=QLA_BWD_FUSED=1 step fused-cp-check 100 tests/gpu/test_qla_bwd_cp.py -k matches_float64
  variants="1"; heads=""
  [ -n "${FUSED_AB:-}" ] && { variants="1 0"; heads="--heads ${FUSED_HEADS:-16/32,2/4}"; }
  for v in $variants; do
    budget=$(left); (( budget < 40 )) && { echo "skip bwd-fused$v: out of time"; continue; }
    lim=$(( budget < 220 ? budget : 220 ))
    rows=$(mktemp -d /tmp/bwd-fu$v-XXXX)
    QLA_BWD_FUSED=$v timeout -s KILL "$lim" python cli.py bwd --backends qla --sweep qwen35-bwd $heads \
      --timers events --out "$rows" --no-report > "$dest/bwd-fused$v.log" 2>&1
    echo "bwd-fused$v rc=$? t=$(( $(date +%s) - t0 )) s"
    cat "$rows"/*.jsonl > "$dest/bwd-fused$v.jsonl" 2>/dev/null
  done
  budget=$(left)
  if [ -z "${FUSED_AB:-}" ] && (( budget >= 60 )); then  # the walk with its loads prefetched ($QLA_BWD_FUSED=2)
    lim=$(( budget < 130 ? budget : 130 ))
    rows=$(mktemp -d /tmp/bwd-fu2-XXXX)
    QLA_BWD_FUSED=2 timeout -s KILL "$lim" python cli.py bwd --backends qla --sweep qwen35-bwd \
      --heads "${PREFETCH_HEADS:-16/32,2/4}" --timers events --out "$rows" --no-report > "$dest/bwd-fused2.log" 2>&1
    echo "bwd-fused2 rc=$? t=$(( $(date +%s) - t0 )) s"
    cat "$rows"/*.jsonl > "$dest/bwd-fused2.jsonl" 2>/dev/null
  fi
  budget=$(left)
  if (( budget >= 30 )); then  # where the fused backward's time goes (torch.profiler's kernel table)
    QLA_BWD_FUSED=1 timeout -s KILL "$budget" python cli.py kernels --mode bwd --backends qla --heads 16/32 \
      --seqlens 1x32768,8192x4 --calls 5 -o "$dest/kernels-fused" > "$dest/kernels-fused.log" 2>&1
    echo "kernels-fused rc=$? t=$(( $(date +%s) - t0 )) s"
  fi
  exit 0
fi

# Session 22 (S22_OVERLAP=1): stage 0 beside stage 1 ($QLA_BWD_OVERLAP, off by default until this runs): its
# bit-equality test (plain and CP, eager and from a captured CUDA graph), then the harness's qwen35-bwd rows with
# the overlap on and off, one after the other, on $OVERLAP_HEADS (default: the few-head configs where the two
# stages leave SMs idle; all four for the whole sweep's answer).
if [ -n "${S22_OVERLAP:-}" ]; then
  step overlap-test 100 tests/gpu/test_qla_bwd_cp.py -k beside
  for v in 1 0; do
    budget=$(left); (( budget < 40 )) && { echo "skip bwd-overlap$v: out of time"; continue; }
    lim=$(( budget < 200 ? budget : 200 ))
    rows=$(mktemp -d /tmp/bwd-ov$v-XXXX)
    QLA_BWD_OVERLAP=$v timeout -s KILL "$lim" python cli.py bwd --backends qla --sweep qwen35-bwd \
      --heads "${OVERLAP_HEADS:-2/4,4/8,8/16}" --timers events --out "$rows" --no-report > "$dest/bwd-overlap$v.log" 2>&1
    echo "bwd-overlap$v rc=$? t=$(( $(date +%s) - t0 )) s"
    cat "$rows"/*.jsonl > "$dest/bwd-overlap$v.jsonl" 2>/dev/null
  done
  exit 0
fi

# Session 21 (S21_NCU=1): Nsight Compute on the backward's kernels of FlashQLA and qla, one config
# ($NCU_HEADS, $NCU_SEQLENS; default 16/32 x 8192), warm (the harness's `kernels --profiler ncu-range` runs the
# calls inside a profiler range after its numerics check and warm-up): does FlashQLA's fused kernel (155 KB of
# code, like stage 2 rev 11) lose issue slots to instruction fetch too? Reports' details pages and the
# warp-stall samples to $dest.
if [ -n "${S21_NCU:-}" ]; then
  for b in ${NCU_BACKENDS:-flashqla qla}; do
    budget=$(left); (( budget < 60 )) && { echo "skip ncu-$b: out of time"; continue; }
    lim=$(( budget < 240 ? budget : 240 ))
    timeout -s KILL "$lim" ncu --clock-control none --profile-from-start off --set full \
      -k "regex:${NCU_KERNELS:-fused_chunk_gdr_bwd|bwd_chunk_grads|bwd_dstate}" -c "${NCU_COUNT:-3}" \
      -o "$dest/ncu-bwd-$b" python cli.py kernels --heads "${NCU_HEADS:-16/32}" --seqlens "${NCU_SEQLENS:-8192}" \
      --backends "$b" --mode bwd --calls 1 --profiler ncu-range --out "$dest/kprof-$b" > "$dest/ncu-bwd-$b.log" 2>&1
    echo "ncu-$b rc=$? t=$(( $(date +%s) - t0 )) s"
    ncu --import "$dest/ncu-bwd-$b.ncu-rep" --page details > "$dest/ncu-bwd-$b-details.txt" 2>&1
    ncu --import "$dest/ncu-bwd-$b.ncu-rep" --page raw --csv \
      --metrics "regex:smsp__pcsamp_warps_issue_stalled_.*,sm__cycles_elapsed.avg,smsp__inst_executed.sum" \
      > "$dest/ncu-bwd-$b-stalls.csv" 2>&1
    rm -f "$dest/ncu-bwd-$b.ncu-rep"  # megabytes each: the two text pages are what comes back
  done
  exit 0
fi

# Session 19, calls 3-5 (S19_REV7=1): a stage 2 revision against the default: the float64 checks of the whole
# backward (plain and CP) with NEW set, the group sum against torch's, stage 2's phases (PHASE_REVS), every
# kernel of the backward with NEW, then the harness's qwen35-bwd rows (qla, 32 configs) for the default and NEW.
# Call 3/4: NEW="QLA_BWD_GRADS=rev7 QLA_BWD_GROUP_SUM=kernel" (then the defaults); call 5: NEW=QLA_BWD_GRADS=rev8.
# Session 20: NEW=QLA_BWD_GRADS=rev9 PHASE_REVS=none (rev 9's profile build is rev 8's) adds the stage 2 rev 9
# equality test to the checks; NEW=QLA_BWD_DSTATE=rev5 runs stage 1 rev 5 the same way. Session 21:
# NEW=QLA_BWD_GRADS=rev11 PHASE_REVS=none (rev 11 has no profile build) adds its comparison with rev 8. Session 22:
# NEW=QLA_BWD_GRADS=rev12 (or rev13) PHASE_REVS=none: stage 2 with FlashQLA's GEMM savings (no profile build).
if [ -n "${S19_REV7:-}" ]; then
  NEW=${NEW:-QLA_BWD_GRADS=rev8}
  STEP_ENV=$NEW step bwd-new-check 200 tests/gpu/test_qla_bwd.py \
    -k "autograd_matches and tilelang or group_sum_kernel or rev9_sums or rev11_matches"
  STEP_ENV=$NEW step bwd-cp-new-check 120 tests/gpu/test_qla_bwd_cp.py -k matches_float64
  if [ "${PHASE_REVS:-}" != none ]; then
    timeout -s KILL 90 python -m qla_kernels.gdn.profile_bwd /tmp/bwd_stage2_phases.json "${PHASE_REVS:-rev7,rev8}" \
      > "$dest/bwd-phases.log" 2>&1
    echo "bwd-phases rc=$? t=$(( $(date +%s) - t0 )) s"
  fi
  env $NEW timeout -s KILL 90 python -m qla_kernels.gdn.profile_bwd --kernels /tmp/bwd_kernels.json \
    > "$dest/bwd-kernels.log" 2>&1
  echo "bwd-kernels rc=$? t=$(( $(date +%s) - t0 )) s"
  for variant in default new; do
    budget=$(left); (( budget < 40 )) && { echo "skip bwd-$variant: out of time"; continue; }
    lim=$(( budget < 170 ? budget : 170 ))
    extra=""; [ "$variant" = new ] && extra=$NEW
    rows=$(mktemp -d /tmp/bwd-$variant-XXXX)  # fresh: the CLI resumes from rows already in its --out folder
    env $extra timeout -s KILL "$lim" python cli.py bwd --backends qla --sweep qwen35-bwd \
      --timers events --out "$rows" --no-report > "$dest/bwd-$variant.log" 2>&1
    echo "bwd-$variant rc=$? t=$(( $(date +%s) - t0 )) s"
    cat "$rows"/*.jsonl > "$dest/bwd-$variant.jsonl" 2>/dev/null
  done
  exit 0
fi

# Session 19, call 2 (S19_BWD=1): where the backward's time goes before changing it: every kernel of one
# whole backward (torch.profiler), stage 2's phases (profile build, rev 6), and the backward's CP timings for
# a refit of bwd_cp_plan with the faster combine (NOTES "Next" 0.d).
if [ -n "${S19_BWD:-}" ]; then
  timeout -s KILL 150 python -m qla_kernels.gdn.profile_bwd --kernels "$dest/bwd_kernels.json" > "$dest/bwd-kernels.log" 2>&1
  echo "bwd-kernels rc=$? t=$(( $(date +%s) - t0 )) s"
  timeout -s KILL 90 python -m qla_kernels.gdn.profile_bwd "$dest/bwd_stage2_phases.json" rev6 > "$dest/bwd-phases.log" 2>&1
  echo "bwd-phases rc=$? t=$(( $(date +%s) - t0 )) s"
  step bwd-cp-timing 240 tests/gpu/test_qla_bwd_cp.py -k time_bwd_cp
  exit 0
fi

# Session 19, call 1 (S19=1): the float64 checks session 18 left unrun on the new combine default (rev 2 at
# 32 columns: the real-state-pass combine check, the CP forward's edge cases), then on an H200 the forward's
# committed rows at this commit (events and the edge sweep, T = 1 included), or on an H100 the 256-thread
# combine A/B and the CP choice for the 2/8 mixes FlashQLA still leads ($QLA_CP_MIXES).
if [ -n "${S19:-}" ]; then
  step combine-check 90 tests/gpu/test_qla_cp.py -k "combine_kernel_matches and 2-32"
  step cp-forward-check 150 tests/gpu/test_qla_cp.py -k "cp_forward_matches_reference and kernel and ws12"
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    OUT=$dest FWD_STEPS="events edge" bash .ci/gpu-host-fwd-results.sh "$(left)"
  else
    QLA_CP_MIXES="2/8:1024+7168,2/8:7168+1024,2/8:8192,4/16:8192" step cp-mixes-s19 120 tests/gpu/test_qla_cp.py \
      -k "time_cp_mixes and harness"
    timeout -s KILL 60 python -m qla_kernels.gdn.profile_cp --combine "$dest/cp_combine_t256.json" \
      > "$dest/combine-profile-t256.log" 2>&1
    echo "combine-profile rc=$? t=$(( $(date +%s) - t0 )) s"
    ab cp-t256 60 2/8 QLA_CP_COMBINE_THREADS=256
    ab cp-t128 60 2/8 QLA_CP_COMBINE_THREADS=128
  fi
  exit 0
fi

# Session 18, call 3 (COMBINE_T256=1): rev 2 at 32 columns with 256 threads (ncu, call 2: one warp per
# scheduler, issue-latency bound on the M split's per-element instructions) against 128, per link and
# through the harness on 2/8.
if [ -n "${COMBINE_T256:-}" ]; then
  timeout -s KILL 60 python -m qla_kernels.gdn.profile_cp --combine "$dest/cp_combine_revs3.json" \
    > /tmp/combine-profile3.log 2>&1
  echo "combine-profile rc=$? t=$(( $(date +%s) - t0 )) s"
  ab cp-t256 50 2/8 QLA_CP_COMBINE_REV=2 QLA_CP_COMBINE_BV=32 QLA_CP_COMBINE_THREADS=256
  ab cp-t128 50 2/8 QLA_CP_COMBINE_REV=2 QLA_CP_COMBINE_BV=32 QLA_CP_COMBINE_THREADS=128
  exit 0
fi

# Session 18, call 2 (COMBINE_BV32=1): revs 2 and 3 at 32-column V-slices (call 1: 32 columns 1.026x faster
# than 64 on 2/8's whole forward; rev 3's prefetch slower than rev 2 per link), and Nsight Compute's reading
# of rev 2 at 32 columns on 2/8 1x32768. At most 8 files come back: the rest stays in /tmp.
if [ -n "${COMBINE_BV32:-}" ]; then
  timeout -s KILL 60 python -m qla_kernels.gdn.profile_cp --combine "$dest/cp_combine_revs2.json" \
    > /tmp/combine-profile2.log 2>&1
  echo "combine-profile rc=$? t=$(( $(date +%s) - t0 )) s"; grep -c rev /tmp/combine-profile2.log
  ab cp-rev2-bv32 70 2/8,4/16 QLA_CP_COMBINE_REV=2 QLA_CP_COMBINE_BV=32
  ab cp-rev3-bv32 70 2/8,4/16 QLA_CP_COMBINE_REV=3 QLA_CP_COMBINE_BV=32
  QLA_CP_COMBINE_REV=2 QLA_CP_COMBINE_BV=32 timeout -s KILL 120 ncu --clock-control none --profile-from-start off \
    --set full -k regex:cp_combine -o "$dest/ncu-combine-rev2-bv32" \
    python -m qla_kernels.gdn.profile_ncu fwd 2 8 32768 > /tmp/ncu.log 2>&1
  echo "ncu rc=$? t=$(( $(date +%s) - t0 )) s"; tail -3 /tmp/ncu.log
  timeout 60 ncu --import "$dest/ncu-combine-rev2-bv32.ncu-rep" --page details > "$dest/ncu-combine-details.txt" 2>&1
  exit 0
fi

# Session 18, call 1 (the plain run): CP's combine (wgmma on tfloat32 operands; rev 2 at 32 columns is now
# the default, so "cp-rev3" below runs the default and "cp-bv32" repeats it): every revision against the host
# walk on a real state pass, per-link times, the few-head CP configs through the harness against FlashQLA,
# the CP mixes at every piece length with the harness's gates (the cost model's data) and the CP forward's
# float64 cases.
step combine-check 120 tests/gpu/test_qla_cp.py -k combine_kernel_matches
timeout -s KILL 60 python -m qla_kernels.gdn.profile_cp --combine "$dest/cp_combine_revs.json" \
  > "$dest/combine-profile.log" 2>&1
echo "combine-profile rc=$? t=$(( $(date +%s) - t0 )) s"
AB_BACKENDS=qla,flashqla ab cp-rev3 220 2/8,4/16
ab cp-bv32 90 2/8,4/16 QLA_CP_COMBINE_BV=32
ab cp-rev1 90 2/8,4/16 QLA_CP_COMBINE_REV=1
step cp-mixes 150 tests/gpu/test_qla_cp.py -k "time_cp_mixes and harness"
step cp-forward-check 120 tests/gpu/test_qla_cp.py -k "cp_forward_matches_reference and kernel and ws12"
