"""Stage 1 of the backward: the reverse chain of state gradients, and dv.

One CTA per (sequence, value head, V-slice) walks that sequence's chunks last to first, keeping dS (the
gradient of the state after the current chunk) in fp32 on chip. Per chunk, with the forward's
D = diag(exp(g)), D_r = diag(exp(gamma - g)), Gamma_ij = exp(g_i - g_j) on i >= j,
Ag = (Gamma o A0) diag(beta) and P = scale Gamma o (Q K^T) (gdn/bwd_chunked.py, the specification):
    dVn = P^T dO + D_r (K dS')
    dW  = Ag^T dVn                                  (= dv of the chunk's tokens)
    dS  = exp(gamma) dS' + scale Q^T (D dO) - K^T (D dW)
None of this reads the forward's states S_c or v: the chain is linear in dS' with coefficients from
q, k, g, beta, A0 and dO only, and each V-slice of dS depends on the same slice of dS' and dO alone, so
V splits across CTAs as in the forward. Written out: dS' of every chunk (what the per-chunk gradient
stage needs next to S_c), dv, and dh0 = dS of the first chunk.

Ragged tails: g is clamped to the last valid token's (gamma stays right), dO rows past the end load as
zero and D_r is zero there, so those rows carry nothing into dS and their dv is never stored.

cpu_debug=True builds the same program for TileLang's C backend (GEMMs as loops, fragments as shared
buffers, fp32 in and out) so tests/kernels/test_bwd_dstate_cpu.py can run it against float64.
"""

import tilelang
import tilelang.language as T

from ..fwd.fused_fwd import CHUNK, LOG2E, PASS_CONFIGS
from .tl_common import build_helpers


def bwd_dstate_program(
    dk: int,
    dv: int,
    scale: float,
    dtype: str,
    use_dht: bool,
    block_v: int = 64,
    threads: int = 256,
    cpu_debug: bool = False,
    pipelined: bool = False,
    num_stages: int = 2,
    precomputed: bool = False,
    dod_split: bool = False,
    async_dod: bool = False,
    store_ds: bool = True,
):
    """TileLang program: (q, k, g_cumsum, beta, A0, dO, dht, cu_seqlens, chunk_offsets) ->
    (dv [1,T,H_v,V] fp32, ds_next [num_chunks,H_v,K,V] fp32, dh0 [N,H_v,K,V] fp32). Varlen (B = 1).

    chunk_offsets[s] is the index of sequence s's first chunk in ds_next (a prefix sum of
    ceil(len / 64)). Head counts are runtime values.

    pipelined=False (rev 1): masked element loads, every step serial. pipelined=True (rev 2): the
    forward v2's recipe, whole-tile loads (TMA on the GPU) of q, k, dO and A0 inside T.Pipelined, so
    the next chunk's tiles arrive while this one computes. Rows past a sequence's end then hold the next
    sequence's data: D is zeroed there and so are P's rows, which makes dVn's and dW's rows past the end
    exactly 0 (P^T dO sums valid rows only, D_r = 0 there, Ag is lower triangular), so nothing of them
    reaches dS.

    precomputed=True (rev 3, pipelined) takes dvl = P^T dO and Wk = Ag D K from bwd/dvl_wk.py (computed for
    all chunks in parallel) instead of A0 and beta, and leaves dv to stage 2; a step is then
        dVn = dvl + D_r (K dS'),   dS = exp(gamma) dS' + Q^T (scale D dO) - Wk^T dVn
    three GEMMs instead of six and no [C, C] gate work. Signature: (q, k, g_cumsum, dO, dvl, wk, dht,
    cu_seqlens, chunk_offsets) -> (ds_next, dh0).

    dod_split=True (rev 4, with precomputed) forms Q^T (scale D dO) from the operand's two halves in the
    input dtype, hi = round(x) and lo = round(x - hi), in two GEMMs: rev 3 rounded x = scale D dO to bf16
    once, and that single rounding, added into dS at every step, is why dh0's error was 1.24-1.26x FLA's on
    the harness's gates (FLA's dhu kernel multiplies q by exp(g) in fp32, so its q^T do product runs on
    tf32 operands). A float64 emulation of the chain with its roundings (NOTES.md, session 9): dh0 error
    2.86e-3 with rev 3's rounding, 2.22e-3 with the split, 2.23e-3 with x unrounded. Compiled for sm_90a
    (no spills) and CPU-checked; NOT yet run on a GPU.

    store_ds=False (the fused backward's pass A, with precomputed) leaves ds_next unwritten: only dh0 (each chain's
    start gradient) is wanted there.

    async_dod=True (rev 5, with dod_split) takes the two Q^T (scale D dO) products off the step's dependent
    chain (dS' -> K dS' -> dVn -> Wk^T dVn): dS' is scaled by exp(gamma) first, then K dS' and the two
    Q^T products are issued without waiting (T.wgmma_gemm), only K dS' is waited for before dVn is formed,
    and the products run while dVn's element-wise pass does. Same sums as rev 4 in another order (the
    CPU build runs them in that order, synchronously). Session 20's first GPU run was wrong (dk, dv, dg,
    dbeta, dh0 0.01-0.6): TileLang warp-specialises this pipelined loop, and the consumer releases q's stage
    to the TMA producer right after the last statement that reads it, the wgmma issue, so the producer could
    load chunk c - 2's Q over Q^T's operand while the products still ran. Q is now copied into a consumer-
    owned buffer (q2_sh) in the pass that forms scale D dO, and the products read that copy; K dS' (k's
    stage has the same release) is waited for at its issue, and the Q^T products are issued after it. Its
    second GPU run (call 3) passed the plain float64 cases but read higher errors on GVA 4 (dv 4.74e-3 against
    rev 4's 3.58e-3) and failed three of four CP cases (dk up to 1.7e-2, dh0 5.9e-2). The cause is not found:
    no buffer the products read is rewritten before a consumer barrier that follows both warpgroups' waits
    (the generated loop syncs the consumers after the gate loads, before scale D dO and the Q copy are
    formed), the shared plan aliases none of them, and ptxas reports no wgmma serialisation. Not the default.
    """
    assert not precomputed or pipelined
    assert not dod_split or precomputed
    assert not async_dod or dod_split
    if precomputed:
        return _dstate_precomputed_program(dk, dv, scale, dtype, use_dht, block_v, threads, cpu_debug, num_stages,
                                           dod_split, async_dod, store_ds)
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nv = dv // block_v
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs")
    nc = T.dynamic("num_chunks")
    nht = T.dynamic("num_dht")
    acc = "float32"

    mm, alloc_sh, alloc_acc = build_helpers(cpu_debug)

    def chunk_loop(n):
        return T.Pipelined(n, num_stages=num_stages) if pipelined else T.serial(n)

    @T.prim_func
    def bwd_dstate(
        q: T.Tensor((1, nt, h_qk, dk), dtype),
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
        grad_o: T.Tensor((1, nt, h_v, dv), dtype),
        dht: T.Tensor((nht, h_v, dk, dv), acc),
        cu_seqlens: T.Tensor((ns + 1,), "int32"),
        chunk_offsets: T.Tensor((ns + 1,), "int32"),
        dv_out: T.Tensor((1, nt, h_v, dv), acc),
        ds_next: T.Tensor((nc, h_v, dk, dv), acc),
        dh0: T.Tensor((ns, h_v, dk, dv), acc),
    ):
        with T.Kernel(ns * h_v * nv, threads=threads) as (bid,):
            seq = bid // (h_v * nv)
            bh = (bid // nv) % h_v
            v0 = (bid % nv) * block_v
            bhg = bh // (h_v // h_qk)
            start = cu_seqlens[seq]
            end = cu_seqlens[seq + 1]
            n_chunks = T.ceildiv(end - start, C)
            first_chunk = chunk_offsets[seq]

            q_sh = alloc_sh((C, dk), dtype)
            k_sh = alloc_sh((C, dk), dtype)
            do_sh = alloc_sh((C, block_v), dtype)
            a_sh = alloc_sh((C, C), dtype)
            g_sh = alloc_sh((C,), acc)
            b_sh = alloc_sh((C,), acc)
            d_sh = alloc_sh((C,), acc)
            dr_sh = alloc_sh((C,), acc)
            gl_sh = alloc_sh((C,), acc)
            bl_sh = alloc_sh((C,), acc)
            ds_sh = alloc_sh((dk, block_v), dtype)
            p_sh = alloc_sh((C, C), dtype)
            ag_sh = alloc_sh((C, C), dtype)
            dvn_sh = alloc_sh((C, block_v), dtype)
            dod_sh = alloc_sh((C, block_v), dtype)
            dwd_sh = alloc_sh((C, block_v), dtype)

            ds = alloc_acc((dk, block_v))
            kds = alloc_acc((C, block_v))
            dvn = alloc_acc((C, block_v))
            dw = alloc_acc((C, block_v))
            p = alloc_acc((C, C))
            ag = alloc_acc((C, C))

            if use_dht:
                for i, j in T.Parallel(dk, block_v):
                    ds[i, j] = dht[seq, bh, i, v0 + j]
            else:
                for i, j in T.Parallel(dk, block_v):
                    ds[i, j] = 0.0

            for ci in chunk_loop(n_chunks):
                c = n_chunks - 1 - ci
                t0 = start + c * C
                if not pipelined:  # rev 1 exactly as checked on the H200 (commit 824b411): dS' first
                    for i, j in T.Parallel(dk, block_v):
                        ds_next[first_chunk + c, bh, i, v0 + j] = ds[i, j]
                        ds_sh[i, j] = T.cast(ds[i, j], dtype)
                if pipelined:
                    T.copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh)
                    T.copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh)
                    T.copy(grad_o[0, t0 : t0 + C, bh, v0 : v0 + block_v], do_sh)
                    T.copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh)
                else:
                    for i, j in T.Parallel(C, dk):
                        q_sh[i, j] = q[0, T.min(t0 + i, end - 1), bhg, j]
                        k_sh[i, j] = k[0, T.min(t0 + i, end - 1), bhg, j]
                    for i, j in T.Parallel(C, block_v):
                        x = T.cast(grad_o[0, T.min(t0 + i, end - 1), bh, v0 + j], acc)
                        do_sh[i, j] = T.cast(T.if_then_else(t0 + i < end, x, 0.0), dtype)
                    for i, j in T.Parallel(C, C):
                        a_sh[i, j] = a0[0, T.min(t0 + i, end - 1), bh, j]
                for i in T.Parallel(C):
                    g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                    b_sh[i] = beta[0, T.min(t0 + i, end - 1), bh]
                if pipelined:
                    # consumer-owned copies at once: the pipeline may hand g_sh/b_sh back to the producer
                    # before the chunk's last use of them (the forward v2's race, NOTES.md). D is zero past
                    # the end: those rows hold the next sequence's dO.
                    for i in T.Parallel(C):
                        gl_sh[i] = g_sh[i]
                        bl_sh[i] = b_sh[i]
                        d_sh[i] = T.if_then_else(t0 + i < end, T.exp2(g_sh[i] * LOG2E), 0.0)
                        dr_sh[i] = T.if_then_else(t0 + i < end, T.exp2((g_sh[C - 1] - g_sh[i]) * LOG2E), 0.0)
                    # dS' of this chunk: the gradient of the state after it
                    for i, j in T.Parallel(dk, block_v):
                        ds_next[first_chunk + c, bh, i, v0 + j] = ds[i, j]
                        ds_sh[i, j] = T.cast(ds[i, j], dtype)
                else:
                    for i in T.Parallel(C):
                        d_sh[i] = T.exp2(g_sh[i] * LOG2E)
                        dr_sh[i] = T.if_then_else(t0 + i < end, T.exp2((g_sh[C - 1] - g_sh[i]) * LOG2E), 0.0)

                # P = scale Gamma o (Q K^T), Ag = (Gamma o A0) diag(beta), both lower triangular
                mm(q_sh, k_sh, p, transpose_b=True)
                if pipelined:  # P's rows past the end are zeroed (their q rows are another sequence's)
                    for i, j in T.Parallel(C, C):
                        p_sh[i, j] = T.cast(
                            T.if_then_else(
                                i >= j and t0 + i < end, p[i, j] * scale * T.exp2((gl_sh[i] - gl_sh[j]) * LOG2E), 0.0
                            ),
                            dtype,
                        )
                        ag[i, j] = T.if_then_else(
                            i >= j, T.cast(a_sh[i, j], acc) * T.exp2((gl_sh[i] - gl_sh[j]) * LOG2E) * bl_sh[j], 0.0
                        )
                else:
                    for i, j in T.Parallel(C, C):
                        p_sh[i, j] = T.cast(
                            T.if_then_else(i >= j, p[i, j] * scale * T.exp2((g_sh[i] - g_sh[j]) * LOG2E), 0.0), dtype
                        )
                        ag[i, j] = T.if_then_else(
                            i >= j, T.cast(a_sh[i, j], acc) * T.exp2((g_sh[i] - g_sh[j]) * LOG2E) * b_sh[j], 0.0
                        )
                T.copy(ag, ag_sh)
                # dVn = P^T dO + D_r (K dS')
                mm(k_sh, ds_sh, kds)
                mm(p_sh, do_sh, dvn, transpose_a=True)
                for i, j in T.Parallel(C, block_v):
                    dvn_sh[i, j] = T.cast(dvn[i, j] + dr_sh[i] * kds[i, j], dtype)
                # dW = Ag^T dVn, the chunk's dv
                mm(ag_sh, dvn_sh, dw, transpose_a=True)
                for i, j in T.Parallel(C, block_v):
                    if t0 + i < end:
                        dv_out[0, t0 + i, bh, v0 + j] = dw[i, j]
                # dS = exp(gamma) dS' + Q^T (scale D dO) + K^T (-D dW)
                for i, j in T.Parallel(C, block_v):
                    dod_sh[i, j] = T.cast(scale * d_sh[i] * T.cast(do_sh[i, j], acc), dtype)
                    dwd_sh[i, j] = T.cast(-d_sh[i] * dw[i, j], dtype)
                if pipelined:  # d_sh[C - 1] may be masked here; q_sh read last (a stage is released after it)
                    for i, j in T.Parallel(dk, block_v):
                        ds[i, j] = ds[i, j] * T.exp2(gl_sh[C - 1] * LOG2E)
                    mm(k_sh, dwd_sh, ds, transpose_a=True, clear=False)
                    mm(q_sh, dod_sh, ds, transpose_a=True, clear=False)
                else:
                    for i, j in T.Parallel(dk, block_v):
                        ds[i, j] = ds[i, j] * d_sh[C - 1]
                    mm(q_sh, dod_sh, ds, transpose_a=True, clear=False)
                    mm(k_sh, dwd_sh, ds, transpose_a=True, clear=False)

            for i, j in T.Parallel(dk, block_v):
                dh0[seq, bh, i, v0 + j] = ds[i, j]

    return bwd_dstate


def _dstate_precomputed_program(dk, dv, scale, dtype, use_dht, block_v, threads, cpu_debug, num_stages, dod_split,
                                async_dod=False, store_ds=True):
    """Stage 1 rev 3, and rev 4 with dod_split (see bwd_dstate_program): the chain over precomputed dvl and Wk."""
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nv = dv // block_v
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs")
    nc = T.dynamic("num_chunks")
    nht = T.dynamic("num_dht")
    acc = "float32"
    mm, alloc_sh, alloc_acc = build_helpers(cpu_debug)

    def scaled_do(d_sh, do_sh, i, j):
        """x = scale D dO, in fp32."""
        return scale * d_sh[i] * T.cast(do_sh[i, j], acc)

    def low_part(x):
        """What rounding x to the input dtype leaves, rounded to it (rev 4's second operand)."""
        return T.cast(x - T.cast(T.cast(x, dtype), acc), dtype)

    @T.prim_func
    def bwd_dstate_pre(
        q: T.Tensor((1, nt, h_qk, dk), dtype),
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        grad_o: T.Tensor((1, nt, h_v, dv), dtype),
        dvl: T.Tensor((1, nt, h_v, dv), acc),
        wk: T.Tensor((1, nt, h_v, dk), dtype),
        dht: T.Tensor((nht, h_v, dk, dv), acc),
        cu_seqlens: T.Tensor((ns + 1,), "int32"),
        chunk_offsets: T.Tensor((ns + 1,), "int32"),
        ds_next: T.Tensor((nc, h_v, dk, dv), acc),
        dh0: T.Tensor((ns, h_v, dk, dv), acc),
    ):
        with T.Kernel(ns * h_v * nv, threads=threads) as (bid,):
            seq = T.alloc_var("int32", init=bid // (h_v * nv))
            bh = T.alloc_var("int32", init=(bid // nv) % h_v)
            v0 = T.alloc_var("int32", init=(bid % nv) * block_v)
            bhg = T.alloc_var("int32", init=((bid // nv) % h_v) // (h_v // h_qk))
            start = T.alloc_var("int32", init=cu_seqlens[bid // (h_v * nv)])
            end = T.alloc_var("int32", init=cu_seqlens[bid // (h_v * nv) + 1])
            first_chunk = T.alloc_var("int32", init=chunk_offsets[bid // (h_v * nv)])
            n_chunks = T.ceildiv(end - start, C)

            q_sh = alloc_sh((C, dk), dtype)
            k_sh = alloc_sh((C, dk), dtype)
            wk_sh = alloc_sh((C, dk), dtype)
            do_sh = alloc_sh((C, block_v), dtype)
            dvl_sh = alloc_sh((C, block_v), acc)
            g_sh = alloc_sh((C,), acc)
            gl_sh = alloc_sh((C,), acc)
            d_sh = alloc_sh((C,), acc)
            dr_sh = alloc_sh((C,), acc)
            ds_sh = alloc_sh((dk, block_v), dtype)
            ndvn_sh = alloc_sh((C, block_v), dtype)  # -dVn
            dod_sh = alloc_sh((C, block_v), dtype)  # scale D dO (rev 4: its rounded high part)
            dodl_sh = alloc_sh((C, block_v), dtype) if dod_split else None  # rev 4: what the rounding left
            q2_sh = alloc_sh((C, dk), dtype) if async_dod else None  # rev 5: Q for the products still in flight

            ds = alloc_acc((dk, block_v))
            kds = alloc_acc((C, block_v))

            if use_dht:
                for i, j in T.Parallel(dk, block_v):
                    ds[i, j] = dht[seq, bh, i, v0 + j]
            else:
                for i, j in T.Parallel(dk, block_v):
                    ds[i, j] = 0.0

            for ci in T.Pipelined(n_chunks, num_stages=num_stages):
                c = n_chunks - 1 - ci
                t0 = start + c * C
                T.copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh)
                T.copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh)
                T.copy(wk[0, t0 : t0 + C, bh, 0:dk], wk_sh)
                T.copy(grad_o[0, t0 : t0 + C, bh, v0 : v0 + block_v], do_sh)
                T.copy(dvl[0, t0 : t0 + C, bh, v0 : v0 + block_v], dvl_sh)
                for i in T.Parallel(C):
                    g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                # consumer-owned gate values at once (rev 2's lesson: the pipeline may hand the stage's
                # buffers back before their last read); D and D_r are zero past the end
                for i in T.Parallel(C):
                    gl_sh[i] = g_sh[i]
                    d_sh[i] = T.if_then_else(t0 + i < end, T.exp2(g_sh[i] * LOG2E), 0.0)
                    dr_sh[i] = T.if_then_else(t0 + i < end, T.exp2((g_sh[C - 1] - g_sh[i]) * LOG2E), 0.0)
                # dS' of this chunk: the gradient of the state after it (not stored by the fused backward's pass A,
                # which needs only the pieces' start gradients)
                for i, j in T.Parallel(dk, block_v):
                    if store_ds:
                        ds_next[first_chunk + c, bh, i, v0 + j] = ds[i, j]
                    ds_sh[i, j] = T.cast(ds[i, j], dtype)
                if async_dod:  # rev 5: Q^T (scale D dO) issued with K dS', waited for at the step's end
                    for i, j in T.Parallel(C, block_v):
                        dod_sh[i, j] = T.cast(scaled_do(d_sh, do_sh, i, j), dtype)
                        dodl_sh[i, j] = low_part(scaled_do(d_sh, do_sh, i, j))
                    for i, j in T.Parallel(C, dk):  # q's pipeline stage is released at its last read: this
                        q2_sh[i, j] = q_sh[i, j]
                    for i, j in T.Parallel(dk, block_v):
                        ds[i, j] = ds[i, j] * T.exp2(gl_sh[C - 1] * LOG2E)
                    if cpu_debug:
                        mm(k_sh, ds_sh, kds)
                        mm(q2_sh, dod_sh, ds, transpose_a=True, clear=False)
                        mm(q2_sh, dodl_sh, ds, transpose_a=True, clear=False)
                    else:
                        mm(k_sh, ds_sh, kds)  # waited for here: k's stage is released after this read
                        T.wgmma_gemm(q2_sh, dod_sh, ds, transpose_A=True)
                        T.wgmma_gemm(q2_sh, dodl_sh, ds, transpose_A=True)
                    for i, j in T.Parallel(C, block_v):
                        ndvn_sh[i, j] = T.cast(
                            T.if_then_else(t0 + i < end, -dvl_sh[i, j] - dr_sh[i] * kds[i, j], 0.0), dtype
                        )
                    mm(wk_sh, ndvn_sh, ds, transpose_a=True, clear=False)
                    if not cpu_debug:
                        T.wait_wgmma(0)
                else:  # revs 3 and 4
                    # dVn = dvl + D_r (K dS'), rows past the end zero (dvl there is another sequence's)
                    mm(k_sh, ds_sh, kds)
                    for i, j in T.Parallel(C, block_v):
                        ndvn_sh[i, j] = T.cast(
                            T.if_then_else(t0 + i < end, -dvl_sh[i, j] - dr_sh[i] * kds[i, j], 0.0), dtype
                        )
                        dod_sh[i, j] = T.cast(scaled_do(d_sh, do_sh, i, j), dtype)
                        if dod_split:  # in the same pass: do_sh's pipeline stage is released after its last read
                            dodl_sh[i, j] = low_part(scaled_do(d_sh, do_sh, i, j))
                    # dS = exp(gamma) dS' - Wk^T dVn + Q^T (scale D dO); q_sh read last (its stage is released
                    # after that read)
                    for i, j in T.Parallel(dk, block_v):
                        ds[i, j] = ds[i, j] * T.exp2(gl_sh[C - 1] * LOG2E)
                    mm(wk_sh, ndvn_sh, ds, transpose_a=True, clear=False)
                    mm(q_sh, dod_sh, ds, transpose_a=True, clear=False)
                    if dod_split:
                        mm(q_sh, dodl_sh, ds, transpose_a=True, clear=False)

            for i, j in T.Parallel(dk, block_v):
                dh0[seq, bh, i, v0 + j] = ds[i, j]

    return bwd_dstate_pre


bwd_dstate_kernel = tilelang.jit(bwd_dstate_program, pass_configs=PASS_CONFIGS)
