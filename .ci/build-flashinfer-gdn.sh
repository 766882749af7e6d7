#!/usr/bin/env bash
# Build FlashInfer 0.6.9's GDN prefill JIT module (gdn_prefill_sm90: 66 CUTLASS .cu files, sm_90a only)
# ahead of time, on any x86-64 Linux machine with nvcc 13.0 (no GPU needed), and pack it so the H200 host
# skips its ~13-minute JIT build.
#
# Usage (from the repository root):
#   .ci/build-flashinfer-gdn.sh [build|pack|check|all] CACHE_DIR [TARBALL]
#     build  compile into CACHE_DIR (used as FLASHINFER_WORKSPACE_BASE); ninja resumes an interrupted build
#     pack   write TARBALL (default .gpuhost/flashinfer-gdn-sm90.tar.xz) from an already built CACHE_DIR
#     check  unpack TARBALL into a scratch FLASHINFER_WORKSPACE_BASE and load the module through FlashInfer's
#            own JIT path (must print "no work to do" and take seconds; works without a GPU)
#     all    build, pack, check (default)
#   Environment: MAX_JOBS (parallel nvcc, default: nproc), NICE (default 19), CUDA_HOME (default
#   /usr/local/cuda), FI_PYTHON (a python that imports flashinfer 0.6.9; default: python3 if it does,
#   else a venv at ${FI_VENV:-/tmp/fi-venv} is made with --system-site-packages and
#   flashinfer-python==0.6.9 installed there with --no-deps; only the JIT code of flashinfer is used,
#   which needs torch (any build, CPU is fine: only its _GLIBCXX_USE_CXX11_ABI flag is read),
#   apache-tvm-ffi, jinja2, filelock, ninja, packaging).
#   Example, CPU machine with 2 cores (measured 2026-12-02: 3716 s = 62 min at nice 19, nvcc 13.0.88, gcc 12;
#   gives an 8.7 MB .so and a 0.31 MB tarball):
#     MAX_JOBS=2 nohup .ci/build-flashinfer-gdn.sh all /tmp/fi-gdn-cache >/tmp/fi-build.log 2>&1 &
#   Example, on the H200 host (about 13 min on 16 cores, flashinfer comes from the bundle; not tried):
#     source .ci/gpu-host-setup.sh && .ci/build-flashinfer-gdn.sh build "$FLASHINFER_WORKSPACE_BASE"
#
# What the module is (flashinfer/jit/gdn.py, jit/core.py, jit/cpp_ext.py, jit/env.py):
#   flashinfer.gdn_prefill.get_gdn_prefill_module() -> gen_gdn_prefill_sm90_module().build_and_load()
#   JIT .so: $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/0.6.9/90a/cached_ops/gdn_prefill_sm90/gdn_prefill_sm90.so
#   ("90a" comes from the GPU, or from FLASHINFER_CUDA_ARCH_LIST=9.0a when there is none). It is a plain
#   C++/CUDA shared object loaded with tvm_ffi.load_module: it does not link libtorch or libpython (torch is
#   used only for the _GLIBCXX_USE_CXX11_ABI=1 define, the same for torch 2.11 and 2.13), so a build made
#   with Python 3.11/torch 2.13 loads under Python 3.12/torch 2.11. Built here (Debian 12) it NEEDs only
#   libcudart.so.13 (which torch cu130 has already loaded on the host), libstdc++ (GLIBCXX_3.4.29, i.e. GCC >= 11),
#   libm, libgcc_s, libc (GLIBC_2.14); its TVMFFI* symbols resolve from the libtvm_ffi that tvm_ffi loads.
#   build_and_load() always runs ninja on cached_ops/gdn_prefill_sm90/build.ninja before loading (the real
#   one lists this machine's absolute paths and the 66 objects); the file is only written when absent. So
#   the tarball carries the .so plus a build.ninja with no build statements: ninja then has nothing to do
#   and FlashInfer loads the .so. The objects, sources and real build.ninja stay in CACHE_DIR.
#
# On the host (after source .ci/gpu-host-setup.sh, which sets FLASHINFER_WORKSPACE_BASE=$QLA_CACHE_DIR/flashinfer):
#   mkdir -p "$FLASHINFER_WORKSPACE_BASE" && tar -C "$FLASHINFER_WORKSPACE_BASE" -xJf .gpuhost/flashinfer-gdn-sm90.tar.xz
# Alternative that needs no ninja at all: FlashInfer loads a prebuilt "AOT" module when
#   <flashinfer package>/data/aot/gdn_prefill_sm90/gdn_prefill_sm90.so exists (JitSpec.is_aot), e.g.
#   tar -xJOf .gpuhost/flashinfer-gdn-sm90.tar.xz --wildcards '*/gdn_prefill_sm90.so' \
#     | install -D /dev/stdin /tmp/site/flashinfer/data/aot/gdn_prefill_sm90/gdn_prefill_sm90.so
set -euo pipefail

mode=all
case "${1:-}" in build|pack|check|all) mode=$1; shift ;; esac
[ $# -ge 1 ] || { sed -n '6,14p' "$0"; exit 2; }
CACHE_DIR=$(mkdir -p "$1" && cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARBALL=${2:-$ROOT/.gpuhost/flashinfer-gdn-sm90.tar.xz}
FI_VERSION=0.6.9
REL=.cache/flashinfer/$FI_VERSION/90a/cached_ops/gdn_prefill_sm90
SO=$CACHE_DIR/$REL/gdn_prefill_sm90.so

export FLASHINFER_WORKSPACE_BASE=$CACHE_DIR FLASHINFER_CUDA_ARCH_LIST=9.0a
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} MAX_JOBS=${MAX_JOBS:-$(nproc)}
unset FLASHINFER_JIT_VERBOSE FLASHINFER_JIT_DEBUG FLASHINFER_JIT_LINEINFO FLASHINFER_EXTRA_CUDAFLAGS \
  FLASHINFER_EXTRA_CFLAGS FLASHINFER_EXTRA_LDFLAGS FLASHINFER_NVCC CC CXX  # release build, default compilers
export PATH=$CUDA_HOME/bin:$PATH

pick_python() {
  if [ -n "${FI_PYTHON:-}" ]; then echo "$FI_PYTHON"; return; fi
  if python3 -c "import flashinfer.version as v; assert v.__version__ == '$FI_VERSION'" 2>/dev/null; then
    echo python3; return
  fi
  local venv=${FI_VENV:-/tmp/fi-venv}
  if ! "$venv/bin/python" -c "import flashinfer.version" 2>/dev/null; then
    python3 -m venv --system-site-packages "$venv" >&2
    "$venv/bin/pip" install -q --no-deps "flashinfer-python==$FI_VERSION" ninja nvidia-ml-py tabulate >&2
    "$venv/bin/python" -c "import tvm_ffi" 2>/dev/null ||
      "$venv/bin/pip" install -q --no-deps "apache-tvm-ffi==0.1.12" >&2
  fi
  echo "$venv/bin/python"
}

do_build() {
  local py; py=$(pick_python)
  # The link step passes -lcuda. Without a driver (no GPU) there is no libcuda.so: give the linker an
  # empty stub whose soname is libcuda.so.1. The module calls no libcuda symbol itself (CUTLASS reaches
  # the driver through cudaGetDriverEntryPointByVersion), and the .so built here records no libcuda at all.
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so ' && [ ! -e "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
    mkdir -p "$CACHE_DIR/stub"
    [ -e "$CACHE_DIR/stub/libcuda.so" ] ||
      gcc -shared -Wl,-soname,libcuda.so.1 -o "$CACHE_DIR/stub/libcuda.so" -x c /dev/null
    export LIBRARY_PATH=$CACHE_DIR/stub${LIBRARY_PATH:+:$LIBRARY_PATH}
  fi
  echo "== $(date -u +%FT%TZ) building gdn_prefill_sm90 into $CACHE_DIR: MAX_JOBS=$MAX_JOBS nice=${NICE:-19} python=$py"
  local t0=$SECONDS
  # spec.build(verbose=True): ninja prints [done/total] lines; the sources are written into generated/.
  nice -n "${NICE:-19}" "$py" -c "
from flashinfer.jit.gdn import gen_gdn_prefill_sm90_module
spec = gen_gdn_prefill_sm90_module()
print(spec.name, len(spec.sources), 'sources ->', spec.jit_library_path, flush=True)
spec.build(verbose=True)
"
  echo "== $(date -u +%FT%TZ) build done in $((SECONDS - t0)) s"
  [ -f "$SO" ] || { echo "missing $SO"; exit 1; }
  ls -l "$SO"
  readelf -d "$SO" | grep -E 'NEEDED|RPATH|RUNPATH' || true
  if nm -D --undefined-only "$SO" | grep -E ' (Py|_Py|_ZN[0-9]+(c10|at|torch)|THP)' | head -5 | grep -q .; then
    echo "WARNING: the .so references Python or torch symbols: build it on the host instead"
  fi
}

do_pack() {
  [ -f "$SO" ] || { echo "missing $SO: run the build first"; exit 1; }
  local stage; stage=$(mktemp -d)
  mkdir -p "$stage/$REL"
  cp -p "$SO" "$stage/$REL/"
  printf '%s\n' 'ninja_required_version = 1.3' \
    '# Prebuilt gdn_prefill_sm90.so carried by qla-bench .ci/build-flashinfer-gdn.sh: nothing to build.' \
    '# Delete this file and the .so to make FlashInfer rebuild the module from source.' \
    >"$stage/$REL/build.ninja"
  mkdir -p "$(dirname "$TARBALL")"
  tar -C "$stage" --owner=0 --group=0 -cf - .cache | xz -9 -T0 >"$TARBALL"
  rm -rf "$stage"
  echo "== packed $TARBALL: $(stat -c %s "$TARBALL") bytes ($(du -h "$TARBALL" | cut -f1)), .so $(stat -c %s "$SO") bytes"
  tar -tvJf "$TARBALL"
}

do_check() {
  [ -f "$TARBALL" ] || { echo "missing $TARBALL"; exit 1; }
  local py scratch; py=$(pick_python); scratch=$(mktemp -d)
  tar -C "$scratch" -xJf "$TARBALL"
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then  # no driver here: empty stand-in
    gcc -shared -Wl,-soname,libcuda.so.1 -o "$scratch/libcuda.so.1" -x c /dev/null
  fi
  echo "== check: FLASHINFER_WORKSPACE_BASE=$scratch"
  # JIT_VERBOSE=1 shows ninja's output; JIT_DEBUG=0 keeps it from meaning a -G debug build. timeout: a
  # broken tarball would make FlashInfer start the full build instead.
  FLASHINFER_WORKSPACE_BASE=$scratch MAX_JOBS=1 FLASHINFER_JIT_VERBOSE=1 FLASHINFER_JIT_DEBUG=0 \
    LD_LIBRARY_PATH=$scratch:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 300 "$py" -c "
import time
t = time.time()
from flashinfer.jit.gdn import gen_gdn_prefill_sm90_module
import flashinfer.gdn_prefill as g
spec = gen_gdn_prefill_sm90_module()
mod = spec.build_and_load()  # the path get_gdn_prefill_module() takes: ninja (nothing to do), then load
print('loaded', spec.jit_library_path, 'function:', mod.gdn_prefill)
print('get_gdn_prefill_module():', g.get_gdn_prefill_module())
print('seconds: %.1f' % (time.time() - t))
"
  rm -rf "$scratch"
}

case $mode in
  build) do_build ;;
  pack) do_pack ;;
  check) do_check ;;
  all) do_build; do_pack; do_check ;;
esac
