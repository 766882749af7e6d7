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
"""

import tilelang
import tilelang.language as T

from .kkt_solve_v8 import LDS_F32X4_SOURCE, LPAD

CHUNK = 64
HALF = CHUNK // 2
ROWS = 8  # rows of a product's output per thread (32 columns x 4 warps x 8 rows = 32x32)

# every global index is in range by construction (stores are masked by the sequence end), so the bounds
# checks TileLang adds around each scalar store are pure overhead
PASS_CONFIGS = {
    tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
    tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True,
}


def kkt_solve_v9_program(dk: int, dtype: str, lean: bool = False, persistent_ctas: int = 0):
    """TileLang program with kkt_solve_v3_program's signature: (k, g, beta, cu_seqlens, chunk_indices) ->
    (g_cumsum, A0). Varlen layout (B = 1); head counts are runtime values; dtype is the input's (bf16 or
    fp16); K K^T runs on its tensor cores with fp32 accumulation.

    lean=True (v9b) shortens what runs beside the diagonal solves and the second product: the g cumsum
    keeps its running sum in a register over a fully unrolled loop (v9 re-read each partial sum from shared
    memory, ~30 cycles a step, ~2000 in all, longer than a diagonal solve), and X11 is stored transposed
    so the second product reads its rows with two 16-byte broadcast loads per step instead of eight scalar
    ones.

    persistent_ctas > 0 (v9p, with lean) launches that many CTAs, each walking the (chunk, head) items
    bid, bid + G, ... with the next item's K tile (TMA, two stages) and its beta and g (registers) loaded
    while the current one is solved. Why: Nsight Compute on v8r and v9b (session 11) reads a CTA's life as
    ~10 us against ~1 us of issue at four CTAs per SM, with a third of the stall cycles at CTA barriers:
    every CTA waits for its own loads, and the SM has too few CTAs to cover that."""
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"

    @T.macro
    def solve_block(lt, x, lrow, r0):
        """x = e_j on entry (j = r0 + lane, entries r0..r0+31 live); right-looking over rows r0..r0+31 of
        -L^T: after step k, x_k is final and every later row of the block has its term."""
        for kk in T.unroll(HALF - 1):
            for i4 in T.unroll((kk + 1) // 4, HALF // 4):
                T.call_extern(
                    "handle", "qla_lds_f32x4", T.address_of(lrow[0]), T.address_of(lt[r0 + kk, r0 + i4 * 4])
                )
                for p in T.unroll(4):
                    x[i4 * 4 + p] = x[i4 * 4 + p] + lrow[p] * x[kk]

    @T.macro
    def compute_item(k_tile, b_sh, gc_sh, lt_sh, xd_sh, m_sh, kk, x, lrow, lrow2, out, run, bh, start, end, flip,
                     g_cumsum, a0, last_sync):
        """K K^T, L, the two diagonal solves, the two products and the stores of one (chunk, head); flip (0
        or 1) picks which warp pair runs the diagonal solves. With last_sync, ends with every shared buffer
        free for the next item."""
        T.gemm(k_tile, k_tile, kk, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(C, C):
            lt_sh[j, i] = T.if_then_else(i > j, -kk[i, j] * b_sh[i], 0.0)
        T.sync_threads()

        tx = T.get_thread_binding()
        lane = tx % 32
        # diagonal blocks: block b on warp (2 * flip + b), so the CTAs an SM holds spread them over its
        # four schedulers
        slot = (tx // 32 + 2 * flip) % 4
        if slot < 2:
            r0 = slot * HALF
            for i in T.unroll(HALF):
                x[i] = T.if_then_else(i == lane, 1.0, 0.0)
            solve_block(lt_sh, x, lrow, r0)
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
        if last_sync:
            T.sync_threads()

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
            compute_item(k_sh, b_sh, gc_sh, lt_sh, xd_sh, m_sh, kk, x, lrow, lrow2, out, run, bh, start, end, bid % 2,
                         g_cumsum, a0, False)

    if persistent_ctas:
        assert lean
        G = persistent_ctas

        @T.macro
        def fetch(k, g, beta, cu_seqlens, chunk_indices, k_sh, k_ready, b_next, g_next, tx, item, stage):
            """v9p: start the loads of one item: its K tile by TMA into stage, beta and g into registers."""
            i_seq = chunk_indices[item // h_v, 0]
            i_start = cu_seqlens[i_seq] + chunk_indices[item // h_v, 1] * C
            i_end = cu_seqlens[i_seq + 1]
            if tx < 32:
                T.tma_copy(k[0, i_start : i_start + C, (item % h_v) // (h_v // h_qk), 0:dk], k_sh[stage, :, :],
                           barrier=k_ready[stage])
                T.barrier_arrive(k_ready[stage])
            if tx < C:
                b_next[0] = T.if_then_else(i_start + tx < i_end, beta[0, T.min(i_start + tx, nt - 1), item % h_v], 0.0)
                g_next[0] = T.if_then_else(i_start + tx < i_end, g[0, T.min(i_start + tx, nt - 1), item % h_v], 0.0)

        @T.prim_func
        def kkt_solve_v9p(
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            g: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            cu_seqlens: T.Tensor((ns,), "int32"),
            chunk_indices: T.Tensor((nc, 2), "int32"),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
            a0: T.Tensor((1, nt, h_v, C), dtype),
        ):
            with T.Kernel(G, threads=128) as (bid,):
                T.import_source(LDS_F32X4_SOURCE)
                T.annotate_min_blocks_per_sm(3)  # 71 KiB of shared memory: three CTAs per SM
                n_iter = T.alloc_var(
                    "int32", init=T.if_then_else(bid < nc * h_v, (nc * h_v - bid + G - 1) // G, 0)
                )
                bh = T.alloc_var("int32", init=0)
                start = T.alloc_var("int32", init=0)
                end = T.alloc_var("int32", init=0)
                nxt = T.alloc_var("int32", init=0)

                k_sh = T.alloc_shared((2, C, dk), dtype)
                b_sh = T.alloc_shared((C,), acc)
                gc_sh = T.alloc_shared((C,), acc)
                lt_sh = T.alloc_shared((C, C + LPAD), acc)  # -L^T
                xd_sh = T.alloc_shared((C, C + LPAD), acc)  # X00 (rows, cols 0..31), X11^T (32..63)
                m_sh = T.alloc_shared((HALF, HALF + LPAD), acc)  # M = -L10 X00
                kk = T.alloc_fragment((C, C), acc)
                x = T.alloc_local((HALF,), acc)
                lrow = T.alloc_local((4,), acc)
                lrow2 = T.alloc_local((4,), acc)
                out = T.alloc_local((ROWS,), acc)
                run = T.alloc_local((1,), acc)
                b_next = T.alloc_local((1,), acc)  # thread t < C: beta and g of token t of the next item
                g_next = T.alloc_local((1,), acc)
                k_ready = T.alloc_barrier(arrive_count=[32, 32])
                tx = T.get_thread_binding()

                if n_iter > 0:
                    fetch(k, g, beta, cu_seqlens, chunk_indices, k_sh, k_ready, b_next, g_next, tx, bid, 0)
                for it in T.serial(n_iter):
                    nxt = bid + it * G
                    bh = nxt % h_v
                    start = cu_seqlens[chunk_indices[nxt // h_v, 0]] + chunk_indices[nxt // h_v, 1] * C
                    end = cu_seqlens[chunk_indices[nxt // h_v, 0] + 1]
                    if tx < C:
                        b_sh[tx] = b_next[0]
                        gc_sh[tx] = g_next[0]
                    T.sync_threads()
                    if it + 1 < n_iter:  # the previous item's last sync freed the other stage and the registers
                        fetch(k, g, beta, cu_seqlens, chunk_indices, k_sh, k_ready, b_next, g_next, tx,
                              nxt + G, (it + 1) % 2)
                    T.barrier_wait(k_ready[it % 2], (it // 2) % 2)
                    compute_item(k_sh[it % 2, :, :], b_sh, gc_sh, lt_sh, xd_sh, m_sh, kk, x, lrow, lrow2, out, run, bh,
                                 start, end, (bid + it) % 2, g_cumsum, a0, True)

        return kkt_solve_v9p
    return kkt_solve_v9


    return kkt_solve_v9


kkt_solve_v9_kernel = tilelang.jit(kkt_solve_v9_program, pass_configs=PASS_CONFIGS)
