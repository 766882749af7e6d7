"""Stage 2 of the backward: every chunk's dq, dk, dbeta and dg, all chunks in parallel.

One CTA per (chunk, value head) takes the chunk's start state S_c and dS' (the gradient of the state
after the chunk, from stage 1: gdn/bwd/dstate_chain.py) and recomputes what it needs of the forward.
With D, D_r, Gamma, Ag = (Gamma o A0) diag(beta) and P = scale Gamma o (Q K^T) as in the forward, L the
lower triangle with its diagonal (gdn/bwd_chunked.py, _chunk_bwd, is the specification):
    W = V - D (K S),  Vn = Ag W,  dVn = P^T dO + D_r (K dS'),  dW = Ag^T dVn
    dP = (dO Vn^T) o L,  dQK = scale Gamma o dP,  dAg = (dVn W^T) o L
    dq = scale D (dO S^T) + dQK K
    dM = -A0^T (dAg o Gamma diag(beta)) A0^T,  dL = StrictLower(dM),  dKKt = diag(beta) dL
    dk = dQK^T Q - (D dW) S^T + D_r (Vn dS'^T) + dKKt K + dKKt^T K
    dbeta_j = sum_i (dAg o Gamma o A0)_ij + sum_i' (dL o K K^T)_ji'
    dg: the gradient of the chunk-local cumsum (row terms of D, D_r and gamma; pair terms
        (dAg o A0 diag(beta) + scale dP o QK^T) o Gamma on i > j), reverse-cumsummed within the chunk.
dq and dk are written per value head in fp32; the caller sums each GVA group (no atomics, no bf16
round trip in a transposed reduction). Rows past a sequence's end load as zero, so they add nothing.

cpu_debug=True builds the same program for TileLang's C backend (GEMMs and reductions as loops, fp32
in and out) so tests/kernels/test_bwd_chunk_grads_cpu.py can run it against float64.
"""

import inspect

import tilelang
import tilelang.language as T

from ..fwd.fused_fwd import CHUNK, LOG2E, PASS_CONFIGS
from .tl_common import build_helpers, gamma_of

# Profile build (profile=True): thread 0 of every CTA stamps clock64 after a barrier at these points,
# into prof [num_chunks * H_v, len(PROFILE_STAMPS)] int64; consecutive differences are the phases.
PROFILE_STAMPS = (
    "start", "tiles loaded", "S, dS' loaded", "W, Vn, P", "dVn, x", "dW, row sums", "dP, dAg, gates",
    "A0 path, dbeta", "dq", "dk", "dg",
)  # fmt: skip
# The fused walk's profile build (fused=True, profile=True) adds the chain step's end; its prof
# [P * H_v, len(FUSED_PROFILE_STAMPS) - 1] int64 (zeroed by the caller) sums each phase's cycles over the CTA's chunks.
FUSED_PROFILE_STAMPS = (*PROFILE_STAMPS, "chain")


def bwd_chunk_grads_program(
    dk: int,
    dv: int,
    scale: float,
    dtype: str,
    threads: int = 256,
    cpu_debug: bool = False,
    profile: bool = False,
    tile_loads: bool = False,
    hoist_index: bool = False,
    tma_loads: bool = False,
    dw_beta_fp32: bool = False,
    gamma_frag: bool = False,
    ds_tma: bool = False,
    scan_dg: bool = False,
    store_dv: bool = False,
    cluster_sum: bool = False,
    gva_ratio: int = 2,
    cluster_probe: bool = False,
    pair_early: bool = False,
    lean: bool = False,
    dg_i2: bool = False,
    fused: bool = False,
    prefetch: bool = False,
):
    """TileLang program: (q, k, v, g_cumsum, beta, A0, dO, states, ds_next, cu_seqlens, chunk_indices) ->
    (dq_v, dk_v [1,T,H_v,K] fp32 per value head, dbeta, dg [1,T,H_v] fp32). Varlen (B = 1).

    states[c] is the state at the start of global chunk c ([num_chunks,H_v,K,V] in the input dtype, as the
    forward's store_states mode writes it), ds_next[c] the gradient of the state after it (fp32);
    chunk_indices rows are (sequence, chunk within the sequence). profile=True adds a last argument,
    prof (PROFILE_STAMPS); a measuring build, never what the backward runs.

    tile_loads=False (rev 1, checked on the H200): every tile is loaded element by element with the row
    mask in the load; the profile build showed those loads as 41 % of a CTA (44 K of 108 K cycles at
    16/32 x 8192). tile_loads=True (rev 2): whole-tile copies (TMA on the GPU) of q, k, v, dO, A0, S and
    dS', then the rows past the sequence's end (another sequence's tokens) zeroed in shared memory,
    only in a sequence's last chunk. hoist_index=True (rev 3, with tile_loads) computes the CTA's indices
    once into registers and shortens the dg tail (the 7.8 K-cycle phase) to one 64-step sum per row; on
    the H200 the CTA went from 95 K to 50.7 K cycles. tma_loads=True (rev 4, GPU only) is rev 3 with the
    tiles and S brought in by TMA: one warp issues all six bulk copies at the start (k, S, v, A0 on one
    mbarrier, q and dO on another) while every thread loads g, beta and dS'; loads 15.3 K -> 9.0 K cycles.

    dw_beta_fp32=True (rev 6) forms dW = diag(beta) ((Gamma o A0)^T dVn), beta applied to the fp32 product,
    instead of Ag^T dVn with beta inside the bf16-rounded Ag: each token's beta then carries no rounding
    error of its own into its whole row of dW (and dv), the cause of dv's 1.11-1.16x FLA error found by the
    forward's rounding study (NOTES.md, session 6). Vn keeps the forward's Ag W.

    gamma_frag=True (rev 7) evaluates Gamma once per CTA into a [C, C] fp32 fragment (the accumulators'
    layout: 16 registers a thread) instead of at each of its seven uses (an exp2 and two shared loads of g
    each): the profile build put the element-wise phases W/Vn/P and dP/dAg/gates at 17.5 K of 48.5 K cycles.
    ds_tma=True (rev 7, GPU only, with tma_loads) brings dS' (fp32, 64 KiB, the largest tile) in by TMA with
    the other tiles into a shared buffer whose lifetime ends at its bf16 cast, instead of a global ->
    register copy by every thread before the barrier wait; dO is copied once dS' is cast (its buffer may
    take dS''s space: 218 KiB of shared memory otherwise grows to 233) and waited for at its first use, dVn.

    scan_dg=True (rev 8, GPU only, with ds_tma) ends with dg_i = sum_j row_c[j] + sum_{i <= j < n} dgc_j as two
    shared-memory scans (T.cumsum, reversed) instead of a 64-step serial sum per row: that tail took 3.4 K of
    rev 7's 37.1 K cycles.

    store_dv=True (with stage 1 rev 3, which no longer forms dW) also writes dv = dW = Ag^T dVn, in the
    input dtype, to one more argument after dg: dv [1,T,H_v,V].

    cluster_sum=True (rev 9, GPU only, with scan_dg) writes dq and dk already summed over the GVA group, in the
    input dtype ([1,T,H_qk,K]), for gva_ratio = h_v / h_qk of 1 (a plain cast) or 2: the group's two value
    heads are adjacent CTAs, launched as a 2-CTA cluster; each gradient's fp32 tile goes from one CTA's shared
    memory into its partner's (one bulk copy, DSMEM), which adds it to its own and stores the rounded sum:
    rank 0 owns dq, rank 1 dk. That drops the fp32 per-value-head tensors (4 bytes a value twice, written
    and read again) and the group-sum kernel (bwd/group_sum.py). cluster_probe=True (a measuring build, never
    what the backward runs) launches the per-value-head program (cluster_sum=False) in 2-CTA clusters with no
    exchange: what the cluster launch alone costs.

    pair_early=True (rev 10, with cluster_sum at gva_ratio 2) keeps one hand-off of rev 9's two on the pair's
    path: both CTAs form dk first (into ck), and rank 0 sends its dk at once; both then form dq into a second
    accumulator; rank 1, whose partner's dk has been in flight meanwhile, adds it, sends its dq back through the
    same buffer and stores dk; rank 0 waits for that dq, adds, stores. A split cluster barrier after the
    exchange keeps rank 1's outgoing copy's source intact until rank 0 has it.

    lean=True (rev 12, with dw_beta_fp32; session 22, from the study of FlashQLA's fused backward) drops three
    GEMMs of rev 8's 21 (10 of its 56 units of 64^3 MACs), each operand rounded as in rev 8 and dg's formula
    unchanged (only fp32 summation orders differ):
    - D_i scale <dO, QS>_i is the row sum of Q o dQ's first product (scale D dO S^T), taken before dQK K is added:
      no Q S GEMM;
    - x_i = rowsum(K o D_r Vn dS'^T), taken from dk's first product before its other terms: no second K dS';
    - dbeta's first part is rowsum(W o dW~) with dW~ = (Gamma o A0)^T dVn before beta is applied (NOTES "I1"): a
      row sum instead of a column sum;
    - dKKt K + dKKt^T K as one GEMM on dKKt + dKKt^T (disjoint triangles: the sum is exact in the input dtype).
    dg's terms that need these row sums are added at the end.
    dg_i2=True (rev 13, with lean) also takes dgc_i = D_i scale <dO, QS>_i + rowsum(P o dO Vn^T)_i - <V, dv>_i
    (NOTES "I2": the x terms cancel) with dgamma = sum x + e^gamma <S, dS'> as before: no <D dW, K S> (a fourth
    GEMM, K S again), no dAg pair terms, no column sum; V stays resident until dv is formed. Its rounding is not
    rev 8's: rounding_study_dg's form "i2x" puts dg's error at 0.9-1.5x rev 6's (the x total no longer cancels
    the same rounded x per row; form "i2", with the stored state after the chunk in dgamma, is 0.5-1.3x).

    fused=True (session 23, with rev 12's flags but dS' not by TMA, and store_dv): the fused backward's walk. One CTA
    per (piece, value head) takes the piece's chunks last to first, each with this program's per-chunk body, then
    stage 1 rev 4's chain step: dS = exp(gamma) dS' + Q^T (scale D dO) (high and low bf16 parts, in w_sh and vn_sh)
    - K^T (D dW) (dk's operand dwd_sh). dS' lives in fp32 in ds_next, here one [K, V] slot per (piece, value head):
    it holds the piece's end gradient on entry and its start gradient on exit. Signature: (q, k, v, g_cumsum, beta,
    A0, dO, states, ds_slots [P,H_v,K,V] fp32, cu_seqlens of the pieces [P+1], chunk_offsets [P+1] (each piece's
    first chunk in states), dq_v, dk_v, dbeta, dg, dv). Built with MERGED_PASS_CONFIGS (bwd_chunk_grads_kernel).
    """
    assert not (profile and cpu_debug)
    assert not tma_loads or (tile_loads and hoist_index and not cpu_debug)  # rev 4 is rev 3 plus TMA, GPU only
    assert not ds_tma or tma_loads
    assert not scan_dg or ds_tma or (fused and tma_loads)
    assert not (store_dv and profile) or fused
    assert not cluster_sum or (scan_dg and gva_ratio in (1, 2))
    assert not (cluster_probe and cluster_sum)
    assert not pair_early or (cluster_sum and gva_ratio == 2)
    assert not lean or (dw_beta_fp32 and not pair_early)
    assert not dg_i2 or lean
    # fused (session 23): the walk over a piece's chunks, dS' carried in fp32 through `ds_next` (one [K, V] slot per
    # piece and value head, L2-resident); rev 12's math and roundings, dv stored, per value head, no TMA of dS'
    assert not fused or (lean and not dg_i2 and tile_loads and hoist_index and store_dv and not ds_tma)
    assert not (profile and prefetch)  # the prefetching walk's chain step sits inside the dg phase
    assert not fused or not (cluster_sum or cluster_probe)
    assert not prefetch or (fused and tma_loads)
    pair = cluster_sum and gva_ratio == 2  # two CTAs exchange tiles
    assert not hoist_index or dk == 2 * CHUNK  # rev 3 folds the dk row sums of <S, dS'> in two halves
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"

    mm, alloc_sh, alloc_acc = build_helpers(cpu_debug)

    @T.macro
    def reduce_sum(src, out, tmp, dim):
        """out = src summed over dim (1: row sums, 0: column sums); out in shared memory, tmp a
        fragment of out's shape that the GPU reduction writes first."""
        if cpu_debug:
            for a in T.Parallel(out.shape[0]):
                out[a] = 0.0
                for b in T.serial(src.shape[dim]):
                    out[a] = out[a] + (src[a, b] if dim == 1 else src[b, a])
        else:
            T.reduce_sum(src, tmp, dim=dim)
            T.copy(tmp, out)

    def gamma(g_sh, gam, i, j):
        """Gamma_ij: read from the CTA's fragment (rev 7) or recomputed at each use."""
        return gam[i, j] if gamma_frag else gamma_of(g_sh, i, j)

    @T.macro
    def stamp(prof, bid, point, clk=None):
        """Profile builds: every thread reaches this point, then thread 0 reads the clock. The fused walk's
        (clk: thread 0's last reading) adds the phase that ends here to its running sum instead."""
        if profile:
            T.sync_threads()
            if T.get_thread_binding() == 0:
                if fused:
                    now = T.call_extern("int64", "clock64")
                    if point > 0:
                        prof[bid, point - 1] = prof[bid, point - 1] + (now - clk[0])
                    clk[0] = now
                else:
                    prof[bid, point] = T.call_extern("int64", "clock64")

    @T.macro
    def pair_send(tile, pair_sh, pair_bar, partner):
        """tile (fp32 registers) into pair_sh, then one bulk copy into the partner's pair_sh."""
        for i, j in T.Parallel(C, dk):
            pair_sh[i, j] = tile[i, j]
        T.fence_proxy_async()
        T.sync_threads()
        T.copy_cluster(pair_sh, pair_sh, dst_block=partner, remote_barrier=pair_bar[0])

    @T.macro
    def group_store(tile, out, pair_sh, pair_bar, owner, rank, t0, end, bhg):
        """rev 9: out[t0 + i, bhg] = the GVA group's sum of tile (fp32 [C, K] in registers), rounded once.
        With a pair, the CTA of rank != owner sends its tile into the owner's pair_sh by a bulk copy that
        completes on the owner's pair_bar; the owner adds and stores. dq (owner 0) comes first: the cluster
        barrier before it ends, in both CTAs, every buffer pair_sh may share (the merged shared-memory plan
        places buffers by lifetime, and pair_sh's starts here). dk (owner 1) reuses pair_sh both ways: rank 1's
        outgoing dq copy has completed (rank 0 waited for it) before rank 0 computes and sends dk; rank 0 then
        waits, at a split cluster barrier, until rank 1 has its dk tile, so the copy's source stays intact
        (and the CTA alive) while it is read."""
        if not pair:
            for i, j in T.Parallel(C, dk):
                if t0 + i < end:
                    out[0, t0 + i, bhg, j] = T.cast(tile[i, j], dtype)
        else:
            if owner == 0:
                T.cluster_sync()
            if rank != owner:
                T.sync_threads()
                pair_send(tile, pair_sh, pair_bar, owner)
                if owner == 1:
                    T.cluster_arrive()
            else:
                T.barrier_wait(pair_bar[0], 0)
                if owner == 1:
                    T.cluster_arrive()
                for i, j in T.Parallel(C, dk):
                    if t0 + i < end:
                        out[0, t0 + i, bhg, j] = T.cast(tile[i, j] + pair_sh[i, j], dtype)
                T.sync_threads()
            if owner == 1:
                T.cluster_wait()

    @T.macro
    def dq_gemms(acc_tile, do_sh, s_sh, d_sh, dqk_sh, k_sh):
        """acc_tile = dq = scale D (dO S^T) + dQK K."""
        mm(do_sh, s_sh, acc_tile, transpose_b=True)
        for i, j in T.Parallel(C, dk):
            acc_tile[i, j] = scale * d_sh[i] * acc_tile[i, j]
        mm(dqk_sh, k_sh, acc_tile, clear=False)

    @T.macro
    def dk_gemms(acc_tile, dqk_sh, q_sh, vnr_sh, ds_sh, dkkt_sh, k_sh, dwd_sh, s_sh):
        """acc_tile = dk = dQK^T Q - (D dW) S^T + D_r (Vn dS'^T) + dKKt K + dKKt^T K (negates dwd_sh in place)."""
        mm(dqk_sh, q_sh, acc_tile, transpose_a=True)
        mm(vnr_sh, ds_sh, acc_tile, transpose_b=True, clear=False)
        mm(dkkt_sh, k_sh, acc_tile, clear=False)
        mm(dkkt_sh, k_sh, acc_tile, transpose_a=True, clear=False)
        for i, j in T.Parallel(C, dv):
            dwd_sh[i, j] = -dwd_sh[i, j]
        mm(dwd_sh, s_sh, acc_tile, transpose_b=True, clear=False)

    @T.macro
    def dq_gemms_lean(acc_tile, tmp, red, row_out, do_sh, s_sh, d_sh, dqk_sh, k_sh, q_sh):
        """rev 12: dq as dq_gemms, with D_i scale <dO, QS>_i = rowsum(Q o scale D dO S^T) taken into row_out
        between the two products."""
        mm(do_sh, s_sh, acc_tile, transpose_b=True)
        for i, j in T.Parallel(C, dk):
            acc_tile[i, j] = scale * d_sh[i] * acc_tile[i, j]
            tmp[i, j] = acc_tile[i, j] * T.cast(q_sh[i, j], acc)
        reduce_sum(tmp, row_out, red, 1)
        mm(dqk_sh, k_sh, acc_tile, clear=False)

    @T.macro
    def dk_gemms_lean(acc_tile, tmp, red, x_out, dqk_sh, q_sh, vnr_sh, ds_sh, dkkt_sh, sym_sh, k_sh, dwd_sh, s_sh):
        """rev 12: dk as dk_gemms, D_r (Vn dS'^T) first so that x = rowsum(K o it) comes from the accumulator
        (into x_out), and the two dKKt products as one on sym_sh = dKKt + dKKt^T."""
        mm(vnr_sh, ds_sh, acc_tile, transpose_b=True)
        for i, j in T.Parallel(C, dk):
            tmp[i, j] = acc_tile[i, j] * T.cast(k_sh[i, j], acc)
        reduce_sum(tmp, x_out, red, 1)
        for i, j in T.Parallel(C, C):  # strictly lower dKKt: the two triangles do not overlap
            sym_sh[i, j] = T.if_then_else(i > j, dkkt_sh[i, j], dkkt_sh[j, i])
        mm(dqk_sh, q_sh, acc_tile, transpose_a=True, clear=False)
        mm(sym_sh, k_sh, acc_tile, clear=False)
        for i, j in T.Parallel(C, dv):
            dwd_sh[i, j] = -dwd_sh[i, j]
        mm(dwd_sh, s_sh, acc_tile, transpose_b=True, clear=False)

    @T.macro
    def chain_step(w_sh, vn_sh, do_sh, d_sh, sds, ds_slots, piece, bh, q_sh, k_sh, dwd_sh):
        """fused: stage 1 rev 4's step, dS = exp(gamma) dS' + Q^T (scale D dO) - K^T (D dW), into the piece's slot
        (w_sh and vn_sh, dead by then, take scale D dO's high and low parts; dwd_sh holds -D dW, dk's operand)."""
        T.sync_threads()  # every product that reads w_sh or vn_sh is done
        for i, j in T.Parallel(C, dv):  # scale D dO as stage 1 rev 4 rounds it: high and low parts
            w_sh[i, j] = T.cast(scale * d_sh[i] * T.cast(do_sh[i, j], acc), dtype)
            vn_sh[i, j] = T.cast(
                scale * d_sh[i] * T.cast(do_sh[i, j], acc)
                - T.cast(T.cast(scale * d_sh[i] * T.cast(do_sh[i, j], acc), dtype), acc),
                dtype,
            )
        for i, j in T.Parallel(dk, dv):
            sds[i, j] = d_sh[C - 1] * ds_slots[piece, bh, i, j]
        T.sync_threads()
        mm(q_sh, w_sh, sds, transpose_a=True, clear=False)
        mm(q_sh, vn_sh, sds, transpose_a=True, clear=False)
        mm(k_sh, dwd_sh, sds, transpose_a=True, clear=False)
        for i, j in T.Parallel(dk, dv):
            ds_slots[piece, bh, i, j] = sds[i, j]
        if not cpu_debug:  # this step's generic writes to the tiles before the next step's bulk copies
            T.fence_proxy_async()
        T.sync_threads()

    @T.macro
    def body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_next, cu_seqlens, chunk_indices, dq_v, dk_v, dbeta, dg,
             prof, dv_out):  # fmt: skip
        grid = (ns - 1) * h_v if fused else nc * h_v
        with T.Kernel(grid, threads=threads, cluster_dims=2 if pair or cluster_probe else None) as (bid,):
            # the CTA's chunks, last to first: n_iter of them (one unless fused), the last at (c_last, t_last)
            piece = bid // h_v  # fused: the CTA's piece (a sequence, or a CP piece of one)
            if fused:  # chunk_indices holds the pieces' first chunks (chunk offsets) and ds_next a slot per piece
                bh = T.alloc_var("int32", init=bid % h_v)
                bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
                end = T.alloc_var("int32", init=cu_seqlens[bid // h_v + 1])
                n_iter = T.alloc_var("int32", init=T.ceildiv(cu_seqlens[bid // h_v + 1] - cu_seqlens[bid // h_v], C))
                c_last = T.alloc_var("int32", init=chunk_indices[bid // h_v] + n_iter - 1)
                t_last = T.alloc_var("int32", init=cu_seqlens[bid // h_v] + (n_iter - 1) * C)
            elif hoist_index:  # the CTA's indices once, in registers (kkt v3h's lesson): substituted into
                # every address instead, they cost 64-bit divisions per load
                bh = T.alloc_var("int32", init=bid % h_v)
                c_last = T.alloc_var("int32", init=bid // h_v)
                bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
                t_last = T.alloc_var(
                    "int32", init=cu_seqlens[chunk_indices[bid // h_v, 0]] + chunk_indices[bid // h_v, 1] * C
                )
                end = T.alloc_var("int32", init=cu_seqlens[chunk_indices[bid // h_v, 0] + 1])
                n_iter = 1
            else:
                bh = bid % h_v
                c_last = bid // h_v
                bhg = bh // (h_v // h_qk)
                t_last = cu_seqlens[chunk_indices[c_last, 0]] + chunk_indices[c_last, 1] * C
                end = cu_seqlens[chunk_indices[c_last, 0] + 1]
                n_iter = 1

            q_sh = alloc_sh((C, dk), dtype)
            k_sh = alloc_sh((C, dk), dtype)
            v_sh = alloc_sh((C, dv), dtype)
            do_sh = alloc_sh((C, dv), dtype)
            a_sh = alloc_sh((C, C), dtype)
            s_sh = alloc_sh((dk, dv), dtype)
            ds_sh = alloc_sh((dk, dv), dtype)
            g_sh = alloc_sh((C,), acc)
            b_sh = alloc_sh((C,), acc)
            d_sh = alloc_sh((C,), acc)
            dr_sh = alloc_sh((C,), acc)
            w_sh = alloc_sh((C, dv), dtype)
            vn_sh = alloc_sh((C, dv), dtype)
            vnr_sh = alloc_sh((C, dv), dtype)  # D_r Vn
            dvn_sh = alloc_sh((C, dv), dtype)
            dwd_sh = alloc_sh((C, dv), dtype)  # D dW
            ag_sh = alloc_sh((C, C), dtype)
            p_sh = alloc_sh((C, C), dtype)
            dqk_sh = alloc_sh((C, C), dtype)
            da0_sh = alloc_sh((C, C), dtype)
            t_sh = alloc_sh((C, C), dtype)
            dkkt_sh = alloc_sh((C, C), dtype)
            dgc_sh = alloc_sh((C,), acc)
            row_a = alloc_sh((C,), acc)
            row_b = alloc_sh((C,), acc)
            row_c = alloc_sh((C,), acc)
            col_a = alloc_sh((C,), acc)
            sds_rows = alloc_sh((dk,), acc)
            x_sh = alloc_sh((C,), acc)  # x_i = D_r,i <K dS', Vn>_i
            row_q = alloc_sh((C,), acc) if lean else None  # rev 12: D_i scale <dO, QS>_i from dq's first product
            row_v = alloc_sh((C,), acc) if dg_i2 else None  # rev 13: <V, dv>_i
            row_p = alloc_sh((C,), acc) if dg_i2 else None  # rev 13: rowsum(P o dO Vn^T)_i
            ds32_sh = alloc_sh((dk, dv), acc) if ds_tma else None  # dS' as loaded, until its bf16 cast
            # rev 9: the partner's fp32 dq (rank 0) or dk (rank 1) lands here; it first carries this CTA's own
            # tile out (rank 1's dq, rank 0's dk): one buffer for both, see group_store
            pair_sh = alloc_sh((C, dk), acc) if pair else None
            pair_bar = T.alloc_cluster_barrier([1]) if pair else None

            cv = alloc_acc((C, dv))  # reused [C, V] accumulator
            ck = alloc_acc((C, dk))  # dq, then dk
            cc = alloc_acc((C, C))  # reused [C, C] accumulator
            cc2 = alloc_acc((C, C))
            sds = alloc_acc((dk, dv))
            # reduction results on the GPU before they go to shared memory: one per source layout
            red_cv = alloc_acc((C,))
            red_ccc = alloc_acc((C,))
            red_c2r = alloc_acc((C,))
            red_c2c = alloc_acc((C,))
            red_k = alloc_acc((dk,))
            red_ck = alloc_acc((C,)) if lean else None  # rev 12: row sums of [C, K] products
            gam = alloc_acc((C, C)) if gamma_frag else None
            ck2 = alloc_acc((C, dk)) if pair_early else None  # rev 10: dq while ck holds dk

            loaded = T.alloc_barrier(arrive_count=[32, 32]) if tma_loads else None  # parity: the chunk's step, mod 2
            clk = T.alloc_local((1,), "int64") if profile and fused else None  # thread 0's last clock reading
            if prefetch:  # noqa: SIM102 (the walk's first chunk's K, S, Q and dO; later chunks' come the step before)
                if T.get_thread_binding() < 32:
                    T.tma_copy(k[0, t_last : t_last + C, bhg, 0:dk], k_sh, barrier=loaded[1])
                    T.tma_copy(states[c_last, bh, 0:dk, 0:dv], s_sh, barrier=loaded[1])
                    T.tma_copy(q[0, t_last : t_last + C, bhg, 0:dk], q_sh, barrier=loaded[1])
                    T.tma_copy(grad_o[0, t_last : t_last + C, bh, 0:dv], do_sh, barrier=loaded[1])
                    T.barrier_arrive(loaded[1])

            for it in T.serial(n_iter):
                bc = c_last - it  # the chunk (global index: states) and its first token
                t0 = t_last - it * C
                slot = piece if fused else bc  # dS' of the chunk: the piece's slot, or the chunk's own
                stamp(prof, bid, 0, clk)
                # tiles, rows past the sequence end as zero (g clamped to the last valid token's)
                if tile_loads:
                    if tma_loads:
                        if T.get_thread_binding() < 32:
                            if not prefetch:  # prefetch: K, S, Q and dO came during the previous step's dg tail
                                T.tma_copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh, barrier=loaded[0])
                                T.tma_copy(states[bc, bh, 0:dk, 0:dv], s_sh, barrier=loaded[0])
                            T.tma_copy(v[0, t0 : t0 + C, bh, 0:dv], v_sh, barrier=loaded[0])
                            T.tma_copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh, barrier=loaded[0])
                            if ds_tma:  # dS' and q with the first set; dO once dS' is cast (it may take dS''s space)
                                T.tma_copy(ds_next[bc, bh, 0:dk, 0:dv], ds32_sh, barrier=loaded[0])
                                T.tma_copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh, barrier=loaded[0])
                            T.barrier_arrive(loaded[0])
                            if not (ds_tma or prefetch):
                                T.tma_copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh, barrier=loaded[1])
                                T.tma_copy(grad_o[0, t0 : t0 + C, bh, 0:dv], do_sh, barrier=loaded[1])
                                T.barrier_arrive(loaded[1])
                        if not ds_tma:
                            T.copy(ds_next[slot, bh, 0:dk, 0:dv], sds)  # global -> registers while the bulk copies fly
                        for i in T.Parallel(C):
                            g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                            b_sh[i] = T.if_then_else(t0 + i < end, beta[0, T.min(t0 + i, end - 1), bh], 0.0)
                        if gamma_frag:  # g_sh[C - 1] below and Gamma read other warps' entries (revs 4-6 race on it)
                            T.sync_threads()
                        for i in T.Parallel(C):
                            d_sh[i] = T.exp2(g_sh[i] * LOG2E)
                            dr_sh[i] = T.if_then_else(t0 + i < end, T.exp2((g_sh[C - 1] - g_sh[i]) * LOG2E), 0.0)
                        T.barrier_wait(loaded[0], it % 2)
                        if not ds_tma:  # rev 7 waits for dO at its first use (dVn)
                            T.barrier_wait(loaded[1], it % 2)
                    else:
                        T.copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh)
                        T.copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh)
                        T.copy(v[0, t0 : t0 + C, bh, 0:dv], v_sh)
                        T.copy(grad_o[0, t0 : t0 + C, bh, 0:dv], do_sh)
                        T.copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh)
                    if end - t0 < C:  # the sequence's last chunk: the rows after its end are not its own
                        for i, j in T.Parallel(C, dk):
                            if t0 + i >= end:
                                q_sh[i, j] = T.cast(0, dtype)
                                k_sh[i, j] = T.cast(0, dtype)
                        for i, j in T.Parallel(C, dv):
                            if t0 + i >= end:
                                v_sh[i, j] = T.cast(0, dtype)
                                if not ds_tma:
                                    do_sh[i, j] = T.cast(0, dtype)
                    for i, j in T.Parallel(C, C):
                        a_sh[i, j] = T.if_then_else(i >= j and t0 + i < end, a_sh[i, j], T.cast(0, dtype))
                else:
                    for i, j in T.Parallel(C, dk):
                        q_sh[i, j] = T.if_then_else(
                            t0 + i < end, q[0, T.min(t0 + i, end - 1), bhg, j], T.cast(0, dtype)
                        )
                        k_sh[i, j] = T.if_then_else(
                            t0 + i < end, k[0, T.min(t0 + i, end - 1), bhg, j], T.cast(0, dtype)
                        )
                    for i, j in T.Parallel(C, dv):
                        v_sh[i, j] = T.if_then_else(
                            t0 + i < end, v[0, T.min(t0 + i, end - 1), bh, j], T.cast(0, dtype)
                        )
                        do_sh[i, j] = T.if_then_else(
                            t0 + i < end, grad_o[0, T.min(t0 + i, end - 1), bh, j], T.cast(0, dtype)
                        )
                    for i, j in T.Parallel(C, C):
                        a_sh[i, j] = T.if_then_else(
                            i >= j,
                            T.if_then_else(t0 + i < end, a0[0, T.min(t0 + i, end - 1), bh, j], T.cast(0, dtype)),
                            T.cast(0, dtype),
                        )
                if not tma_loads:  # rev 4 loads these while its bulk copies fly (the same lines, above)
                    for i in T.Parallel(C):
                        g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                        b_sh[i] = T.if_then_else(t0 + i < end, beta[0, T.min(t0 + i, end - 1), bh], 0.0)
                    for i in T.Parallel(C):
                        d_sh[i] = T.exp2(g_sh[i] * LOG2E)
                        dr_sh[i] = T.if_then_else(t0 + i < end, T.exp2((g_sh[C - 1] - g_sh[i]) * LOG2E), 0.0)
                if gamma_frag:
                    for i, j in T.Parallel(C, C):
                        gam[i, j] = gamma_of(g_sh, i, j)
                stamp(prof, bid, 1, clk)
                # S (input dtype) and dS' (fp32) as GEMM operands in the input dtype; <S, dS'> in fp32
                if tile_loads:
                    if not tma_loads:  # rev 4 has both already
                        T.copy(states[bc, bh, 0:dk, 0:dv], s_sh)
                        T.copy(ds_next[slot, bh, 0:dk, 0:dv], sds)
                    if ds_tma:
                        for i, j in T.Parallel(dk, dv):
                            ds_sh[i, j] = T.cast(ds32_sh[i, j], dtype)
                            sds[i, j] = ds32_sh[i, j] * T.cast(s_sh[i, j], acc)
                        T.sync_threads()  # every read of dS' is done: dO's copy may land in its space
                        if T.get_thread_binding() < 32:
                            T.fence_proxy_async()
                            T.tma_copy(grad_o[0, t0 : t0 + C, bh, 0:dv], do_sh, barrier=loaded[1])
                            T.barrier_arrive(loaded[1])
                    elif fused:  # two passes: in one, TileLang puts a barrier in each of its 32 unrolled steps
                        for i, j in T.Parallel(dk, dv):
                            ds_sh[i, j] = T.cast(sds[i, j], dtype)
                        for i, j in T.Parallel(dk, dv):
                            sds[i, j] = sds[i, j] * T.cast(s_sh[i, j], acc)
                    else:
                        for i, j in T.Parallel(dk, dv):
                            ds_sh[i, j] = T.cast(sds[i, j], dtype)
                            sds[i, j] = sds[i, j] * T.cast(s_sh[i, j], acc)
                else:
                    for i, j in T.Parallel(dk, dv):
                        s_sh[i, j] = states[bc, bh, i, j]
                        ds_sh[i, j] = T.cast(ds_next[bc, bh, i, j], dtype)
                        sds[i, j] = T.cast(states[bc, bh, i, j], acc) * ds_next[bc, bh, i, j]
                reduce_sum(sds, sds_rows, red_k, 1)

                stamp(prof, bid, 2, clk)
                # W = V - D (K S), Vn = Ag W
                mm(k_sh, s_sh, cv)  # K S
                if ds_tma or fused:  # the merged build may give w_sh v_sh's space: read all of V before W is stored
                    for i, j in T.Parallel(C, dv):
                        cv[i, j] = T.cast(v_sh[i, j], acc) - d_sh[i] * cv[i, j]
                    T.sync_threads()
                    for i, j in T.Parallel(C, dv):
                        w_sh[i, j] = T.cast(cv[i, j], dtype)
                else:
                    for i, j in T.Parallel(C, dv):
                        w_sh[i, j] = T.cast(T.cast(v_sh[i, j], acc) - d_sh[i] * cv[i, j], dtype)
                for i, j in T.Parallel(C, C):
                    ag_sh[i, j] = T.cast(T.cast(a_sh[i, j], acc) * gamma(g_sh, gam, i, j) * b_sh[j], dtype)
                mm(ag_sh, w_sh, cv)  # Vn
                for i, j in T.Parallel(C, dv):
                    vn_sh[i, j] = T.cast(cv[i, j], dtype)
                    vnr_sh[i, j] = T.cast(dr_sh[i] * cv[i, j], dtype)
                mm(q_sh, k_sh, cc, transpose_b=True)  # Q K^T
                for i, j in T.Parallel(C, C):
                    p_sh[i, j] = T.cast(scale * gamma(g_sh, gam, i, j) * cc[i, j], dtype)
                stamp(prof, bid, 3, clk)
                # dVn = P^T dO + D_r (K dS'); x_i = D_r,i sum_v (K dS')_iv Vn_iv
                if not lean:  # rev 12 takes x from dk's first product
                    mm(k_sh, ds_sh, cv)  # K dS'
                    for i, j in T.Parallel(C, dv):
                        cv[i, j] = cv[i, j] * T.cast(vnr_sh[i, j], acc)
                    reduce_sum(cv, x_sh, red_cv, 1)
                mm(k_sh, ds_sh, cv)
                for i, j in T.Parallel(C, dv):
                    cv[i, j] = dr_sh[i] * cv[i, j]
                if ds_tma:  # dO: first used here
                    T.barrier_wait(loaded[1], it % 2)
                    if end - t0 < C:
                        for i, j in T.Parallel(C, dv):
                            if t0 + i >= end:
                                do_sh[i, j] = T.cast(0, dtype)
                mm(p_sh, do_sh, cv, transpose_a=True, clear=False)
                for i, j in T.Parallel(C, dv):
                    dvn_sh[i, j] = T.cast(cv[i, j], dtype)
                stamp(prof, bid, 4, clk)
                # dW = Ag^T dVn; row_b[i] = sum_v dW_iv (K S)_iv
                if dw_beta_fp32:
                    for i, j in T.Parallel(C, C):  # Ag without beta (Vn above used the rounded Ag with it)
                        ag_sh[i, j] = T.cast(T.cast(a_sh[i, j], acc) * gamma(g_sh, gam, i, j), dtype)
                    mm(ag_sh, dvn_sh, cv, transpose_a=True)
                    if lean:  # dbeta's first part = rowsum(W o dW~) (I1); rev 13: then <V, dv> after beta
                        for i, j in T.Parallel(C, dv):
                            ck[i, j] = cv[i, j] * T.cast(w_sh[i, j], acc)
                        reduce_sum(ck, col_a, red_ck, 1)
                    for i, j in T.Parallel(C, dv):
                        cv[i, j] = b_sh[i] * cv[i, j]
                    if dg_i2:
                        for i, j in T.Parallel(C, dv):
                            ck[i, j] = cv[i, j] * T.cast(v_sh[i, j], acc)
                        reduce_sum(ck, row_v, red_ck, 1)
                else:
                    mm(ag_sh, dvn_sh, cv, transpose_a=True)
                if store_dv:  # dv of the chunk's tokens
                    for i, j in T.Parallel(C, dv):
                        if t0 + i < end:
                            dv_out[0, t0 + i, bh, j] = T.cast(cv[i, j], dtype)
                for i, j in T.Parallel(C, dv):
                    dwd_sh[i, j] = T.cast(d_sh[i] * cv[i, j], dtype)
                if not dg_i2:  # rev 13 has no such term (I2)
                    mm(k_sh, s_sh, cv)  # K S again (the accumulator was reused)
                    for i, j in T.Parallel(C, dv):
                        cv[i, j] = cv[i, j] * T.cast(dwd_sh[i, j], acc)
                    reduce_sum(cv, row_b, red_cv, 1)  # sum_v D dW o KS
                if not lean:  # rev 12 takes it from dq's first product
                    # row_a[i] = scale sum_v dO_iv (Q S)_iv
                    mm(q_sh, s_sh, cv)
                    for i, j in T.Parallel(C, dv):
                        cv[i, j] = scale * cv[i, j] * T.cast(do_sh[i, j], acc)
                    reduce_sum(cv, row_a, red_cv, 1)

                stamp(prof, bid, 5, clk)
                # dP = (dO Vn^T) o L, dQK = scale Gamma o dP; pair gate terms start as scale dP o QK^T o Gamma
                mm(do_sh, vn_sh, cc2, transpose_b=True)
                for i, j in T.Parallel(C, C):
                    dqk_sh[i, j] = T.cast(scale * gamma(g_sh, gam, i, j) * cc2[i, j], dtype)
                    cc2[i, j] = T.cast(p_sh[i, j], acc) * cc2[i, j]  # scale Gamma QK^T dP (0 above the diagonal)
                if dg_i2:  # rev 13: rowsum(P o dO Vn^T) is dg's only pair term (I2)
                    reduce_sum(cc2, row_p, red_c2r, 1)
                # dAg = (dVn W^T) o L
                mm(dvn_sh, w_sh, cc, transpose_b=True)
                if dg_i2:
                    for i, j in T.Parallel(C, C):
                        da0_sh[i, j] = T.cast(
                            T.if_then_else(i >= j, cc[i, j] * gamma(g_sh, gam, i, j) * b_sh[j], 0.0), dtype
                        )
                else:
                    for i, j in T.Parallel(C, C):
                        cc2[i, j] = cc2[i, j] + T.if_then_else(
                            i >= j, cc[i, j] * T.cast(a_sh[i, j], acc) * b_sh[j] * gamma(g_sh, gam, i, j), 0.0
                        )
                        da0_sh[i, j] = T.cast(
                            T.if_then_else(i >= j, cc[i, j] * gamma(g_sh, gam, i, j) * b_sh[j], 0.0), dtype
                        )
                        if not lean:  # rev 12 has dbeta's first part from rowsum(W o dW~) (I1)
                            cc[i, j] = T.if_then_else(
                                i >= j, cc[i, j] * gamma(g_sh, gam, i, j) * T.cast(a_sh[i, j], acc), 0.0
                            )
                    if not lean:
                        reduce_sum(cc, col_a, red_ccc, 0)  # dbeta, first part
                    # gates: dgc_i = D_i scale <dO, QS>_i - <D dW, KS>_i - x_i + sum_j pair_ij - sum_j pair_ji
                    # (rev 12 adds its first and third terms at the end: they come from dq's and dk's products)
                    for i in T.Parallel(C):
                        if lean:
                            dgc_sh[i] = -row_b[i]
                        else:
                            dgc_sh[i] = d_sh[i] * row_a[i] - row_b[i] - x_sh[i]
                    reduce_sum(cc2, row_a, red_c2r, 1)
                    reduce_sum(cc2, row_c, red_c2c, 0)
                    for i in T.Parallel(C):
                        dgc_sh[i] = dgc_sh[i] + row_a[i] - row_c[i]

                stamp(prof, bid, 6, clk)
                # A0 path: dM = -A0^T dA0 A0^T, dL = StrictLower(dM), dKKt = diag(beta) dL
                mm(a_sh, da0_sh, cc, transpose_a=True)
                for i, j in T.Parallel(C, C):
                    t_sh[i, j] = T.cast(cc[i, j], dtype)
                mm(t_sh, a_sh, cc, transpose_b=True)
                mm(k_sh, k_sh, cc2, transpose_b=True)  # K K^T
                for i, j in T.Parallel(C, C):
                    cc[i, j] = T.if_then_else(i > j, -cc[i, j], 0.0)  # dL
                    dkkt_sh[i, j] = T.cast(b_sh[i] * cc[i, j], dtype)
                    cc2[i, j] = cc[i, j] * cc2[i, j]
                reduce_sum(cc2, row_a, red_c2r, 1)
                for i in T.Parallel(C):
                    if t0 + i < end:
                        dbeta[0, t0 + i, bh] = col_a[i] + row_a[i]

                stamp(prof, bid, 7, clk)
                if pair_early:  # rev 10: dk first; rank 0's dk leaves while both form dq
                    dk_gemms(ck, dqk_sh, q_sh, vnr_sh, ds_sh, dkkt_sh, k_sh, dwd_sh, s_sh)
                    T.cluster_sync()  # pair_sh's space is free in both CTAs (the merged plan places it by lifetime)
                    if bh % 2 == 0:
                        pair_send(ck, pair_sh, pair_bar, 1)
                    dq_gemms(ck2, do_sh, s_sh, d_sh, dqk_sh, k_sh)
                    T.barrier_wait(pair_bar[0], 0)  # rank 0: rank 1's dq; rank 1: rank 0's dk
                    if bh % 2 == 0:
                        T.cluster_arrive()  # rank 1's copy has landed: its source may be reused
                        for i, j in T.Parallel(C, dk):
                            if t0 + i < end:
                                dq_v[0, t0 + i, bhg, j] = T.cast(ck2[i, j] + pair_sh[i, j], dtype)
                    else:
                        for i, j in T.Parallel(C, dk):
                            ck[i, j] = ck[i, j] + pair_sh[i, j]
                        T.sync_threads()  # every read of rank 0's dk done before this CTA's dq overwrites it
                        pair_send(ck2, pair_sh, pair_bar, 0)
                        T.cluster_arrive()
                        for i, j in T.Parallel(C, dk):
                            if t0 + i < end:
                                dk_v[0, t0 + i, bhg, j] = T.cast(ck[i, j], dtype)
                    T.cluster_wait()
                    T.sync_threads()
                else:
                    if lean:
                        dq_gemms_lean(ck, cv, red_cv, row_q, do_sh, s_sh, d_sh, dqk_sh, k_sh, q_sh)
                    else:
                        dq_gemms(ck, do_sh, s_sh, d_sh, dqk_sh, k_sh)
                    if cluster_sum:
                        group_store(ck, dq_v, pair_sh, pair_bar, 0, bh % 2, t0, end, bhg)
                    else:
                        for i, j in T.Parallel(C, dk):
                            if t0 + i < end:
                                dq_v[0, t0 + i, bh, j] = ck[i, j]
                    stamp(prof, bid, 8, clk)
                    if lean:  # t_sh (the A0 path's) is free again: the symmetrised dKKt
                        dk_gemms_lean(
                            ck, cv, red_cv, x_sh, dqk_sh, q_sh, vnr_sh, ds_sh, dkkt_sh, t_sh, k_sh, dwd_sh, s_sh
                        )
                    else:
                        dk_gemms(ck, dqk_sh, q_sh, vnr_sh, ds_sh, dkkt_sh, k_sh, dwd_sh, s_sh)
                    if cluster_sum:
                        group_store(ck, dk_v, pair_sh, pair_bar, 1, bh % 2, t0, end, bhg)
                    else:
                        for i, j in T.Parallel(C, dk):
                            if t0 + i < end:
                                dk_v[0, t0 + i, bh, j] = ck[i, j]

                stamp(prof, bid, 9, clk)
                if prefetch:  # the chain's step first, then the next chunk's K, S, Q and dO fly during the dg tail
                    chain_step(w_sh, vn_sh, do_sh, d_sh, sds, ds_next, piece, bh, q_sh, k_sh, dwd_sh)
                    if it + 1 < n_iter:  # noqa: SIM102 (a TIR condition: Python's `and` cannot join two)
                        if T.get_thread_binding() < 32:
                            T.tma_copy(k[0, t0 - C : t0, bhg, 0:dk], k_sh, barrier=loaded[1])
                            T.tma_copy(states[bc - 1, bh, 0:dk, 0:dv], s_sh, barrier=loaded[1])
                            T.tma_copy(q[0, t0 - C : t0, bhg, 0:dk], q_sh, barrier=loaded[1])
                            T.tma_copy(grad_o[0, t0 - C : t0, bh, 0:dv], do_sh, barrier=loaded[1])
                            T.barrier_arrive(loaded[1])
                if dg_i2:  # I2: dgc_i = D_i scale <dO, QS>_i + rowsum(P o dO Vn^T)_i - <V, dv>_i
                    for i in T.Parallel(C):
                        dgc_sh[i] = row_q[i] + row_p[i] - row_v[i]
                elif lean:  # the terms from dq's and dk's first products
                    for i in T.Parallel(C):
                        dgc_sh[i] = dgc_sh[i] + row_q[i] - x_sh[i]
                # dg_i = sum_{i <= j < n} dgc_j + dgamma (it lands on row n - 1, which every valid i sums);
                # each row sums dgamma = sum_j x_j + exp(gamma) <S, dS'> itself (x_j = 0 past the end)
                n_valid = T.min(end - t0, C)
                if scan_dg:  # rev 8: the total of the shared terms and the suffix sums of dgc by two scans
                    for j in T.Parallel(C):
                        row_c[j] = x_sh[j] + d_sh[C - 1] * (sds_rows[j] + sds_rows[j + C])
                        col_a[j] = T.if_then_else(j < n_valid, dgc_sh[j], 0.0)  # dbeta's part was stored above
                    T.cumsum(src=row_c, dim=0, reverse=True)  # row_c[0]: the total every row adds
                    T.cumsum(src=col_a, dim=0, reverse=True)  # col_a[i] = sum_{i <= j < n} dgc_j
                    for i in T.Parallel(C):
                        row_a[i] = row_c[0] + col_a[i]
                elif hoist_index:  # rev 3: the terms every row sums folded into C values first (64 steps, not 192)
                    for j in T.Parallel(C):
                        row_c[j] = x_sh[j] + d_sh[C - 1] * (sds_rows[j] + sds_rows[j + C])
                    for i in T.Parallel(C):
                        row_a[i] = 0.0
                        for j in T.serial(C):
                            row_a[i] = row_a[i] + row_c[j] + T.if_then_else(j >= i and j < n_valid, dgc_sh[j], 0.0)
                else:
                    for i in T.Parallel(C):
                        row_a[i] = 0.0
                        for j in T.serial(C):
                            row_a[i] = row_a[i] + x_sh[j] + T.if_then_else(j >= i and j < n_valid, dgc_sh[j], 0.0)
                        for j in T.serial(dk):
                            row_a[i] = row_a[i] + d_sh[C - 1] * sds_rows[j]
                for i in T.Parallel(C):
                    if t0 + i < end:
                        dg[0, t0 + i, bh] = row_a[i]
                stamp(prof, bid, 10, clk)
                if fused and not prefetch:
                    chain_step(w_sh, vn_sh, do_sh, d_sh, sds, ds_next, piece, bh, q_sh, k_sh, dwd_sh)
                    stamp(prof, bid, 11, clk)
                if prefetch:  # the dg tail's writes before the next step's bulk copies of V and A0
                    T.fence_proxy_async()
                    T.sync_threads()

    gh = h_qk if cluster_sum else h_v  # dq, dk: the group's sum in the input dtype, or per value head in fp32
    gdt = dtype if cluster_sum else acc

    if profile and not fused:

        @T.prim_func
        def bwd_chunk_grads_profile(
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
            dq_v: T.Tensor((1, nt, gh, dk), gdt),
            dk_v: T.Tensor((1, nt, gh, dk), gdt),
            dbeta: T.Tensor((1, nt, h_v), acc),
            dg: T.Tensor((1, nt, h_v), acc),
            prof: T.Tensor((nc * h_v, len(PROFILE_STAMPS)), "int64"),
        ):
            body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_next, cu_seqlens, chunk_indices, dq_v, dk_v, dbeta,
                 dg, prof, None)  # fmt: skip

        return bwd_chunk_grads_profile

    if fused and profile:

        @T.prim_func
        def bwd_fused_profile(
            q: T.Tensor((1, nt, h_qk, dk), dtype),
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            v: T.Tensor((1, nt, h_v, dv), dtype),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            a0: T.Tensor((1, nt, h_v, C), dtype),
            grad_o: T.Tensor((1, nt, h_v, dv), dtype),
            states: T.Tensor((nc, h_v, dk, dv), dtype),
            ds_slots: T.Tensor((ns - 1, h_v, dk, dv), acc),
            cu_seqlens: T.Tensor((ns,), "int32"),
            chunk_offsets: T.Tensor((ns,), "int32"),
            dq_v: T.Tensor((1, nt, h_v, dk), acc),
            dk_v: T.Tensor((1, nt, h_v, dk), acc),
            dbeta: T.Tensor((1, nt, h_v), acc),
            dg: T.Tensor((1, nt, h_v), acc),
            dv_out: T.Tensor((1, nt, h_v, dv), dtype),
            prof: T.Tensor(((ns - 1) * h_v, len(FUSED_PROFILE_STAMPS) - 1), "int64"),
        ):
            body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_slots, cu_seqlens, chunk_offsets, dq_v, dk_v, dbeta,
                 dg, prof, dv_out)  # fmt: skip

        return bwd_fused_profile

    if fused:

        @T.prim_func
        def bwd_fused(
            q: T.Tensor((1, nt, h_qk, dk), dtype),
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            v: T.Tensor((1, nt, h_v, dv), dtype),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            a0: T.Tensor((1, nt, h_v, C), dtype),
            grad_o: T.Tensor((1, nt, h_v, dv), dtype),
            states: T.Tensor((nc, h_v, dk, dv), dtype),
            ds_slots: T.Tensor((ns - 1, h_v, dk, dv), acc),
            cu_seqlens: T.Tensor((ns,), "int32"),
            chunk_offsets: T.Tensor((ns,), "int32"),
            dq_v: T.Tensor((1, nt, h_v, dk), acc),
            dk_v: T.Tensor((1, nt, h_v, dk), acc),
            dbeta: T.Tensor((1, nt, h_v), acc),
            dg: T.Tensor((1, nt, h_v), acc),
            dv_out: T.Tensor((1, nt, h_v, dv), dtype),
        ):
            body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_slots, cu_seqlens, chunk_offsets, dq_v, dk_v, dbeta,
                 dg, None, dv_out)  # fmt: skip

        return bwd_fused

    if store_dv:

        @T.prim_func
        def bwd_chunk_grads_dv(
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
            dq_v: T.Tensor((1, nt, gh, dk), gdt),
            dk_v: T.Tensor((1, nt, gh, dk), gdt),
            dbeta: T.Tensor((1, nt, h_v), acc),
            dg: T.Tensor((1, nt, h_v), acc),
            dv_out: T.Tensor((1, nt, h_v, dv), dtype),
        ):
            body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_next, cu_seqlens, chunk_indices, dq_v, dk_v, dbeta,
                 dg, None, dv_out)  # fmt: skip

        return bwd_chunk_grads_dv

    @T.prim_func
    def bwd_chunk_grads(
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
        dq_v: T.Tensor((1, nt, gh, dk), gdt),
        dk_v: T.Tensor((1, nt, gh, dk), gdt),
        dbeta: T.Tensor((1, nt, h_v), acc),
        dg: T.Tensor((1, nt, h_v), acc),
    ):
        body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_next, cu_seqlens, chunk_indices, dq_v, dk_v, dbeta, dg,
             None, None)  # fmt: skip

    return bwd_chunk_grads


# rev 7's dS' tile (64 KiB, dead after its cast) fits beside the others only when TileLang reuses shared memory
# by the buffers' lifetimes more aggressively: 225 KiB with this option, 233 KiB (over the 227 KiB limit)
# without. The earlier revisions keep their builds as measured.
MERGED_PASS_CONFIGS = {**PASS_CONFIGS, tilelang.PassConfigKey.TL_ENABLE_AGGRESSIVE_SHARED_MEMORY_MERGE: True}
_kernel = tilelang.jit(bwd_chunk_grads_program, pass_configs=PASS_CONFIGS)
_kernel_merged = tilelang.jit(bwd_chunk_grads_program, pass_configs=MERGED_PASS_CONFIGS)
_SIGNATURE = inspect.signature(bwd_chunk_grads_program)


def bwd_chunk_grads_kernel(*args, **kwargs):
    """The compiled program for these arguments (bwd_chunk_grads_program's), with MERGED_PASS_CONFIGS when
    ds_tma or fused is set (the fused walk needs 275 KiB of shared memory unmerged, 218 merged)."""
    bound = _SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    merged = bound.arguments["ds_tma"] or bound.arguments["fused"]
    return (_kernel_merged if merged else _kernel)(*args, **kwargs)
