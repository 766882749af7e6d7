#!/usr/bin/env bash
# On the H200 host, after a run: pack the compile/autotune caches into $OUT/qla-cache-*.tgz so the next
# session can carry them back in .gpuhost/ (.ci/gpu-host-setup.sh unpacks every .gpuhost/qla-cache*.tgz).
# The FlashInfer module is carried separately (.gpuhost/flashinfer-gdn-sm90.tar.xz), so it is left out, and
# so are Triton's intermediate forms (IRs, PTX), which a cache hit does not read: the carry limit is 64 MiB
# with the 45 MB bundle. TileLang's kernel entries stay whole (it treats an entry missing a file as a miss);
# its cuda-binaries folder (nvcc outputs, read only while compiling) and staging folders are left out.
set -u
: "${OUT:?OUT must name the folder that comes back}"
: "${QLA_CACHE_DIR:?source .ci/gpu-host-setup.sh first}"
# A file coming back from the host may be at most 16 MiB: Triton's cache in one archive, TileLang's kernel
# entries in two (keys 0-7 and 8-f).
X="--exclude=*.ttir --exclude=*.ttgir --exclude=*.llir --exclude=*.ptx --exclude=*.source"
cd "$QLA_CACHE_DIR" || exit 1
[ -d triton ] && tar $X -czf "$OUT/qla-cache-triton.tgz" triton
K=tilelang/0.1.15/linux-x86_64/kernels
for half in 0-7 8-f; do
  set -- $K/[$half]*
  [ -e "$1" ] && tar -czf "$OUT/qla-cache-tilelang-$half.tgz" "$@"
done
cd - >/dev/null
du -h "$OUT"/qla-cache-*.tgz
