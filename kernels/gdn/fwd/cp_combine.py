"""Context parallelism's combine step as one kernel (session 7; the default since session 8).

cp.combine walks each split sequence's pieces on the host, one batched GEMM launch per link
S_{p+1} = M_p S_p + h_p. On the H200 host that costs ~40 us of launch time per link (NOTES.md, session 7):
the whole combine of 2/8 x 32768 at 64-chunk pieces took 0.30 ms against 0.16 ms for the state pass and
0.15 ms for the fused walk, and with shorter pieces it made CP slower than no CP. Here one CTA per
(sequence, value head, V-slice of block_v columns) keeps its slice of S in registers and walks the
sequence's pieces itself: per link it loads M_p [K, K] from the state pass's [h | M], splits M_p and S
into tf32 hi + lo parts (3xTF32: lo*hi + hi*lo + hi*hi, fp32 accumulate, fp32-level products as in
kkt_solve_v3) and adds h_p. One launch for the whole combine.

rev 2 (session 18): a link took ~10.5 us on the H200 (session 8) for ~3 M tf32 multiply-adds. rev 1 loads M_p
with 128 scalar loads a thread and multiplies on mma.sync with per-k shared-memory loads of S's fragments
(TileLang lowers fp32 operands to mma.sync; its wgmma path needs operands of dtype tfloat32, A K-major and B
transposed). rev 2 stages M_p through registers in two 64-row vector copies and stores its hi and lo parts as
tfloat32, keeps S's parts transposed ([block_v, K], K-major) so the three products run on wgmma, and starts each
link's accumulator from h_p's slice instead of adding h_p after the products. rev 3 also prefetches the next
link's first half of M_p during the products (255 registers): slower than rev 2 (H100, session 18).
Measured per link (H100, 2/8 x 32768 at 64-chunk pieces, profile_cp --combine): rev 1 11.3 us, rev 2 9.9,
rev 3 10.5; at block_v = 32 rev 2 7.8 and rev 3 8.3. Nsight Compute (rev 2, block_v = 32): one warp per
scheduler, 4.75 % of issue slots busy, ~4.7 cycles between a warp's instructions: latency-bound on the
per-element work of the M split, not on the products; a 3-way bank conflict on its shared stores.

cpu_debug=True builds the same program for TileLang's C backend (GEMMs as loops with mma.sync's tf32
operand truncation), so its indexing runs against float64 on a CPU (tests/kernels/test_cp_combine_cpu.py).
"""

import tilelang  # no `from __future__ import annotations`: TVMScript reads the annotations' closure names
import tilelang.language as T

from ..plan import CP_COMBINE_BLOCK_V as BLOCK_V  # noqa: F401 (the default width, read by tests and tools)
from ..plan import CP_COMBINE_REV as REV
from ..plan import CP_COMBINE_THREADS as THREADS
from .kkt_solve_v3 import _tf32_hi, _tf32_operand, tf32_loop_gemm

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}
# THREADS (128): 256 builds (rev 2, block_v = 32: 253 registers, no spills) but is not measured.
# sm_90a builds (ptxas -v): rev 1 at block_v = 64 needs 233-235 registers and no spills, 192 KiB of shared memory
# (at 32 it spilled 336 B); rev 2 at 64 needs 168, at 32 180 (160 KiB), no spills. block_v = 32 doubles the CTAs
# and halves each one's products and S work (the M split stays): rev 2 7.8 us a link against 9.9 at 64.
# BLOCK_V = 32 and REV = 2 (plan.py); revs 1 and 3 are kept for A/B ($QLA_CP_COMBINE_REV in api.py).


@T.macro
def _tf32_loop_gemm_bt(a, bt, out, clear):
    """CPU stand-in for T.gemm(a, bt, out, transpose_B=True) on fp32 operands (cpu_debug builds)."""
    for i, j in T.Parallel(a.shape[0], bt.shape[0]):
        if clear:
            out[i, j] = 0.0
        for r in T.serial(a.shape[1]):
            out[i, j] = out[i, j] + _tf32_operand(a[i, r]) * _tf32_operand(bt[j, r])


def cp_combine_program(dk: int, dv: int, block_v: int, use_initial_state: bool, cpu_debug: bool = False,
                       rev: int = REV, threads: int = THREADS):  # fmt: skip
    """(hm [P, H_v, K, 2V] fp32, h0 [N, H_v, K, V] fp32, seq_first_piece [N+1] int32) -> init [P, H_v, K, V]:
    the state at the start of every piece (h0, or zeros, for a sequence's first piece)."""
    assert dk == dv, "the transition M is K x K and multiplies S [K, V]: K == V"
    assert dv % block_v == 0
    K = dk
    nv = dv // block_v
    h_v = T.dynamic("h_v")
    np_ = T.dynamic("num_pieces")
    nsp1 = T.dynamic("num_seqs_p1")  # a plain variable in a shape: launchers can only bind those
    nh0 = T.dynamic("num_h0")
    acc = "float32"

    @T.macro
    def mm(a, b, out, clear):
        if cpu_debug:
            if rev >= 2:
                _tf32_loop_gemm_bt(a, b, out, clear)
            else:
                tf32_loop_gemm(a, b, out, clear)
        elif rev >= 2:
            T.gemm(a, b, out, transpose_B=True, clear_accum=clear)
        else:
            T.gemm(a, b, out, clear_accum=clear)

    def alloc_sh(shape):
        return T.alloc_shared(shape, acc, scope="shared") if cpu_debug else T.alloc_shared(shape, acc)

    alloc_acc = alloc_sh if cpu_debug else (lambda shape: T.alloc_fragment(shape, acc))
    # rev 2's GEMM operands: tfloat32 on the GPU (what selects wgmma), plain fp32 in the C backend
    op_dtype = T.tfloat32 if rev >= 2 and not cpu_debug else acc

    def alloc_op(shape):
        return T.alloc_shared(shape, op_dtype, scope="shared") if cpu_debug else T.alloc_shared(shape, op_dtype)

    def as_op(x):
        """x as a GEMM operand value (an exact conversion for hi parts, a rounding of lo parts' low bits)."""
        return x if op_dtype == acc else T.Cast(op_dtype, x)

    @T.prim_func
    def cp_combine(
        hm: T.Tensor((np_, h_v, K, 2 * dv), acc),
        h0: T.Tensor((nh0, h_v, K, dv), acc),
        seq_first_piece: T.Tensor((nsp1,), "int32"),
        init: T.Tensor((np_, h_v, K, dv), acc),
    ):
        with T.Kernel((nsp1 - 1) * h_v * nv, threads=threads) as (bid,):
            seq = T.alloc_var("int32", init=bid // (h_v * nv))
            bh = T.alloc_var("int32", init=(bid // nv) % h_v)
            v0 = T.alloc_var("int32", init=(bid % nv) * block_v)
            first = T.alloc_var("int32", init=seq_first_piece[bid // (h_v * nv)])
            links = T.alloc_var(
                "int32", init=seq_first_piece[bid // (h_v * nv) + 1] - seq_first_piece[bid // (h_v * nv)] - 1
            )
            if rev >= 2:
                m_hi = alloc_op((K, K))
                m_lo = alloc_op((K, K))
                s_hi = alloc_op((block_v, K))  # S^T, K-major: wgmma's transposed B operand
                s_lo = alloc_op((block_v, K))
                m_rows = alloc_acc((K // 2, K))  # half of M_p, staged in registers
            else:
                m_hi = alloc_sh((K, K))
                m_lo = alloc_sh((K, K))
                s_hi = alloc_sh((K, block_v))
                s_lo = alloc_sh((K, block_v))
            s = alloc_acc((K, block_v))  # the running state slice, S[:, v0:v0 + block_v]

            if use_initial_state:
                for i, j in T.Parallel(K, block_v):
                    s[i, j] = h0[seq, bh, i, v0 + j]
            else:
                for i, j in T.Parallel(K, block_v):
                    s[i, j] = 0.0
            for i, j in T.Parallel(K, block_v):
                init[first, bh, i, v0 + j] = s[i, j]
            if rev >= 3:
                T.copy(hm[first, bh, 0 : K // 2, dv : 2 * dv], m_rows)
            for p in T.serial(links):
                if rev >= 2:
                    # S's parts (transposed), then h_p's slice into the accumulator, then M_p's parts
                    for i, j in T.Parallel(K, block_v):
                        s_hi[j, i] = as_op(_tf32_hi(s[i, j]))
                        s_lo[j, i] = as_op(s[i, j] - _tf32_hi(s[i, j]))
                    for i, j in T.Parallel(K, block_v):
                        s[i, j] = hm[first + p, bh, i, v0 + j]
                    for half in T.unroll(2):
                        if rev == 2 or half == 1:  # rev 3 prefetched the first half during the last link
                            T.copy(hm[first + p, bh, half * (K // 2) : (half + 1) * (K // 2), dv : 2 * dv], m_rows)
                        for i, j in T.Parallel(K // 2, K):
                            m_hi[half * (K // 2) + i, j] = as_op(_tf32_hi(m_rows[i, j]))
                            m_lo[half * (K // 2) + i, j] = as_op(m_rows[i, j] - _tf32_hi(m_rows[i, j]))
                    if rev >= 3:
                        # the next link's first half, in flight during the products (piece first + p + 1 is
                        # at most the sequence's last piece: always in bounds)
                        T.copy(hm[first + p + 1, bh, 0 : K // 2, dv : 2 * dv], m_rows)
                    mm(m_lo, s_hi, s, False)
                    mm(m_hi, s_lo, s, False)
                    mm(m_hi, s_hi, s, False)
                else:
                    # M_p, hi and lo parts; then S's, from the registers (S is overwritten by the GEMMs)
                    for i, j in T.Parallel(K, K):
                        m_hi[i, j] = _tf32_hi(hm[first + p, bh, i, dv + j])
                        m_lo[i, j] = hm[first + p, bh, i, dv + j] - _tf32_hi(hm[first + p, bh, i, dv + j])
                    for i, j in T.Parallel(K, block_v):
                        s_hi[i, j] = _tf32_hi(s[i, j])
                        s_lo[i, j] = s[i, j] - _tf32_hi(s[i, j])
                    mm(m_lo, s_hi, s, True)
                    mm(m_hi, s_lo, s, False)
                    mm(m_hi, s_hi, s, False)
                    for i, j in T.Parallel(K, block_v):
                        s[i, j] = s[i, j] + hm[first + p, bh, i, v0 + j]
                for i, j in T.Parallel(K, block_v):
                    init[first + p + 1, bh, i, v0 + j] = s[i, j]

    return cp_combine


cp_combine_kernel = tilelang.jit(cp_combine_program, pass_configs=PASS_CONFIGS)
