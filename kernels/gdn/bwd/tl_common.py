"""Building blocks shared by the backward's TileLang programs, each with a CPU twin.

cpu_debug=True swaps the GPU-only pieces for ones TileLang's C backend can build (GEMMs as loops with
fp32 sums, register fragments as static shared buffers), so the tests can run a program's own code on
a machine without a GPU; the GPU build is unchanged by it.
"""

import tilelang.language as T

from ..fwd.fused_fwd import LOG2E

ACC = "float32"


def gamma_of(g_sh, i, j):
    """Gamma_ij = exp(g_i - g_j) on i >= j, else 0 (g_sh: the chunk-local log-gate cumsum)."""
    return T.if_then_else(i >= j, T.exp2((g_sh[i] - g_sh[j]) * LOG2E), 0.0)


def build_helpers(cpu_debug: bool):
    """(mm, alloc_sh, alloc_acc) for one program: mm(a, b, out, transpose_a, transpose_b, clear) is
    T.gemm on the GPU; alloc_sh and alloc_acc allocate shared buffers and fp32 accumulators."""

    @T.macro
    def loop_gemm(a, b, out, transpose_a, transpose_b, clear):
        """CPU stand-in for T.gemm(a, b, out, transpose_A, transpose_B, clear_accum) (fp32 sums)."""
        rows = a.shape[1] if transpose_a else a.shape[0]
        inner = a.shape[0] if transpose_a else a.shape[1]
        cols = b.shape[0] if transpose_b else b.shape[1]
        for i, j in T.Parallel(rows, cols):
            if clear:
                out[i, j] = 0.0
            for r in T.serial(inner):
                x = T.cast(a[r, i], ACC) if transpose_a else T.cast(a[i, r], ACC)
                y = T.cast(b[j, r], ACC) if transpose_b else T.cast(b[r, j], ACC)
                out[i, j] = out[i, j] + x * y

    @T.macro
    def mm(a, b, out, transpose_a=False, transpose_b=False, clear=True):
        if cpu_debug:
            loop_gemm(a, b, out, transpose_a, transpose_b, clear)
        else:
            T.gemm(a, b, out, transpose_A=transpose_a, transpose_B=transpose_b, clear_accum=clear)

    def alloc_sh(shape, dt):
        # the C backend wants static shared memory
        return T.alloc_shared(shape, dt, scope="shared") if cpu_debug else T.alloc_shared(shape, dt)

    def alloc_acc(shape):
        return alloc_sh(shape, ACC) if cpu_debug else T.alloc_fragment(shape, ACC)

    return mm, alloc_sh, alloc_acc
