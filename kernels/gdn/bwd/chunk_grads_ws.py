"""Stage 2 of the backward, rev 11: rev 8's per-chunk gradients on two warpgroups that run at once.

Rev 8 (bwd/chunk_grads.py) runs its 21 GEMMs one after another, every GEMM split over both warpgroups:
one CTA per SM (its tiles take ~200 KiB), issue slots 23 % busy (Nsight Compute, session 10), so most of
a CTA's 35 K cycles are one warpgroup waiting for its own GEMM. The chunk's work splits into two chains
that share little (gdn/bwd_chunked.py, _chunk_bwd, is the specification):

  WG X  (threads 0-127, no dS'):  P = scale Gamma o QK^T, Ag; W = V - D (K S) over V; Vn = Ag W;
        dP = (dO Vn^T) o L; D_r Vn over Vn; dQK = scale Gamma o dP; the pair gate terms P o dP (row sums
        here, column sums as row sums of the transposed products K Q^T and Vn dO^T);
        row_q = D scale <dO, Q S>; dq = scale D (dO S^T) + dQK K.
  WG Y  (threads 128-255, from dS'): dS' (fp32, global) -> bf16 and <S, dS'> per row; K dS' -> x and
        dVn = D_r (K dS') + P^T dO; dW = diag(beta) (Gamma o A0)^T dVn (dv); dAg = (dVn W^T) o L and its
        gate, dbeta and dA0 terms; -D dW over dVn; <D dW, K S>; the A0 path (dM, dL, dKKt, K K^T, dbeta);
        dk = dQK^T Q + (D_r Vn) dS'^T + dKKt K + dKKt^T K - (D dW) S^T; dg.

X hands Y three things through mbarriers (each X thread fences its shared-memory writes for the async
proxy, then arrives): b_pa (P, Ag, the gates, the tiles with rows past the sequence's end zeroed), b_vn
(W, D_r Vn; X is done with Ag, whose buffer Y then refills with Gamma o A0), b_dqk (dQK and X's gate
vectors). Y's path after b_vn is about ten GEMMs, X's about five: X's work hides under Y's.

Only Y reduces across warps (TileLang's cross-warp reductions sync on named barriers 1 and 2 with a
fixed thread count; two warpgroups reducing at once would meet at the same barrier). Every reduction X
runs is over rows of a GEMM accumulator, within a warp. The warpgroups' own barriers are 3 (X) and 4 (Y).

Same inputs and outputs as rev 8 with store_dv (dq, dk per value head in fp32, dbeta, dg fp32, dv in the
input dtype); dq, dk and dv come out bit for bit rev 8's, dbeta and dg to reduction order. GPU only.

Measured on the H100 (session 21, kernels/NOTES.md): correct, but 1.7x rev 8's time (stage 2 at 16/32 x 32768
4.52 ms against 2.66). Nsight Compute: issue slots 11.7 % busy against 23 %, stalls on instruction fetch (24 %:
155 KB of code, where each warpgroup's fully unrolled passes over [64, 128] tiles at 128 threads are twice rev
8's, and the two warpgroups run different code) and on global loads (23 %: dS' read by Y's threads, not by TMA).
Not the default.
"""

import tilelang
import tilelang.language as T

from ..fwd.fused_fwd import CHUNK, LOG2E, PASS_CONFIGS
from .tl_common import gamma_of

WG = 128
BAR_X = 3  # named barrier of warpgroup X (TileLang's reductions use 1 and 2)
BAR_Y = 4


def bwd_chunk_grads_ws_program(dk: int, dv: int, scale: float, dtype: str):
    """TileLang program: (q, k, v, g_cumsum, beta, A0, dO, states, ds_next, cu_seqlens, chunk_indices) ->
    (dq_v, dk_v [1,T,H_v,K] fp32 per value head, dbeta, dg [1,T,H_v] fp32, dv [1,T,H_v,V]); the arguments
    and layouts of bwd_chunk_grads_program with store_dv=True."""
    assert dk == 2 * CHUNK and dv == 2 * CHUNK  # dS' is read in two 64-row halves; K = V = 128
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"

    @T.prim_func
    def bwd_chunk_grads_ws(
        q: T.Tensor((1, nt, h_qk, dk), dtype),
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        v: T.Tensor((1, nt, h_v, dv), dtype),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
        grad_o: T.Tensor((1, nt, h_v, dv), dtype),
        states: T.Tensor((nc, h_v, dk, dv), dtype),
        ds_next: T.Tensor((nc, h_v, dk, dv), acc),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        dq_v: T.Tensor((1, nt, h_v, dk), acc),
        dk_v: T.Tensor((1, nt, h_v, dk), acc),
        dbeta: T.Tensor((1, nt, h_v), acc),
        dg: T.Tensor((1, nt, h_v), acc),
        dv_out: T.Tensor((1, nt, h_v, dv), dtype),
    ):
        with T.Kernel(nc * h_v, threads=2 * WG) as (bid,):
            bh = T.alloc_var("int32", init=bid % h_v)
            bc = T.alloc_var("int32", init=bid // h_v)
            bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
            t0 = T.alloc_var(
                "int32", init=cu_seqlens[chunk_indices[bid // h_v, 0]] + chunk_indices[bid // h_v, 1] * C
            )
            end = T.alloc_var("int32", init=cu_seqlens[chunk_indices[bid // h_v, 0] + 1])

            q_sh = T.alloc_shared((C, dk), dtype)
            k_sh = T.alloc_shared((C, dk), dtype)
            vw_sh = T.alloc_shared((C, dv), dtype)  # V, then W (X)
            do_sh = T.alloc_shared((C, dv), dtype)
            a_sh = T.alloc_shared((C, C), dtype)
            s_sh = T.alloc_shared((dk, dv), dtype)
            ds_sh = T.alloc_shared((dk, dv), dtype)  # dS' rounded (Y)
            p_sh = T.alloc_shared((C, C), dtype)
            ag_sh = T.alloc_shared((C, C), dtype)  # Ag (X's Vn), then Gamma o A0 (Y's dW)
            vn_sh = T.alloc_shared((C, dv), dtype)  # Vn (X's dP), then D_r Vn
            dvn_sh = T.alloc_shared((C, dv), dtype)  # dVn, then -D dW (Y)
            dqk_sh = T.alloc_shared((C, C), dtype)
            da0_sh = T.alloc_shared((C, C), dtype)  # dA0, then dKKt (Y)
            t_sh = T.alloc_shared((C, C), dtype)
            g_sh = T.alloc_shared((C,), acc)
            b_sh = T.alloc_shared((C,), acc)
            d_sh = T.alloc_shared((C,), acc)
            dr_sh = T.alloc_shared((C,), acc)
            row_q = T.alloc_shared((C,), acc)  # X: D scale <dO, Q S>
            pr_x = T.alloc_shared((C,), acc)  # X: row sums of the pair terms P o dP
            pc_x = T.alloc_shared((C,), acc)  # X: their column sums
            x_sh = T.alloc_shared((C,), acc)  # Y: x_i = D_r,i <K dS', Vn>_i
            row_b = T.alloc_shared((C,), acc)  # Y: <D dW, K S>
            pr_y = T.alloc_shared((C,), acc)  # Y: pair terms dAg o A0 diag(beta) o Gamma, rows
            pc_y = T.alloc_shared((C,), acc)  # Y: their columns
            col_a = T.alloc_shared((C,), acc)  # Y: dbeta's first part
            row_k = T.alloc_shared((C,), acc)  # Y: dbeta's second part
            dgc_sh = T.alloc_shared((C,), acc)
            sds_rows = T.alloc_shared((dk,), acc)
            dg_sh = T.alloc_shared((C,), acc)

            loaded = T.alloc_barrier(arrive_count=[32])
            b_pa = T.alloc_barrier(arrive_count=WG)
            b_vn = T.alloc_barrier(arrive_count=WG)
            b_dqk = T.alloc_barrier(arrive_count=WG)

            tx = T.get_thread_binding()
            if tx < WG:
                # ---------------- WG X ----------------
                gam = T.alloc_fragment((C, C), acc)
                cc = T.alloc_fragment((C, C), acc)
                cc2 = T.alloc_fragment((C, C), acc)
                cc3 = T.alloc_fragment((C, C), acc)
                cv = T.alloc_fragment((C, dv), acc)
                cv2 = T.alloc_fragment((C, dv), acc)
                ck = T.alloc_fragment((C, dk), acc)
                red_x = T.alloc_fragment((C,), acc)
                red_x2 = T.alloc_fragment((C,), acc)
                red_x3 = T.alloc_fragment((C,), acc)
                if tx < 32:
                    T.tma_copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh, barrier=loaded[0])
                    T.tma_copy(states[bc, bh, 0:dk, 0:dv], s_sh, barrier=loaded[0])
                    T.tma_copy(v[0, t0 : t0 + C, bh, 0:dv], vw_sh, barrier=loaded[0])
                    T.tma_copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh, barrier=loaded[0])
                    T.tma_copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh, barrier=loaded[0])
                    T.tma_copy(grad_o[0, t0 : t0 + C, bh, 0:dv], do_sh, barrier=loaded[0])
                    T.barrier_arrive(loaded[0])
                for i in T.Parallel(C):
                    g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                    b_sh[i] = T.if_then_else(t0 + i < end, beta[0, T.min(t0 + i, end - 1), bh], 0.0)
                T.sync_threads(BAR_X, WG)  # g_sh[C - 1] and Gamma read other threads' entries
                for i in T.Parallel(C):
                    d_sh[i] = T.exp2(g_sh[i] * LOG2E)
                    dr_sh[i] = T.if_then_else(t0 + i < end, T.exp2((g_sh[C - 1] - g_sh[i]) * LOG2E), 0.0)
                for i, j in T.Parallel(C, C):
                    gam[i, j] = gamma_of(g_sh, i, j)
                T.barrier_wait(loaded[0], 0)
                if end - t0 < C:  # the sequence's last chunk: rows after its end are another sequence's
                    for i, j in T.Parallel(C, dk):
                        if t0 + i >= end:
                            q_sh[i, j] = T.cast(0, dtype)
                            k_sh[i, j] = T.cast(0, dtype)
                    for i, j in T.Parallel(C, dv):
                        if t0 + i >= end:
                            vw_sh[i, j] = T.cast(0, dtype)
                            do_sh[i, j] = T.cast(0, dtype)
                for i, j in T.Parallel(C, C):
                    a_sh[i, j] = T.if_then_else(i >= j and t0 + i < end, a_sh[i, j], T.cast(0, dtype))
                T.fence_proxy_async()
                T.sync_threads(BAR_X, WG)
                # P = scale Gamma o (Q K^T), Ag = (Gamma o A0) diag(beta)
                T.gemm(q_sh, k_sh, cc, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    p_sh[i, j] = T.cast(scale * gam[i, j] * cc[i, j], dtype)
                    ag_sh[i, j] = T.cast(T.cast(a_sh[i, j], acc) * gam[i, j] * b_sh[j], dtype)
                T.fence_proxy_async()
                T.barrier_arrive(b_pa)
                T.sync_threads(BAR_X, WG)
                # W = V - D (K S) over V, Vn = Ag W
                T.gemm(k_sh, s_sh, cv, clear_accum=True)
                for i, j in T.Parallel(C, dv):
                    cv[i, j] = T.cast(vw_sh[i, j], acc) - d_sh[i] * cv[i, j]
                T.sync_threads(BAR_X, WG)  # all of V read before W replaces it
                for i, j in T.Parallel(C, dv):
                    vw_sh[i, j] = T.cast(cv[i, j], dtype)
                T.fence_proxy_async()
                T.sync_threads(BAR_X, WG)
                T.gemm(ag_sh, vw_sh, cv2, clear_accum=True)  # Vn
                for i, j in T.Parallel(C, dv):
                    vn_sh[i, j] = T.cast(cv2[i, j], dtype)
                T.fence_proxy_async()
                T.sync_threads(BAR_X, WG)
                # dP = dO Vn^T and its transpose Vn dO^T (the pair terms' column sums as row sums)
                T.gemm(do_sh, vn_sh, cc2, transpose_B=True, clear_accum=True)
                T.gemm(vn_sh, do_sh, cc3, transpose_B=True, clear_accum=True)
                T.sync_threads(BAR_X, WG)  # both products have read Vn
                for i, j in T.Parallel(C, dv):
                    vn_sh[i, j] = T.cast(dr_sh[i] * cv2[i, j], dtype)
                T.fence_proxy_async()
                T.barrier_arrive(b_vn)
                # dQK = scale Gamma o dP; pair terms (scale Gamma o QK^T, rounded as P) o dP, row sums
                for i, j in T.Parallel(C, C):
                    dqk_sh[i, j] = T.cast(scale * gam[i, j] * cc2[i, j], dtype)
                    cc2[i, j] = T.cast(p_sh[i, j], acc) * cc2[i, j]
                T.reduce_sum(cc2, red_x, dim=1)
                T.copy(red_x, pr_x)
                # column sums: row sums of (P^T) o (dP^T), P^T = scale Gamma^T o (K Q^T) rounded as P
                T.gemm(k_sh, q_sh, cc, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    cc[i, j] = T.cast(T.cast(scale * gamma_of(g_sh, j, i) * cc[i, j], dtype), acc) * cc3[i, j]
                T.reduce_sum(cc, red_x2, dim=1)
                T.copy(red_x2, pc_x)
                # row_q = D scale <dO, Q S>
                T.gemm(q_sh, s_sh, cv, clear_accum=True)
                for i, j in T.Parallel(C, dv):
                    cv[i, j] = scale * cv[i, j] * T.cast(do_sh[i, j], acc)
                T.reduce_sum(cv, red_x3, dim=1)
                for i in T.Parallel(C):
                    row_q[i] = d_sh[i] * red_x3[i]
                T.fence_proxy_async()
                T.barrier_arrive(b_dqk)
                # dq = scale D (dO S^T) + dQK K
                T.gemm(do_sh, s_sh, ck, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, dk):
                    ck[i, j] = scale * d_sh[i] * ck[i, j]
                T.gemm(dqk_sh, k_sh, ck)
                for i, j in T.Parallel(C, dk):
                    if t0 + i < end:
                        dq_v[0, t0 + i, bh, j] = ck[i, j]
            else:
                # ---------------- WG Y ----------------
                gy = T.alloc_fragment((C, C), acc)
                ca = T.alloc_fragment((C, C), acc)
                cb = T.alloc_fragment((C, C), acc)
                dsf = T.alloc_fragment((C, dv), acc)
                kv = T.alloc_fragment((C, dv), acc)
                kx = T.alloc_fragment((C, dv), acc)
                cw = T.alloc_fragment((C, dv), acc)
                cy = T.alloc_fragment((C, dk), acc)
                # reduction results, one per source layout
                red_ds = T.alloc_fragment((C,), acc)
                red_kx = T.alloc_fragment((C,), acc)
                red_col = T.alloc_fragment((C,), acc)
                red_cbr = T.alloc_fragment((C,), acc)
                red_cbc = T.alloc_fragment((C,), acc)
                tot = T.alloc_local((2,), acc)  # the scans' running sums (one thread)
                T.barrier_wait(loaded[0], 0)
                # dS' in two halves of 64 rows: rounded for the GEMMs, <S, dS'> per row in fp32
                for h in T.unroll(2):
                    T.copy(ds_next[bc, bh, h * C : h * C + C, 0:dv], dsf)
                    for i, j in T.Parallel(C, dv):
                        ds_sh[h * C + i, j] = T.cast(dsf[i, j], dtype)
                    for i, j in T.Parallel(C, dv):
                        dsf[i, j] = dsf[i, j] * T.cast(s_sh[h * C + i, j], acc)
                    T.reduce_sum(dsf, red_ds, dim=1)
                    T.copy(red_ds, sds_rows[h * C : h * C + C])
                T.fence_proxy_async()
                T.sync_threads(BAR_Y, WG)
                T.barrier_wait(b_pa, 0)
                for i, j in T.Parallel(C, C):
                    gy[i, j] = gamma_of(g_sh, i, j)
                # K dS'; x_i = sum_v (K dS')_iv (D_r Vn)_iv; dVn = D_r (K dS') + P^T dO
                T.gemm(k_sh, ds_sh, kv, clear_accum=True)
                T.barrier_wait(b_vn, 0)
                for i, j in T.Parallel(C, dv):
                    kx[i, j] = kv[i, j] * T.cast(vn_sh[i, j], acc)
                T.reduce_sum(kx, red_kx, dim=1)
                T.copy(red_kx, x_sh)
                for i, j in T.Parallel(C, dv):
                    kv[i, j] = dr_sh[i] * kv[i, j]
                T.gemm(p_sh, do_sh, kv, transpose_A=True)
                for i, j in T.Parallel(C, dv):
                    dvn_sh[i, j] = T.cast(kv[i, j], dtype)
                # Gamma o A0 over Ag (X's Vn has read it: b_vn)
                for i, j in T.Parallel(C, C):
                    ag_sh[i, j] = T.cast(T.cast(a_sh[i, j], acc) * gy[i, j], dtype)
                T.fence_proxy_async()
                T.sync_threads(BAR_Y, WG)
                # dW = diag(beta) ((Gamma o A0)^T dVn): the chunk's dv
                T.gemm(ag_sh, dvn_sh, cw, transpose_A=True, clear_accum=True)
                for i, j in T.Parallel(C, dv):
                    cw[i, j] = b_sh[i] * cw[i, j]
                for i, j in T.Parallel(C, dv):
                    if t0 + i < end:
                        dv_out[0, t0 + i, bh, j] = T.cast(cw[i, j], dtype)
                # dAg = (dVn W^T) o L: pair gate terms, dA0, dbeta's first part
                T.gemm(dvn_sh, vw_sh, ca, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    cb[i, j] = T.if_then_else(i >= j, ca[i, j] * T.cast(a_sh[i, j], acc) * b_sh[j] * gy[i, j], 0.0)
                    da0_sh[i, j] = T.cast(T.if_then_else(i >= j, ca[i, j] * gy[i, j] * b_sh[j], 0.0), dtype)
                    ca[i, j] = T.if_then_else(i >= j, ca[i, j] * gy[i, j] * T.cast(a_sh[i, j], acc), 0.0)
                T.reduce_sum(ca, red_col, dim=0)
                T.copy(red_col, col_a)
                T.reduce_sum(cb, red_cbr, dim=1)
                T.copy(red_cbr, pr_y)
                T.reduce_sum(cb, red_cbc, dim=0)
                T.copy(red_cbc, pc_y)
                T.sync_threads(BAR_Y, WG)  # dVn's two products are done: -D dW takes its buffer
                for i, j in T.Parallel(C, dv):
                    dvn_sh[i, j] = T.cast(-d_sh[i] * cw[i, j], dtype)
                T.fence_proxy_async()
                T.sync_threads(BAR_Y, WG)
                # row_b = <D dW, K S> (from the rounded D dW, as rev 8)
                T.gemm(k_sh, s_sh, kx, clear_accum=True)
                for i, j in T.Parallel(C, dv):
                    kx[i, j] = -kx[i, j] * T.cast(dvn_sh[i, j], acc)
                T.reduce_sum(kx, red_kx, dim=1)
                T.copy(red_kx, row_b)
                # A0 path: dM = -A0^T dA0 A0^T, dL = StrictLower(dM), dKKt = diag(beta) dL; K K^T for dbeta
                T.gemm(a_sh, da0_sh, ca, transpose_A=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    t_sh[i, j] = T.cast(ca[i, j], dtype)
                T.fence_proxy_async()
                T.sync_threads(BAR_Y, WG)
                T.gemm(t_sh, a_sh, ca, transpose_B=True, clear_accum=True)
                T.gemm(k_sh, k_sh, cb, transpose_B=True, clear_accum=True)
                T.sync_threads(BAR_Y, WG)  # dA0's product is done: dKKt takes its buffer
                for i, j in T.Parallel(C, C):
                    ca[i, j] = T.if_then_else(i > j, -ca[i, j], 0.0)
                    da0_sh[i, j] = T.cast(b_sh[i] * ca[i, j], dtype)
                    cb[i, j] = ca[i, j] * cb[i, j]
                T.reduce_sum(cb, red_cbr, dim=1)
                T.copy(red_cbr, row_k)
                T.fence_proxy_async()
                T.sync_threads(BAR_Y, WG)
                for i in T.Parallel(C):
                    if t0 + i < end:
                        dbeta[0, t0 + i, bh] = col_a[i] + row_k[i]
                # dk = dQK^T Q + (D_r Vn) dS'^T + dKKt K + dKKt^T K - (D dW) S^T
                T.barrier_wait(b_dqk, 0)
                T.gemm(dqk_sh, q_sh, cy, transpose_A=True, clear_accum=True)
                T.gemm(vn_sh, ds_sh, cy, transpose_B=True)
                T.gemm(da0_sh, k_sh, cy)
                T.gemm(da0_sh, k_sh, cy, transpose_A=True)
                T.gemm(dvn_sh, s_sh, cy, transpose_B=True)
                for i, j in T.Parallel(C, dk):
                    if t0 + i < end:
                        dk_v[0, t0 + i, bh, j] = cy[i, j]
                # dg_i = sum_{i <= j < n} dgc_j + dgamma, dgamma = sum_j x_j + exp(gamma) <S, dS'>
                for i in T.Parallel(C):
                    dgc_sh[i] = T.if_then_else(
                        t0 + i < end, row_q[i] - row_b[i] - x_sh[i] + pr_x[i] + pr_y[i] - pc_x[i] - pc_y[i], 0.0
                    )
                T.sync_threads(BAR_Y, WG)
                if tx == WG:  # 64-long scans by one thread: ~2 x 64 dependent adds
                    tot[0] = 0.0
                    for j in T.serial(C):
                        tot[0] = tot[0] + x_sh[j] + d_sh[C - 1] * (sds_rows[j] + sds_rows[j + C])
                    tot[1] = 0.0
                    for jj in T.serial(C):
                        tot[1] = tot[1] + dgc_sh[C - 1 - jj]
                        dg_sh[C - 1 - jj] = tot[0] + tot[1]
                T.sync_threads(BAR_Y, WG)
                for i in T.Parallel(C):
                    if t0 + i < end:
                        dg[0, t0 + i, bh] = dg_sh[i]

    return bwd_chunk_grads_ws


bwd_chunk_grads_ws_kernel = tilelang.jit(bwd_chunk_grads_ws_program, pass_configs=PASS_CONFIGS)
