"""Stage 1, v9: the chunk-local cumsum of g and A0 = (I + L)^-1, L = StrictLower(diag(beta) K K^T), as two
32x32 diagonal inverses by column substitution (v8r's right-looking form) and the off-diagonal block from
two 32x32x32 products in fp32 FMAs spread over all four warps.

Why: v8/v8r give one warp the whole column 0 (~2000 FMAs) and another ~500, and leave two warps idle. A
warp's instructions issue from one of the SM's four schedulers (warp slot mod 4), so with four CTAs per SM
every CTA's heavy warp queues on the same scheduler. Blocked,
    A0 = [[X00, 0], [X10, X11]],  X_bb = (I + L_bb)^-1,  X10 = -X11 L10 X00,
the two diagonal solves cost ~500 FMAs each (on warps 0-1 or 2-3, alternating with the CTA index), and the
two products ~512 FMAs per thread on every warp. All arithmetic is fp32 FMA (no tensor-core products after
K K^T, no operand splits); A0 is rounded once, to the input dtype, when stored.

One CTA per (chunk, value head), 128 threads.

Measured on the H200 (session 11; NOTES.md): as accurate as v2 on every stage-1 case; v9 0.647 and v9b
0.622-0.636 ms against v4's 0.578 at 16/64 8192x4, with 2510 shared-memory wavefronts per CTA (v4: 3490):
bound by CTA latency (loads, barriers), not by shared memory or arithmetic.
"""

import tilelang
import tilelang.language as T

from .kkt_solve_v8 import LDS_F32X4_SOURCE, LPAD, load_chunk_kkt, solve_right_looking

CHUNK = 64
HALF = CHUNK // 2
ROWS = 8  # rows of a product's output per thread (32 columns x 4 warps x 8 rows = 32x32)

# every global index is in range by construction (stores are masked by the sequence end), so the bounds
# checks TileLang adds around each scalar store are pure overhead
PASS_CONFIGS = {
    tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
    tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True,
}


def kkt_solve_v9_program(dk: int, dtype: str, lean: bool = False):
    """TileLang program with kkt_solve_v3_program's signature: (k, g, beta, cu_seqlens, chunk_indices) ->
    (g_cumsum, A0). Varlen layout (B = 1); head counts are runtime values; dtype is the input's (bf16 or
    fp16); K K^T runs on its tensor cores with fp32 accumulation.

    lean=True (v9b) shortens what runs beside the diagonal solves and the second product: the g cumsum
    keeps its running sum in a register over a fully unrolled loop (v9 re-read each partial sum from shared
    memory, ~30 cycles a step, ~2000 in all, longer than a diagonal solve), and X11 is stored transposed
    so the second product reads its rows with two 16-byte broadcast loads per step instead of eight scalar
    ones."""
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"

    @T.prim_func
    def kkt_solve_v9(
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
    ):
        with T.Kernel(nc * h_v, threads=128) as (bid,):
            T.import_source(LDS_F32X4_SOURCE)
            T.annotate_min_blocks_per_sm(4)
            bh = T.alloc_var("int32", init=bid % h_v)
            bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
            seq = T.alloc_var("int32", init=chunk_indices[bid // h_v, 0])
            start = T.alloc_var("int32", init=cu_seqlens[seq] + chunk_indices[bid // h_v, 1] * C)
            end = T.alloc_var("int32", init=cu_seqlens[seq + 1])

            k_sh = T.alloc_shared((C, dk), dtype)
            b_sh = T.alloc_shared((C,), acc)
            gc_sh = T.alloc_shared((C,), acc)
            lt_sh = T.alloc_shared((C, C + LPAD), acc)  # -L^T
            xd_sh = T.alloc_shared((C, C + LPAD), acc)  # X00 (rows, cols 0..31), X11 (32..63), row-major
            m_sh = T.alloc_shared((HALF, HALF + LPAD), acc)  # M = -L10 X00
            kk = T.alloc_fragment((C, C), acc)
            x = T.alloc_local((HALF,), acc)
            lrow = T.alloc_local((4,), acc)
            lrow2 = T.alloc_local((4,), acc)
            out = T.alloc_local((ROWS,), acc)
            run = T.alloc_local((1,), acc)

            k_ready = T.alloc_barrier(arrive_count=32)
            load_chunk_kkt(k, g, beta, k_sh, b_sh, gc_sh, kk, k_ready, start, end, bh, bhg, dk)
            for i, j in T.Parallel(C, C):
                lt_sh[j, i] = T.if_then_else(i > j, -kk[i, j] * b_sh[i], 0.0)
            T.sync_threads()

            tx = T.get_thread_binding()
            lane = tx % 32
            # diagonal blocks: block b on warp (2 * (bid % 2) + b), so the CTAs an SM holds spread them
            # over its four schedulers
            slot = (tx // 32 + 2 * (bid % 2)) % 4
            if slot < 2:
                r0 = slot * HALF
                for i in T.unroll(HALF):
                    x[i] = T.if_then_else(i == lane, 1.0, 0.0)
                solve_right_looking(lt_sh, x, lrow, 0, HALF, r0)
                for i in T.unroll(HALF):
                    if lean and slot == 1:  # X11^T: row lane holds column lane of X11
                        xd_sh[r0 + lane, r0 + i] = x[i]
                    else:
                        xd_sh[r0 + i, r0 + lane] = x[i]
                if start + C <= end:
                    for i in T.unroll(HALF):
                        a0[0, start + r0 + i, bh, r0 + lane] = T.cast(x[i], dtype)
                else:
                    for i in T.unroll(HALF):
                        if start + r0 + i < end:
                            a0[0, start + r0 + i, bh, r0 + lane] = T.cast(x[i], dtype)
                # the upper right block of A0 is zero (the fused kernel's Gamma mask would not hide garbage)
                if slot == 1:
                    for i in T.unroll(HALF):
                        if start + i < end:
                            a0[0, start + i, bh, HALF + lane] = T.cast(0.0, dtype)
            elif slot == 2 and lane == 0:
                # the chunk-local cumsum, sequential (64 adds) on an otherwise idle warp
                if lean:
                    run[0] = 0.0
                    for i in T.unroll(C):
                        run[0] = run[0] + gc_sh[i]
                        gc_sh[i] = run[0]
                else:
                    for i in T.serial(1, C):
                        gc_sh[i] = gc_sh[i] + gc_sh[i - 1]
            T.sync_threads()

            # M = -L10 X00: thread (rows w*8.., column lane); -L10[r, k] = lt[k, 32 + r]
            w = tx // 32
            for r in T.unroll(ROWS):
                out[r] = 0.0
            for kq in T.unroll(HALF):
                T.call_extern(
                    "handle", "qla_lds_f32x4", T.address_of(lrow[0]), T.address_of(lt_sh[kq, HALF + w * ROWS])
                )
                T.call_extern(
                    "handle", "qla_lds_f32x4", T.address_of(lrow2[0]), T.address_of(lt_sh[kq, HALF + w * ROWS + 4])
                )
                for r in T.unroll(4):
                    out[r] = out[r] + lrow[r] * xd_sh[kq, lane]
                    out[r + 4] = out[r + 4] + lrow2[r] * xd_sh[kq, lane]
            for r in T.unroll(ROWS):
                m_sh[w * ROWS + r, lane] = out[r]
            T.sync_threads()

            # X10 = X11 M
            for r in T.unroll(ROWS):
                out[r] = 0.0
            if lean:
                # four rolled steps of eight: fully unrolled, nvcc hoists all 64 vector loads and spills
                for kq0 in T.serial(HALF // 8):
                    for kq1 in T.unroll(8):
                        T.call_extern("handle", "qla_lds_f32x4", T.address_of(lrow[0]),
                                      T.address_of(xd_sh[HALF + kq0 * 8 + kq1, HALF + w * ROWS]))
                        T.call_extern("handle", "qla_lds_f32x4", T.address_of(lrow2[0]),
                                      T.address_of(xd_sh[HALF + kq0 * 8 + kq1, HALF + w * ROWS + 4]))
                        for r in T.unroll(4):
                            out[r] = out[r] + lrow[r] * m_sh[kq0 * 8 + kq1, lane]
                            out[r + 4] = out[r + 4] + lrow2[r] * m_sh[kq0 * 8 + kq1, lane]
            else:
                for kq in T.unroll(HALF):
                    for r in T.unroll(ROWS):
                        out[r] = out[r] + xd_sh[HALF + w * ROWS + r, HALF + kq] * m_sh[kq, lane]
            for r in T.unroll(ROWS):
                if start + HALF + w * ROWS + r < end:
                    a0[0, start + HALF + w * ROWS + r, bh, lane] = T.cast(out[r], dtype)
            for i in T.Parallel(C):
                if start + i < end:
                    g_cumsum[0, start + i, bh] = gc_sh[i]

    return kkt_solve_v9


kkt_solve_v9_kernel = tilelang.jit(kkt_solve_v9_program, pass_configs=PASS_CONFIGS)
