"""Stage 1 of the forward: chunk-local cumsum of g and the gate-free WY matrix per 64-token chunk.

    A0 = (I + StrictLower(diag(beta) K K^T))^-1

A0 needs no gate (design/gdn.md), so this kernel never exponentiates; the gate enters later as the
elementwise factor Gamma. One CTA per (chunk, value head). The inverse of the unit lower-triangular
matrix is built blockwise: 16x16 diagonal blocks by forward substitution (one thread per column, in
fp32 registers), then the 32x32 and 64x64 off-diagonal blocks by X21 = -X22 L21 X11. Rows past the end
of a sequence are masked to k = 0, beta = 0, so they never touch valid rows.
"""

import tilelang
import tilelang.language as T

CHUNK = 64
BLK = 16

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}


def kkt_solve_program(dk: int, dtype: str, parallel_cumsum: bool = False):
    """TileLang program: (k, g, beta, cu_seqlens, chunk_indices) -> (g_cumsum, A0). Varlen layout (B=1).

    Head counts are runtime values, so one compiled kernel serves every head configuration.
    parallel_cumsum=True (impl "v2-scan", for measuring only) replaces the one-thread serial cumsum by
    v3's parallel load + warp scan, to tell how much of v3's gain comes from that alone.
    """
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"

    @T.prim_func
    def kkt_solve(
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
    ):
        with T.Kernel(nc, h_v, threads=128) as (bc, bh):
            bhg = bh // (h_v // h_qk)
            seq = chunk_indices[bc, 0]
            start = cu_seqlens[seq] + chunk_indices[bc, 1] * C
            end = cu_seqlens[seq + 1]
            tx = T.get_thread_binding()

            k_sh = T.alloc_shared((C, dk), dtype)
            b_sh = T.alloc_shared((C,), acc)
            gc_sh = T.alloc_shared((C,), acc)
            kk = T.alloc_fragment((C, C), acc)
            l_sh = T.alloc_shared((C, C), acc)
            x_sh = T.alloc_shared((C, C), acc)
            t16 = T.alloc_fragment((2, BLK, BLK), acc)
            t16_sh = T.alloc_shared((2, BLK, BLK), acc)
            x16 = T.alloc_fragment((2, BLK, BLK), acc)
            l32_sh = T.alloc_shared((32, 32), acc)
            x11_sh = T.alloc_shared((32, 32), acc)
            x22_sh = T.alloc_shared((32, 32), acc)
            t32 = T.alloc_fragment((32, 32), acc)
            t32_sh = T.alloc_shared((32, 32), acc)
            x21 = T.alloc_fragment((32, 32), acc)
            a_out = T.alloc_shared((C, C), dtype)
            col = T.alloc_local((BLK,), acc)
            run = T.alloc_local((1,), acc)

            for i, j in T.Parallel(C, dk):
                if start + i < end:
                    k_sh[i, j] = k[0, start + i, bhg, j]
                else:
                    k_sh[i, j] = T.cast(0, dtype)
            for i in T.Parallel(C):
                if start + i < end:
                    b_sh[i] = beta[0, start + i, bh]
                else:
                    b_sh[i] = 0.0

            # chunk-local inclusive cumsum of g (one thread; 64 adds)
            if parallel_cumsum:
                for i in T.Parallel(C):
                    if start + i < end:
                        gc_sh[i] = g[0, start + i, bh]
                    else:
                        gc_sh[i] = 0.0
                T.cumsum(src=gc_sh, dim=0)
            elif tx == 0:
                run[0] = 0.0
                for i in T.serial(C):
                    if start + i < end:
                        run[0] = run[0] + g[0, start + i, bh]
                    gc_sh[i] = run[0]

            T.gemm(k_sh, k_sh, kk, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                l_sh[i, j] = T.if_then_else(i > j, kk[i, j] * b_sh[i], 0.0)
                x_sh[i, j] = 0.0

            # level 0: invert the four 16x16 unit-lower diagonal blocks; thread = (block, column)
            if tx < 4 * BLK:
                blk = tx // BLK
                c = tx % BLK
                for i in T.unroll(BLK):
                    col[i] = T.if_then_else(c == i, 1.0, 0.0)
                    for j in T.unroll(i):
                        col[i] = col[i] - l_sh[blk * BLK + i, blk * BLK + j] * col[j]
                for i in T.unroll(BLK):
                    x_sh[blk * BLK + i, blk * BLK + c] = col[i]

            # level 1: within each 32-block p, X[1][0] = -X[1][1] L[1][0] X[0][0] (16x16 pieces)
            T.clear(t16)
            for p, i, j in T.Parallel(2, BLK, BLK):
                for r in T.serial(BLK):
                    t16[p, i, j] += l_sh[p * 32 + BLK + i, p * 32 + r] * x_sh[p * 32 + r, p * 32 + j]
            T.copy(t16, t16_sh)
            T.clear(x16)
            for p, i, j in T.Parallel(2, BLK, BLK):
                for r in T.serial(BLK):
                    x16[p, i, j] -= x_sh[p * 32 + BLK + i, p * 32 + BLK + r] * t16_sh[p, r, j]
            for p, i, j in T.Parallel(2, BLK, BLK):
                x_sh[p * 32 + BLK + i, p * 32 + j] = x16[p, i, j]

            # level 2: X[32:, :32] = -X22 L21 X11 with 32x32 blocks
            for i, j in T.Parallel(32, 32):
                l32_sh[i, j] = l_sh[32 + i, j]
                x11_sh[i, j] = x_sh[i, j]
                x22_sh[i, j] = x_sh[32 + i, 32 + j]
            T.clear(t32)
            for i, j in T.Parallel(32, 32):
                for r in T.serial(32):
                    t32[i, j] += l32_sh[i, r] * x11_sh[r, j]
            T.copy(t32, t32_sh)
            T.clear(x21)
            for i, j in T.Parallel(32, 32):
                for r in T.serial(32):
                    x21[i, j] -= x22_sh[i, r] * t32_sh[r, j]
            for i, j in T.Parallel(32, 32):
                x_sh[32 + i, j] = x21[i, j]

            for i, j in T.Parallel(C, C):
                a_out[i, j] = T.cast(x_sh[i, j], dtype)
            for i, j in T.Parallel(C, C):
                if start + i < end:
                    a0[0, start + i, bh, j] = a_out[i, j]
            for i in T.Parallel(C):
                if start + i < end:
                    g_cumsum[0, start + i, bh] = gc_sh[i]

    return kkt_solve


kkt_solve_kernel = tilelang.jit(kkt_solve_program, pass_configs=PASS_CONFIGS)
