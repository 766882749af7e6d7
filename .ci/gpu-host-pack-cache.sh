#!/usr/bin/env bash
# On the H200 host, after a run: pack the compile/autotune caches into $OUT/qla-cache.tgz so the next
# session can carry them back as .gpuhost/qla-cache.tgz (.ci/gpu-host-setup.sh unpacks it).
# The FlashInfer module is carried separately (.gpuhost/flashinfer-gdn-sm90.tar.xz), so it is left out, and
# so are Triton's intermediate forms (IRs, PTX), which a cache hit does not read: the carry limit is 64 MiB
# with the 45 MB bundle. TileLang's kernel entries stay whole (it treats an entry missing a file as a miss);
# its cuda-binaries folder (nvcc outputs, read only while compiling) and staging folders are left out.
set -u
: "${OUT:?OUT must name the folder that comes back}"
: "${QLA_CACHE_DIR:?source .ci/gpu-host-setup.sh first}"
tar -C "$QLA_CACHE_DIR" --exclude=./flashinfer --exclude=./.unpacked --exclude='*/cuda-binaries' --exclude='.staging' \
  --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.llir' --exclude='*.ptx' --exclude='*.source' -czf "$OUT/qla-cache.tgz" . &&
  du -h "$OUT/qla-cache.tgz"
