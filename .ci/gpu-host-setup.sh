#!/usr/bin/env bash
# Source on the offline H200 host from the repository root:  source .ci/gpu-host-setup.sh
# Unpacks the carried bundle (.gpuhost/bundle.tar.xz, built by ../shared/gpu-host/make-bundle) and makes
# qla_bench and qla_kernels importable without a package index.
mkdir -p /tmp/site
[ -f /tmp/site/.unpacked ] || { tar -C /tmp/site -xJf .gpuhost/bundle.tar.xz && touch /tmp/site/.unpacked; }
mkdir -p /tmp/qla-src
ln -sfn "$PWD/kernels" /tmp/qla-src/qla_kernels
export PYTHONPATH=/tmp/site:/tmp/qla-src:$PWD PYTHONUNBUFFERED=1
# The host's copy has no usable git metadata: rows take the commit from .gpuhost/sha (written at commit time).
[ -z "${QLA_GIT_SHA:-}" ] && [ -f .gpuhost/sha ] && export QLA_GIT_SHA=$(cat .gpuhost/sha)
export QLA_CACHE_DIR=${QLA_CACHE_DIR:-/tmp/qla-cache}
export TILELANG_CACHE_DIR=$QLA_CACHE_DIR/tilelang TRITON_CACHE_DIR=$QLA_CACHE_DIR/triton
export FLASHINFER_WORKSPACE_BASE=$QLA_CACHE_DIR/flashinfer
# Triton keeps autotune choices on disk too (FLA autotunes per shape, 20-40 s each on a cold host).
export TRITON_CACHE_AUTOTUNING=1
# A cache carried back from an earlier host session (.ci/gpu-host-pack-cache.sh wrote it under $OUT):
# the host starts bare each session, and TileLang/Triton compiles are most of a cold sweep's time.
if [ ! -f "$QLA_CACHE_DIR/.unpacked" ]; then
  mkdir -p "$QLA_CACHE_DIR"
  for _c in .gpuhost/qla-cache*.tgz; do [ -f "$_c" ] && tar -C "$QLA_CACHE_DIR" -xzf "$_c"; done
  touch "$QLA_CACHE_DIR/.unpacked"; unset _c
fi
# Prebuilt FlashInfer 0.6.9 GDN prefill module (.ci/build-flashinfer-gdn.sh), when carried in .gpuhost/:
# skips FlashInfer's ~13-minute JIT build on the host.
_fi_so=$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/0.6.9/90a/cached_ops/gdn_prefill_sm90/gdn_prefill_sm90.so
if [ -f .gpuhost/flashinfer-gdn-sm90.tar.xz ] && [ ! -f "$_fi_so" ]; then
  mkdir -p "$FLASHINFER_WORKSPACE_BASE" && tar -C "$FLASHINFER_WORKSPACE_BASE" -xJf .gpuhost/flashinfer-gdn-sm90.tar.xz
fi
unset _fi_so
