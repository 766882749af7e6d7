"""Agb = Gamma o A0 diag(beta) from the stored A0, for the backward's stage 0 in the ws12 formation.

The forward's ws12 walk (fwd/fused_fwd_ws.py rev 9) forms each chunk's new values as U - Wk bf(S) from Agb,
which stage 1 writes in A0's place (kkt_solve_v3's emit_agb); the autograd forward keeps A0 instead, because
every backward stage reads A0. rounding_study_dg_fla (NOTES.md, session 24) found that a stage 0 in the ws12
formation stores states with ~25 % less error than the ws5 one (bf(Ag) bf(W): the rounded difference
V - D K S), which moves dg's error against FLA's from a coin flip towards below it. This kernel gives that
stage 0 its Agb from the stored bf16 A0 (rounded a second time, as that study emulated):
    Agb[t0 + i, j] = Gamma_ij A0[t0 + i, j] beta_j  (i >= j, token t0 + j inside the sequence; else 0)
with Gamma_ij = exp(g_i - g_j) from the chunk-local log-gate cumsum. Rows past a sequence's end belong to the
next sequence's chunk and are left to its CTA. One CTA per (chunk, value head).

cpu_debug=True builds the same program for TileLang's C backend (tests/kernels/test_bwd_agb_cpu.py).
"""

import tilelang
import tilelang.language as T

from ..fwd.fused_fwd import CHUNK, PASS_CONFIGS
from .tl_common import gamma_of

THREADS = 128


def agb_from_a0_program(dtype: str, cpu_debug: bool = False):
    """TileLang program: (a0 [1,T,H_v,C] dtype, g_cumsum, beta [1,T,H_v] fp32, cu_seqlens [N+1],
    chunk_indices [num_chunks, 2] int32) -> agb [1,T,H_v,C] dtype."""
    C = CHUNK
    h_v = T.dynamic("h_v")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"

    @T.prim_func
    def agb_from_a0(
        a0: T.Tensor((1, nt, h_v, C), dtype),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        agb: T.Tensor((1, nt, h_v, C), dtype),
    ):
        with T.Kernel(nc * h_v, threads=THREADS) as (bid,):
            g_sh = T.alloc_shared((C,), acc, scope="shared") if cpu_debug else T.alloc_shared((C,), acc)
            b_sh = T.alloc_shared((C,), acc, scope="shared") if cpu_debug else T.alloc_shared((C,), acc)
            # the CTA's indices once, in registers: substituted into every address, they cost 64-bit divisions
            # per element (stage 2 rev 3's lesson)
            bh = T.alloc_var("int32", init=bid % h_v)
            t0 = T.alloc_var("int32", init=cu_seqlens[chunk_indices[bid // h_v, 0]] + chunk_indices[bid // h_v, 1] * C)
            end = T.alloc_var("int32", init=cu_seqlens[chunk_indices[bid // h_v, 0] + 1])
            for i in T.Parallel(C):
                g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                b_sh[i] = T.if_then_else(t0 + i < end, beta[0, T.min(t0 + i, end - 1), bh], 0.0)
            if not cpu_debug:  # every row reads other threads' g and beta
                T.sync_threads()
            for i, j in T.Parallel(C, C):
                if t0 + i < end:
                    agb[0, t0 + i, bh, j] = T.cast(T.cast(a0[0, t0 + i, bh, j], acc) * gamma_of(g_sh, i, j) * b_sh[j],
                                                   dtype)  # fmt: skip

    return agb_from_a0


agb_from_a0_kernel = tilelang.jit(agb_from_a0_program, pass_configs=PASS_CONFIGS)
