"""Stage 1, v7: the chunk-local cumsum of g and A0 = (I + L)^-1, L = StrictLower(diag(beta) K K^T), with the
off-diagonal part of the inverse as four 64x64 products on bf16 wgmma instead of v4's eight 32-row 3xTF32
products on mma.sync.

Why: Nsight Compute on the H200 (session 10, 16/64 8192x4) reads v4 as bound by shared memory, not by its
arithmetic: L1 throughput 94 %, 3490 shared-memory wavefronts per CTA (34 % of them bank conflicts), the
scalar LDS that feed the tf32 mma.sync operands and the scalar split stores of the 32-wide hi/lo buffers.
wgmma reads its operands from shared memory itself (no LDS), and bf16 operands are half the bytes.

Algorithm. With B = blockdiag(I + L_bb) (the four 16x16 diagonal blocks), X = B^-1 (per-thread forward
substitution, as v4) and L_off the strictly block-lower part of L,
    I + L = B (I + N),  N = X L_off  (strictly block-lower, so N^4 = 0),
    A0 = (I + N)^-1 X = (I - N + N^2 - N^3) X = (Q - N Q) X,  Q = I + N^2.
Block (i, j) of (I + N)^-1 holds exactly the terms of the block-triangular inverse (e.g. block (2, 0) is
N21 N10 - N20), so the association changes, not the cancellation. Four products: N = X L_off, N^2 = N N,
R = N Q, A0 = (Q - R) X, each as three bf16 GEMMs over split operands x = hi + lo (hi = bf16(x), lo =
bf16(x - hi)): A B ~ A_lo B_hi + A_hi B_lo + A_hi B_hi with fp32 accumulation, ~2^-16 relative to |A||B|
(v4's 3xTF32 is ~2^-21; A0 is stored in bf16, 2^-9). tests/kernels/test_kkt_v7_algorithm.py reproduces the
roundings in float64 on the CPU.

One CTA per (chunk, value head), 128 threads (one warpgroup: wgmma M = 64). No C-backend build: that
backend has no bf16; the CPU test checks the algorithm's emulation and the sm_90a compile.

Measured on the H200 (session 10; NOTES.md): every variant's A0 is as accurate as v2's on all eight stage-1
cases. v7 and v7a are 12-14 % slower than v4 (0.657 against 0.579 ms at 16/64 8192x4): the four dense
64x64 products read more operand bytes than v4's block recursion saved, so shared-memory wavefronts per CTA
stayed at v4's count (bank conflicts fell from 34 % to 7 %). v7b, which drops the 64x64 pass that built X,
is 0.5-3 % faster than v4 on seven configs (0.570 ms there): not enough to replace v4 without a full sweep.
"""

import tilelang
import tilelang.language as T

CHUNK = 64
BLK = 16
LPAD = 8  # L's row padding (floats), as v4's lean scatter
PAD = BLK + 1  # row stride of the diagonal inverses X_b (fp32)

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}


def kkt_solve_v7_program(dk: int, dtype: str, min_blocks_per_sm: int = 0, one_wait: bool = False, lean_x: bool = False):
    """TileLang program with kkt_solve_v3_program's signature: (k, g, beta, cu_seqlens, chunk_indices) ->
    (g_cumsum, A0). Varlen layout (B = 1); head counts are runtime values. dtype is the input's (bf16 or
    fp16); the products run in bf16 either way (fp16's range is too small for the split's low parts).

    one_wait=True (v7a) issues each product's three split GEMMs back to back (T.wgmma_gemm, which chain on
    the accumulator in issue order) and waits once, instead of a wait after each (T.gemm's implicit wait).
    lean_x=True (with one_wait: v7b) has the diagonal-solve threads write their columns of X straight into
    X's split operand (zero-filled first) instead of through a stacked fp32 buffer and a 64x64 pass whose
    scalar bf16 stores Nsight Compute counted among v7's shared-memory traffic (session 10, call 5)."""
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"
    op = "bfloat16"

    @T.macro
    def split(x, dst_hi, dst_lo, i, j):
        """dst_hi[i, j], dst_lo[i, j] = bf16 x and bf16 of what that rounding left out."""
        hi = T.cast(x, op)
        dst_hi[i, j] = hi
        dst_lo[i, j] = T.cast(x - T.cast(hi, acc), op)

    @T.macro
    def mm3(a_hi, a_lo, b_hi, b_lo, out):
        """out = A B over split operands, small terms first."""
        if one_wait:
            T.wgmma_gemm(a_lo, b_hi, out, clear_accum=True)
            T.wgmma_gemm(a_hi, b_lo, out)
            T.wgmma_gemm(a_hi, b_hi, out)
            T.wait_wgmma(0)
        else:
            T.gemm(a_lo, b_hi, out, clear_accum=True)
            T.gemm(a_hi, b_lo, out)
            T.gemm(a_hi, b_hi, out)

    @T.prim_func
    def kkt_solve_v7(
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
    ):
        with T.Kernel(nc * h_v, threads=128) as (bid,):
            if min_blocks_per_sm > 0:
                T.annotate_min_blocks_per_sm(min_blocks_per_sm)
            bh = T.alloc_var("int32", init=bid % h_v)
            bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
            seq = T.alloc_var("int32", init=chunk_indices[bid // h_v, 0])
            start = T.alloc_var("int32", init=cu_seqlens[seq] + chunk_indices[bid // h_v, 1] * C)
            end = T.alloc_var("int32", init=cu_seqlens[seq + 1])

            k_sh = T.alloc_shared((C, dk), dtype)
            b_sh = T.alloc_shared((C,), acc)
            gc_sh = T.alloc_shared((C,), acc)
            ld_sh = T.alloc_shared((C, C + LPAD), acc)  # L, fp32, for the diagonal solves
            dx_sh = T.alloc_shared((C, PAD), acc)  # the diagonal inverses X_b, stacked 16 wide
            col = T.alloc_local((BLK,), acc)
            # GEMM operands (bf16, hi and lo parts). X is the left factor of N = X L_off and the right factor
            # of A0 = P X, N both factors of N N: TileLang gives a 64-wide bf16 buffer the same 128-byte
            # swizzle in either role (the descriptors differ only in the transpose bit), so one copy each.
            x_hi = T.alloc_shared((C, C), op)
            x_lo = T.alloc_shared((C, C), op)
            l_hi = T.alloc_shared((C, C), op)  # L_off
            l_lo = T.alloc_shared((C, C), op)
            n_hi = T.alloc_shared((C, C), op)
            n_lo = T.alloc_shared((C, C), op)
            q_hi = T.alloc_shared((C, C), op)
            q_lo = T.alloc_shared((C, C), op)
            p_hi = T.alloc_shared((C, C), op)
            p_lo = T.alloc_shared((C, C), op)
            a_out = T.alloc_shared((C, C), dtype)
            kk = T.alloc_fragment((C, C), acc)
            q = T.alloc_fragment((C, C), acc)
            r = T.alloc_fragment((C, C), acc)

            # K tile unmasked (v4's argument: beta = 0 past the sequence end zeroes those rows of L, and a
            # column j past the end only meets rows i > j, also past the end)
            k_ready = T.alloc_barrier(arrive_count=32)
            if T.get_thread_binding() < 32:
                T.tma_copy(k[0, start : start + C, bhg, 0:dk], k_sh, barrier=k_ready)
                T.barrier_arrive(k_ready)
            for i in T.Parallel(C):
                if start + i < end:
                    b_sh[i] = beta[0, start + i, bh]
                    gc_sh[i] = g[0, start + i, bh]
                else:
                    b_sh[i] = 0.0
                    gc_sh[i] = 0.0
            T.barrier_wait(k_ready, 0)
            T.cumsum(src=gc_sh, dim=0)
            T.gemm(k_sh, k_sh, kk, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                kk[i, j] = T.if_then_else(i > j, kk[i, j] * b_sh[i], 0.0)
            # L_off's operand straight from the registers; L in fp32 for the diagonal solves
            for i, j in T.Parallel(C, C):
                split(T.if_then_else(i // BLK > j // BLK, kk[i, j], 0.0), l_hi, l_lo, i, j)
            T.copy(kk, ld_sh[0:C, 0:C])

            # X_b = (I + L_bb)^-1: thread (block b, column c) by forward substitution in fp32 registers
            if lean_x:
                T.clear(x_hi)
                T.clear(x_lo)
            tx = T.get_thread_binding()
            if tx < 4 * BLK:
                for i in T.unroll(BLK):
                    col[i] = T.if_then_else(tx % BLK == i, 1.0, 0.0)
                    for j in T.unroll(i):
                        col[i] = col[i] - ld_sh[tx // BLK * BLK + i, tx // BLK * BLK + j] * col[j]
                for i in T.unroll(BLK):
                    if lean_x:
                        split(col[i], x_hi, x_lo, tx // BLK * BLK + i, tx)
                    else:
                        dx_sh[tx // BLK * BLK + i, tx % BLK] = col[i]

            # operands of N = X L_off
            if not lean_x:
                for i, j in T.Parallel(C, C):
                    split(T.if_then_else(i // BLK == j // BLK, dx_sh[i, j % BLK], 0.0), x_hi, x_lo, i, j)
            mm3(x_hi, x_lo, l_hi, l_lo, r)  # N
            for i, j in T.Parallel(C, C):
                split(r[i, j], n_hi, n_lo, i, j)
            mm3(n_hi, n_lo, n_hi, n_lo, q)  # N^2
            for i, j in T.Parallel(C, C):
                q[i, j] = q[i, j] + T.if_then_else(i == j, 1.0, 0.0)  # Q = I + N^2
                split(q[i, j], q_hi, q_lo, i, j)
            mm3(n_hi, n_lo, q_hi, q_lo, r)  # R = N Q
            for i, j in T.Parallel(C, C):
                split(q[i, j] - r[i, j], p_hi, p_lo, i, j)  # P = (I + N)^-1 = Q - R
            mm3(p_hi, p_lo, x_hi, x_lo, r)  # A0 = P X

            for i, j in T.Parallel(C, C):
                a_out[i, j] = T.cast(r[i, j], dtype)
            if start + C <= end:
                T.copy(a_out, a0[0, start : start + C, bh, 0:C])
            else:
                for i, j in T.Parallel(C, C):
                    if start + i < end:
                        a0[0, start + i, bh, j] = a_out[i, j]
            for i in T.Parallel(C):
                if start + i < end:
                    g_cumsum[0, start + i, bh] = gc_sh[i]

    return kkt_solve_v7


kkt_solve_v7_kernel = tilelang.jit(kkt_solve_v7_program, pass_configs=PASS_CONFIGS)
