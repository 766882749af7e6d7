"""Before stage 1 rev 3 of the backward: the parts of each chunk step that do not depend on dS', all
chunks in parallel.

Stage 1's chain (gdn/bwd/dstate_chain.py) per chunk, with P = scale Gamma o (Q K^T) (lower, with its
diagonal), Ag = (Gamma o A0) diag(beta) and D = diag(exp(g)):
    dVn = P^T dO + D_r (K dS'),   dS = exp(gamma) dS' + scale Q^T (D dO) - K^T D Ag^T dVn
Two of its products do not involve dS', and the second folds into one matrix because
Gamma_ij exp(g_j) = exp(g_i):
    dvl = P^T dO                     [C, V]  (fp32: it is added to D_r (K dS') before any rounding)
    Wk  = Ag D K = D A0 diag(beta) K [C, K]  (in the input dtype: a GEMM operand of the chain)
so K^T D Ag^T dVn = Wk^T dVn. Computing them here, one CTA per (chunk, value head) with every chunk in
flight, takes three of the six GEMMs and all of the [C, C] gate work off the serial chain (rev 2 built
P and Ag inside every step). dv (= Ag^T dVn) then comes from stage 2, which computes that product anyway.

Rows past a sequence's end: q, k and dO rows there load as zero, so P's rows there are zero and dvl's
rows there are zero; they are never stored. The chain masks its own loads of dvl past the end.

cpu_debug=True builds the same program for TileLang's C backend (tests/kernels/test_bwd_dstate_cpu.py and
test_bwd_pipeline_cpu.py run it against float64).
"""

import tilelang
import tilelang.language as T

from ..fwd.fused_fwd import CHUNK, LOG2E, PASS_CONFIGS
from .tl_common import build_helpers


def bwd_dvl_wk_program(dk: int, dv: int, scale: float, dtype: str, threads: int = 128, cpu_debug: bool = False):
    """TileLang program: (q, k, g_cumsum, beta, A0, dO, cu_seqlens, chunk_indices) -> (dvl [1,T,H_v,V] fp32,
    wk [1,T,H_v,K] in the input dtype). Varlen (B = 1); chunk_indices rows are (sequence, chunk in it)."""
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"
    mm, alloc_sh, alloc_acc = build_helpers(cpu_debug)

    @T.prim_func
    def bwd_dvl_wk(
        q: T.Tensor((1, nt, h_qk, dk), dtype),
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
        grad_o: T.Tensor((1, nt, h_v, dv), dtype),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        dvl: T.Tensor((1, nt, h_v, dv), acc),
        wk: T.Tensor((1, nt, h_v, dk), dtype),
    ):
        with T.Kernel(nc * h_v, threads=threads) as (bid,):
            # the CTA's indices once, in registers (in every address they cost 64-bit divisions)
            bh = T.alloc_var("int32", init=bid % h_v)
            bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
            t0 = T.alloc_var("int32", init=cu_seqlens[chunk_indices[bid // h_v, 0]] + chunk_indices[bid // h_v, 1] * C)
            end = T.alloc_var("int32", init=cu_seqlens[chunk_indices[bid // h_v, 0] + 1])

            q_sh = alloc_sh((C, dk), dtype)
            k_sh = alloc_sh((C, dk), dtype)
            do_sh = alloc_sh((C, dv), dtype)
            a_sh = alloc_sh((C, C), dtype)
            p_sh = alloc_sh((C, C), dtype)
            kb_sh = alloc_sh((C, dk), dtype)  # diag(beta) K
            g_sh = alloc_sh((C,), acc)
            b_sh = alloc_sh((C,), acc)
            p = alloc_acc((C, C))
            out_v = alloc_acc((C, dv))
            out_k = alloc_acc((C, dk))

            T.copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh)
            T.copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh)
            T.copy(grad_o[0, t0 : t0 + C, bh, 0:dv], do_sh)
            T.copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh)
            if end - t0 < C:  # the sequence's last chunk: the rows after its end are another sequence's
                for i, j in T.Parallel(C, dk):
                    if t0 + i >= end:
                        q_sh[i, j] = T.cast(0, dtype)
                        k_sh[i, j] = T.cast(0, dtype)
                for i, j in T.Parallel(C, dv):
                    if t0 + i >= end:
                        do_sh[i, j] = T.cast(0, dtype)
            for i in T.Parallel(C):
                g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                b_sh[i] = T.if_then_else(t0 + i < end, beta[0, T.min(t0 + i, end - 1), bh], 0.0)

            # dvl = P^T dO, P = scale Gamma o (Q K^T) on i >= j
            mm(q_sh, k_sh, p, transpose_b=True)
            for i, j in T.Parallel(C, C):
                p_sh[i, j] = T.cast(
                    T.if_then_else(i >= j, p[i, j] * scale * T.exp2((g_sh[i] - g_sh[j]) * LOG2E), 0.0), dtype
                )
            mm(p_sh, do_sh, out_v, transpose_a=True)
            for i, j in T.Parallel(C, dv):
                if t0 + i < end:
                    dvl[0, t0 + i, bh, j] = out_v[i, j]

            # Wk = D A0 diag(beta) K (A0 is lower triangular; its rows past the end are never stored)
            for i, j in T.Parallel(C, dk):
                kb_sh[i, j] = T.cast(b_sh[i] * T.cast(k_sh[i, j], acc), dtype)
            for i, j in T.Parallel(C, C):
                a_sh[i, j] = T.if_then_else(i >= j, a_sh[i, j], T.cast(0, dtype))
            mm(a_sh, kb_sh, out_k)
            for i, j in T.Parallel(C, dk):
                if t0 + i < end:
                    wk[0, t0 + i, bh, j] = T.cast(T.exp2(g_sh[i] * LOG2E) * out_k[i, j], dtype)

    return bwd_dvl_wk


bwd_dvl_wk_kernel = tilelang.jit(bwd_dvl_wk_program, pass_configs=PASS_CONFIGS)
