"""Stage 2 of the forward: one CTA per (sequence, value head, V-slice) walks that sequence's chunks in
order, keeping the fp32 state S [K, BV] on chip. Nothing but o and the final state reaches HBM.

Per chunk (design/gdn.md), with D = diag(exp(g)), D_r = diag(exp(gamma - g)), Gamma_ij = exp(g_i - g_j)
on i >= j:
    W    = V - D (K S)
    Vnew = (Gamma o A0) diag(beta) W
    O    = scale (D Q S + (Gamma o Q K^T) Vnew)
    S'   = exp(gamma) S + K^T (D_r Vnew)
Ragged tails: rows past the sequence end load as zero, their g is clamped to the last valid token's
(so gamma is right), and D_r is zero there, so they add nothing to the state and are never stored.
Every warp does every stage in order (no warp specialisation); the next chunk's tiles are prefetched
by TileLang's software pipeline (num_stages).
"""

import tilelang
import tilelang.language as T

CHUNK = 64
LOG2E = 1.4426950408889634

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}


def fused_fwd_program(
    dk: int,
    dv: int,
    scale: float,
    dtype: str,
    use_initial_state: bool,
    state_v_first: bool = False,
    block_v: int = 64,
    threads: int = 256,
    num_stages: int = 2,
    store_states: bool = False,
):
    """TileLang program: (q,k,v,g_cumsum,beta,A0,h0,cu_seqlens) -> (o, final_state). Varlen (B=1).

    Head counts are runtime values: one compiled kernel per (dtype, scale, flags) serves every head config.
    store_states=True (training forward) also takes chunk_offsets [N+1] int32 and writes the state at the
    start of every chunk to states [num_chunks, H_v, K, V] in the input dtype (the operand the chunk's
    GEMMs used), what the backward's chunk-gradient stage (gdn/bwd/chunk_grads.py) reads.
    """
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nv = dv // block_v
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs")
    nh0 = T.dynamic("num_h0")
    nc = T.dynamic("num_chunks")
    acc = "float32"
    st_shape = (ns, h_v, dv, dk) if state_v_first else (ns, h_v, dk, dv)
    h0_shape = (nh0, h_v, dv, dk) if state_v_first else (nh0, h_v, dk, dv)

    @T.macro
    def kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, chunk_offsets, states):
        with T.Kernel(ns * h_v * nv, threads=threads) as (bid,):
            seq = bid // (h_v * nv)
            bh = (bid // nv) % h_v
            v0 = (bid % nv) * block_v
            bhg = bh // (h_v // h_qk)
            start = cu_seqlens[seq]
            end = cu_seqlens[seq + 1]
            n_chunks = T.ceildiv(end - start, C)

            q_sh = T.alloc_shared((C, dk), dtype)
            k_sh = T.alloc_shared((C, dk), dtype)
            v_sh = T.alloc_shared((C, block_v), dtype)
            a_sh = T.alloc_shared((C, C), dtype)
            g_sh = T.alloc_shared((C,), acc)
            b_sh = T.alloc_shared((C,), acc)
            d_sh = T.alloc_shared((C,), acc)
            dr_sh = T.alloc_shared((C,), acc)
            s_sh = T.alloc_shared((dk, block_v), dtype)
            w_sh = T.alloc_shared((C, block_v), dtype)
            ag_sh = T.alloc_shared((C, C), dtype)
            p_sh = T.alloc_shared((C, C), dtype)
            vn_sh = T.alloc_shared((C, block_v), dtype)
            vd_sh = T.alloc_shared((C, block_v), dtype)
            o_sh = T.alloc_shared((C, block_v), dtype)

            s = T.alloc_fragment((dk, block_v), acc)
            ks = T.alloc_fragment((C, block_v), acc)
            vn = T.alloc_fragment((C, block_v), acc)
            p = T.alloc_fragment((C, C), acc)
            ob = T.alloc_fragment((C, block_v), acc)
            ag = T.alloc_fragment((C, C), acc)

            if use_initial_state:
                for i, j in T.Parallel(dk, block_v):
                    if state_v_first:
                        s[i, j] = h0[seq, bh, v0 + j, i]
                    else:
                        s[i, j] = h0[seq, bh, i, v0 + j]
            else:
                T.clear(s)

            for c in T.Pipelined(n_chunks, num_stages=num_stages):
                t0 = start + c * C
                # Unmasked tile loads (zero-filled past the tensor end). Rows past this sequence's end
                # hold the next sequence's data: they only reach invalid rows of W, Vnew and O, which
                # D_r = 0 and the masked store drop (lower-triangular Ag and P never mix them in).
                T.copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh)
                T.copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh)
                T.copy(v[0, t0 : t0 + C, bh, v0 : v0 + block_v], v_sh)
                T.copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh)
                for i in T.Parallel(C):
                    g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                    b_sh[i] = beta[0, T.min(t0 + i, end - 1), bh]
                # D and D_r into consumer-owned buffers right away: TileLang's pipeline hands the g_sh
                # stage back to the producer after the last read of q_sh (the group's first tile), so
                # g_sh must not be read after the Q S GEMM (a race seen on the H200).
                for i in T.Parallel(C):
                    d_sh[i] = T.exp2(g_sh[i] * LOG2E)
                    dr_sh[i] = T.if_then_else(t0 + i < end, T.exp2((g_sh[C - 1] - g_sh[i]) * LOG2E), 0.0)
                T.copy(s, s_sh)
                if store_states:  # the GEMM operand copy, in the input dtype (as FLA keeps h)
                    T.copy(s_sh, states[chunk_offsets[seq] + c, bh, 0:dk, v0 : v0 + block_v])

                # W = V - D (K S)
                T.gemm(k_sh, s_sh, ks, clear_accum=True)
                for i, j in T.Parallel(C, block_v):
                    w_sh[i, j] = T.cast(
                        T.cast(v_sh[i, j], acc) - d_sh[i] * ks[i, j], dtype
                    )
                # Ag = (Gamma o A0) diag(beta)
                for i, j in T.Parallel(C, C):
                    ag[i, j] = T.if_then_else(
                        i >= j,
                        T.cast(a_sh[i, j], acc) * T.exp2((g_sh[i] - g_sh[j]) * LOG2E) * b_sh[j],
                        0.0,
                    )
                T.copy(ag, ag_sh)
                # Vnew = Ag W
                T.gemm(ag_sh, w_sh, vn, clear_accum=True)
                T.copy(vn, vn_sh)
                for i, j in T.Parallel(C, block_v):
                    vd_sh[i, j] = T.cast(dr_sh[i] * vn[i, j], dtype)
                # P = Gamma o (Q K^T)
                T.gemm(q_sh, k_sh, p, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    p[i, j] = T.if_then_else(i >= j, p[i, j] * T.exp2((g_sh[i] - g_sh[j]) * LOG2E), 0.0)
                T.copy(p, p_sh)
                # O = scale (D Q S + P Vnew)
                T.gemm(q_sh, s_sh, ob, clear_accum=True)
                for i, j in T.Parallel(C, block_v):
                    ob[i, j] = ob[i, j] * d_sh[i]
                T.gemm(p_sh, vn_sh, ob)
                for i, j in T.Parallel(C, block_v):
                    o_sh[i, j] = T.cast(ob[i, j] * scale, dtype)
                if t0 + C <= end:
                    T.copy(o_sh, o[0, t0 : t0 + C, bh, v0 : v0 + block_v])
                else:
                    for i, j in T.Parallel(C, block_v):
                        if t0 + i < end:
                            o[0, t0 + i, bh, v0 + j] = o_sh[i, j]
                # S' = exp(gamma) S + K^T (D_r Vnew)
                for i, j in T.Parallel(dk, block_v):
                    s[i, j] = s[i, j] * d_sh[C - 1]
                T.gemm(k_sh, vd_sh, s, transpose_A=True)

            for i, j in T.Parallel(dk, block_v):
                if state_v_first:
                    ht[seq, bh, v0 + j, i] = s[i, j]
                else:
                    ht[seq, bh, i, v0 + j] = s[i, j]

    if store_states:

        @T.prim_func
        def fused_fwd_states(
            q: T.Tensor((1, nt, h_qk, dk), dtype),
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            v: T.Tensor((1, nt, h_v, dv), dtype),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            a0: T.Tensor((1, nt, h_v, C), dtype),
            h0: T.Tensor(h0_shape, acc),
            cu_seqlens: T.Tensor((ns + 1,), "int32"),
            o: T.Tensor((1, nt, h_v, dv), dtype),
            ht: T.Tensor(st_shape, acc),
            chunk_offsets: T.Tensor((ns + 1,), "int32"),
            states: T.Tensor((nc, h_v, dk, dv), dtype),
        ):
            kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, chunk_offsets, states)

        return fused_fwd_states

    @T.prim_func
    def fused_fwd(
        q: T.Tensor((1, nt, h_qk, dk), dtype),
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        v: T.Tensor((1, nt, h_v, dv), dtype),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
        h0: T.Tensor(h0_shape, acc),
        cu_seqlens: T.Tensor((ns + 1,), "int32"),
        o: T.Tensor((1, nt, h_v, dv), dtype),
        ht: T.Tensor(st_shape, acc),
    ):
        kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, None, None)

    return fused_fwd


fused_fwd_kernel = tilelang.jit(fused_fwd_program, pass_configs=PASS_CONFIGS)
