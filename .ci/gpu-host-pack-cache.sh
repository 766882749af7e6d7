#!/usr/bin/env bash
# On the H200 host, after a run: pack the compile/autotune caches into $OUT/qla-cache.tgz so the next
# session can carry them back as .gpuhost/qla-cache.tgz (.ci/gpu-host-setup.sh unpacks it).
# The FlashInfer module is carried separately (.gpuhost/flashinfer-gdn-sm90.tar.xz), so it is left out.
set -u
: "${OUT:?OUT must name the folder that comes back}"
: "${QLA_CACHE_DIR:?source .ci/gpu-host-setup.sh first}"
tar -C "$QLA_CACHE_DIR" --exclude=./flashinfer --exclude=./.unpacked -czf "$OUT/qla-cache.tgz" . &&
  du -h "$OUT/qla-cache.tgz"
