"""Stage 2 of the forward, warp-specialised (v4): the same math as fused_fwd.py, split over four
warpgroups of one CTA per (sequence, value head, V-slice) so the state chain and the output path run
concurrently instead of one after the other.

Per chunk (design/gdn.md), D = diag(exp(g)), D_r = diag(exp(gamma - g)), Gamma_ij = exp(g_i - g_j), i >= j:
    W = V - D (K S);  Vnew = (Gamma o A0) diag(beta) W;  O = scale (D Q S + (Gamma o Q K^T) Vnew)
    S' = exp(gamma) S + K^T (D_r Vnew)

Warpgroups (128 threads each):
  WG0 state  S [K, BV] fp32 in registers. Publishes bf16(S) to s_sh, then S *= exp(gamma), then
             S += K^T Vd once WG1 has Vd = D_r Vnew. Only WG0 touches S.
  WG1 delta  K S -> W = V - D (K S) (over the V stage buffer) -> Vnew = Ag W -> Vd for WG0 first
             (the state chain is the critical path), then Vnew for WG2.
  WG2 output P = Q K^T, Ag = Gamma o A0 o beta (over the A0 stage buffer, handed to WG1),
             Pg = scale Gamma o P, O = scale D (Q S) + Pg Vnew, stored from registers (rev 4) or
             through o_sh by one TMA store per chunk (rev 5).
  WG3 loads  one warp: TMA tiles of q, k (shared by the GVA group), v slice, A0; g and beta as scalars
             (clamped to the sequence's last token, so gamma is right on a ragged tail).
Critical path per chunk: s_sh -> K S (WG1) -> Ag W (WG1) -> K^T Vd (WG0); everything else overlaps it.

Hand-offs are mbarriers (parity = chunk % 2; the two input stages use (chunk // 2) % 2). Buffers
reused across chunks are protected by program order: WG1 writes vd/vn for chunk c+1 only after
s_ready(c+1) (WG0 is done with vd(c)) and ag_ready(c+1) (WG2 is done with vn(c)); WG0 overwrites s_sh
only after qs_done(c) (WG2's Q S read) and vd_ready(c) (WG1's K S read precedes it).

Ragged tails load full tiles like fused_fwd.py: rows past a sequence's end hold the next sequence's
tokens (or TMA's zero fill past the tensor), which only reach invalid rows (Ag and Pg are lower
triangular), add nothing to S (D_r = 0 there) and are never stored.
"""

import tilelang
import tilelang.language as T

CHUNK = 64
LOG2E = 1.4426950408889634
WG = 128

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}

# Register budgets per warpgroup (setmaxnreg). setmaxnreg.inc below the count the kernel was compiled
# with (ptxas: up to 128 at 512 threads) is an illegal instruction on the H200 (seen at BV = 64 with 120),
# so every consumer asks for at least 128; the sum times 128 threads must fit the 64 K register file.
NREG_STATE = 168
NREG_DELTA = 152
NREG_OUT = 160
NREG_LOAD = 24
# rev 7: WG1 holds U (64 fp32 per thread at BV = 128) and -Wk (64 bf16) across its wait for the state, WG2
# no longer builds Gamma o A0 (one 64x64 fp32 fragment less); with rev 6's split ptxas serialised the
# wgmma instructions (C7512, "insufficient register resources")
# (and spilled at 160/152); 176/136 builds without either
NREG_DELTA_REV7 = 176
NREG_OUT_REV7 = 136
# rev 9: U's and -Wk's accumulators are live together under one wait; at 176 ptxas spilled (4 B at BV = 128)
NREG_DELTA_REV9 = 184

# The CP state pass skips a piece's transition M (writes zeros) when the piece's summed log decay is at most
# this: exp(-30) ~ 1e-13 of the incoming state, below fp32 resolution.
SKIP_M_LOG_DECAY = -30.0


def _sum8(buf, base):
    """buf[base] + ... + buf[base + 7], left to right (one round of the state pass's decay sum)."""
    total = buf[base]
    for i in range(1, 8):
        total = total + buf[base + i]
    return total


# Phases timed per consumer warpgroup by the profile build (clock64 cycles of the warpgroup's first
# thread, summed over the chunks), in program order.
PHASES = (
    ("wait qs_done", "S -> s_sh", "wait full", "S *= exp(gamma)", "wait vd_ready", "gemm K^T Vd", "arrive empty"),
    ("wait full", "d, d_r", "wait s_ready", "gemm K S", "W (rmw v_sh)", "wait ag_ready", "gemm Ag W",
     "Vd -> vd_sh", "Vnew -> vn_sh"),
    ("wait full", "gemm Q K^T", "Gamma, Ag -> a_sh", "d, Pg -> p_sh", "wait s_ready", "gemm Q S", "O *= d",
     "wait vn_ready", "gemm Pg Vnew", "O store"),
)
# rev 5 reorders WG1's tail: Vnew and then Vd are copied before vd_ready (tick 7); tick 8 is the arrives
PHASES_REV5 = (
    PHASES[0],
    ("wait full", "d, d_r", "wait s_ready", "gemm K S", "W (read, copy)", "wait ag_ready", "gemm Ag W",
     "Vnew, Vd copies", "arrive vn_ready, empty"),
    PHASES[2][:9] + ("O -> o_sh, TMA store",),
)


# rev 7 (ws10): WG1 forms U and -D Wk before the state arrives, the chain is one GEMM; WG2 has no Ag pass
PHASES_REV7 = (
    PHASES[0],
    ("wait full", "d, d_r", "-Agb D, gemm Wk", "gemm Agb V", "wait s_ready", "gemm Wk S", "wait ag_ready",
     "Vnew, Vd copies", "arrive vn_ready, empty"),
    ("wait full", "gemm Q K^T", "Pg", "d, Pg -> p_sh", "wait s_ready", "gemm Q S", "O *= d", "wait vn_ready",
     "gemm Pg Vnew", "O -> o_sh, TMA store"),
)

# rev 9 (ws12): WG1's two state-free GEMMs and the diagonal fix end at one wait (phase 2); phase 3 is empty;
# WG1 stores Vd (what WG0 waits for) before Vnew; WG2's O store (1.0-1.5 K cycles of a ~4.6 K step at BV = 128,
# session 12) is split into its four steps
PHASES_REV9 = (
    PHASES[0],
    PHASES_REV7[1][:2] + ("-Agb D, gemms Wk + Agb V, U fix", "(in phase 2)", "wait s_ready", "gemm Wk S",
                          "Vd copy, arrive vd_ready", "wait ag_ready", "Vnew copy, arrive vn_ready, empty"),
    PHASES_REV7[2][:9] + ("O: wait o_sh stage, sync", "O -> o_sh", "O: fence, sync", "O: TMA store issue"),
)


def phases(rev: int) -> tuple[tuple[str, ...], ...]:
    """Names of the profile build's phases per consumer warpgroup, for kernel revision rev."""
    return PHASES_REV9 if rev >= 9 else PHASES_REV7 if rev >= 7 else PHASES_REV5 if rev >= 5 else PHASES


NUM_PHASES = max(len(p) for table in (PHASES, PHASES_REV5, PHASES_REV7, PHASES_REV9) for p in table)


def fused_fwd_ws_program(
    dk: int,
    dv: int,
    scale: float,
    dtype: str,
    use_initial_state: bool,
    state_v_first: bool = False,
    block_v: int = 128,
    profile: bool = False,
    rev: int = 4,
    state_pass: bool = False,
    store_states: bool = False,
):
    """TileLang program, same signature and outputs as fused_fwd.fused_fwd_program.

    rev=4 is the version measured on the H200 (NOTES.md, v4). rev=5 removes what the profile build
    showed to dominate a chunk step at BV = 128 (NOTES.md, v5; prepared, not yet run on a GPU):
    - element-wise passes that read and write the same shared buffer (W over V, Ag over A0) are split
      into a read pass into registers and one fragment-to-shared copy: TileLang put a warpgroup barrier
      inside every iteration of the fused read-modify-write loops (32 barriers per pass);
    - O leaves through shared memory and one TMA store instead of per-thread global stores whose
      addresses recomputed a 64-bit (block % h_v) per element (8.5 K of WG2's 13.8 K cycles per chunk);
    - the CTA's sequence, head and slice indices are computed once into registers;
    - Vnew goes out by a fragment copy first, then Vd = D_r Vnew by a second one (was a scalar loop).

    state_pass=True (rev 5 only) is the context-parallel prep pass (gdn/cp.py): every "sequence" is a
    piece, no O is produced, and the grid has twice the V-slices. Slices over [0, V) run the recurrence
    from S = 0 with the piece's V (the piece's own end state h); slices over [V, 2V) run it from S = I
    with V = 0, which gives the piece's transition M (S_end = M S_start + h). Signature:
    (q, k, v, g_cumsum, beta, a0, cu_seqlens, hm) with hm [pieces, H_v, K, 2V] fp32 = [h | M]. A transition
    slice whose piece decays by at most SKIP_M_LOG_DECAY (summed log gate) writes M = 0 and runs no chunk:
    gate-driven, so heads that do not decay (g = 0) still get their exact M (session 8).

    store_states=True (rev 5; the backward's stage 0, bwd_api.chunk_states) also takes chunk_offsets [N+1]
    int32 and states [num_chunks, H_v, K, V] in the input dtype: WG0 stores the bf16 copy of S it publishes
    for the chunk's GEMMs by one TMA store per chunk (the operand, as FLA keeps h), waited for before it
    overwrites s_sh with the next chunk's.

    rev=6 is rev 5 with beta applied to W (in fp32, before W is rounded to the GEMM's dtype) instead of
    to Ag: Ag W = (Gamma o A0) (diag(beta) W). Rev 5 rounds Gamma o A0 o beta, so every token's beta carries
    one bf16 rounding error into the whole of its update; emulated at T = 1 (NOTES.md, session 6) that
    is 1.19x FLA's final-state error, rev 6's 0.74x.

    rev=7 (fused impl "ws10") takes stage 1's emit_agb output instead of A0: Agb = Gamma o A0 diag(beta)
    [1, T, H_v, 64]. Since Vnew = Agb (V - D K S) = U - Wk S with U = Agb V and Wk = (Agb D) K, WG1 forms U
    and -Wk (bf16, a register operand) while WG0 is still on the previous chunk, and the state chain per
    chunk is s_sh -> Wk S -> Vnew, Vd copies -> K^T Vd: K S, the W pass and Ag W leave it (the profile build
    put them at 2.2 K of the chain's ~4.7 K cycles at BV = 128). -Agb D (columns scaled by -exp(g_j)) is
    formed in registers as the A operand of Wk's GEMM. WG2 loses its Ag pass (no A0 to gate), and O leaves
    through two o_sh stages (a chunk's TMA store may still be reading one while the next is written).
    Rounding: Agb once from fp32, Agb D and -Wk once more each, U and Vnew stay fp32 until Vd. That is FLA's
    level, not below it (rounding_study's "ws10": one token 1.07x FLA's final-state error on average,
    emulated; the H200 edge check read 0.96-1.16x at T = 1 and 0.89-0.97x on longer sequences, session 12),
    so it is not auto's kernel. Forming U exactly (beta applied in fp32, its operand split hi + lo, -Wk
    through shared memory; commit 91ac1a6) put the error below FLA's (0.86x emulated) but cost 1.27x in
    time over qwen35-fwd. Works with state_pass (then the transition slices run with U = 0).

    rev=8 (fused impl "ws11"; prepared in session 12, not yet run on a GPU) is rev 7 with Agb's diagonal
    taken unrounded: a token's own beta is Agb's diagonal (A0 and Gamma are 1 there), so -Wk's operand uses
    -beta_j exp(g_j) in fp32 on the diagonal, and U gets (beta_i - bf(beta_i)) V_i added in fp32 (one
    element-wise pass over V, before WG1's wait for the state). Emulated at T = 1 (rounding_study "ws11"):
    0.86x FLA's final-state error against rev 7's 1.07x; the pass should fit in WG1's ~1.1 K cycles of
    waiting per chunk at BV = 128 (rev 7's profile).

    rev=9 (fused impl "ws12") is rev 8 with WG1's two state-free products issued together: -Wk's GEMM goes out
    asynchronously (T.wgmma_gemm), the diagonal fix (beta_i - bf(beta_i)) V_i is written into U's accumulator
    while the tensor cores run it, U's GEMM accumulates onto that, and one wait covers both. Rev 8 waited
    after each GEMM and ran the fix pass after U's, all before WG1 can take the state (H200, session 13: rev 8
    read 1-8 % slower than rev 7 over the timed configs and 0.957x its speed over qwen35-fwd).

    profile=True is a measuring build: it takes one more argument, prof [num_ctas, 3, NUM_PHASES] int64,
    where each CTA's consumer warpgroups add up the clock64 cycles spent in each phase of PHASES.

    The plain build (not profile, state_pass or store_states) takes one more argument last, seq_order [ns]
    int32: which sequence each group of blocks walks (ChunkPlan.seq_order: longest first; session 15).
    """
    C = CHUNK
    assert rev in (4, 5, 6, 7, 8, 9)
    v5 = rev >= 5
    beta_in_w = rev == 6
    ab = rev >= 7
    diag_fix = rev >= 8
    async_prep = rev >= 9  # WG1's -Wk and U GEMMs under one wait, the diagonal fix between them
    assert dv % block_v == 0 and block_v in (32, 64, 128)
    assert not state_pass or (v5 and not beta_in_w and not profile and not state_v_first and dk == dv)
    assert not store_states or (v5 and rev in (5, 6, 9) and not profile and not state_pass and not state_v_first)
    assert NREG_STATE + NREG_DELTA + NREG_OUT + NREG_LOAD <= 512
    assert NREG_STATE + NREG_DELTA_REV7 + NREG_OUT_REV7 + NREG_LOAD <= 512
    assert NREG_STATE + NREG_DELTA_REV9 + NREG_OUT_REV7 + NREG_LOAD <= 512
    nreg_delta, nreg_out = (NREG_DELTA_REV7, NREG_OUT_REV7) if rev >= 7 else (NREG_DELTA, NREG_OUT)
    if rev >= 9:
        nreg_delta = NREG_DELTA_REV9
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nv = dv // block_v * (2 if state_pass else 1)  # V-slices per (sequence, head) in the grid
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs")
    nh0 = T.dynamic("num_h0")
    nc = T.dynamic("num_chunks")
    acc = "float32"
    st_shape = (ns, h_v, dv, dk) if state_v_first else (ns, h_v, dk, dv)
    h0_shape = (nh0, h_v, dv, dk) if state_v_first else (nh0, h_v, dk, dv)

    @T.macro
    def tick(clk, spent, phase):
        """End of a phase: add the cycles since the last tick to spent[phase] (profile builds only)."""
        if profile:
            now = T.call_extern("int64", "clock64")
            spent[phase] = spent[phase] + (now - clk[0])
            clk[0] = now

    @T.macro
    def kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, prof, chunk_offsets, states,
                    seq_order=None):
        """seq_order [ns] (the plain build's): the sequence (or piece) each group of h_v * nv consecutive
        blocks walks. The GPU hands out blocks roughly by index, so listing the longest first schedules the
        walks longest first (gdn/plan.py); the other builds walk sequence i in blocks i * h_v * nv + ..."""
        with T.Kernel(ns * h_v * nv, threads=4 * WG) as (bid,):
            if v5:
                if seq_order is None:
                    seq = T.alloc_var("int32", init=bid // (h_v * nv))
                    start = T.alloc_var("int32", init=cu_seqlens[bid // (h_v * nv)])
                    end = T.alloc_var("int32", init=cu_seqlens[bid // (h_v * nv) + 1])
                else:
                    seq = T.alloc_var("int32", init=seq_order[bid // (h_v * nv)])
                    start = T.alloc_var("int32", init=cu_seqlens[seq_order[bid // (h_v * nv)]])
                    end = T.alloc_var("int32", init=cu_seqlens[seq_order[bid // (h_v * nv)] + 1])
                bh = T.alloc_var("int32", init=(bid // nv) % h_v)
                v0 = T.alloc_var("int32", init=(bid % nv) * block_v)
                bhg = T.alloc_var("int32", init=((bid // nv) % h_v) // (h_v // h_qk))
            else:
                seq = bid // (h_v * nv) if seq_order is None else seq_order[bid // (h_v * nv)]
                bh = (bid // nv) % h_v
                v0 = (bid % nv) * block_v
                bhg = bh // (h_v // h_qk)
                start = cu_seqlens[seq]
                end = cu_seqlens[seq + 1]
            if state_pass:
                # A transition slice (v0 >= V) of a piece whose summed log decay is at most SKIP_M_LOG_DECAY
                # writes M = 0 and does nothing else: ||M S|| <= exp(decay) ||S|| (each step's
                # I - beta k k^T is a contraction for unit-norm keys, beta in [0, 2]), far below fp32.
                # Only transition slices look (v0 is the same for the whole CTA): one chunk-end decay per
                # thread (pieces have at most 4 * WG chunks), summed in three rounds of eight.
                dec_sh = T.alloc_shared((4 * WG,), acc)
                part_sh = T.alloc_shared((4 * WG // 8,), acc)
                skip_sh = T.alloc_shared((1,), "int32")
                txs = T.get_thread_binding()
                pc = T.ceildiv(end - start, C)
                if v0 >= dv:
                    dec_sh[txs] = T.if_then_else(
                        txs < pc, g_cumsum[0, T.min(start + txs * C + C - 1, end - 1), bh], 0.0
                    )
                    T.sync_threads()
                    if txs < 4 * WG // 8:
                        part_sh[txs] = _sum8(dec_sh, txs * 8)
                    T.sync_threads()
                    if txs < 8:
                        dec_sh[txs] = _sum8(part_sh, txs * 8)
                    T.sync_threads()
                    if txs == 0:
                        skip_sh[0] = T.if_then_else(pc <= 4 * WG and _sum8(dec_sh, 0) <= SKIP_M_LOG_DECAY, 1, 0)
                    T.sync_threads()
                n_chunks = T.if_then_else(v0 >= dv and skip_sh[0] == 1, 0, pc)
            else:
                n_chunks = T.ceildiv(end - start, C)

            # two input stages
            q_sh = T.alloc_shared((2, C, dk), dtype)
            k_sh = T.alloc_shared((2, C, dk), dtype)
            v_sh = T.alloc_shared((2, C, block_v), dtype)  # V, then W in place (WG1)
            a_sh = T.alloc_shared((2, C, C), dtype)  # A0, then Ag in place (WG2); Agb with rev 7
            g_sh = T.alloc_shared((2, C), acc)
            b_sh = T.alloc_shared((2, C), acc)
            # hand-off buffers
            s_sh = T.alloc_shared((dk, block_v), dtype)
            vd_sh = T.alloc_shared((C, block_v), dtype)
            vn_sh = T.alloc_shared((C, block_v), dtype)
            p_sh = T.alloc_shared((C, C), dtype)
            if async_prep:  # rev 9: the two stages as two 2-D buffers, which TileLang fills by stmatrix
                o_sh0 = T.alloc_shared((C, block_v), dtype)
                o_sh1 = T.alloc_shared((C, block_v), dtype)
            elif ab:  # two stages: chunk c's TMA store may still read one while chunk c + 1 fills the other
                o_sh = T.alloc_shared((2, C, block_v), dtype)
            elif v5:
                o_sh = T.alloc_shared((C, block_v), dtype)
            # warpgroup-private gate exponentials
            # (per stage: a fast thread writing chunk c+1's values never races a slow one reading chunk c's)
            d1_sh = T.alloc_shared((2, C), acc)
            dr1_sh = T.alloc_shared((2, C), acc)
            d2_sh = T.alloc_shared((2, C), acc)
            if diag_fix:
                rb_sh = T.alloc_shared((2, C), acc)  # beta - rounded(beta): what Agb's diagonal lost (rev 8)

            full = T.alloc_barrier(arrive_count=[32, 32])
            empty = T.alloc_barrier(arrive_count=[3 * WG, 3 * WG])
            s_ready = T.alloc_barrier(arrive_count=WG)
            qs_done = T.alloc_barrier(arrive_count=WG)
            ag_ready = T.alloc_barrier(arrive_count=WG)
            vd_ready = T.alloc_barrier(arrive_count=WG)
            vn_ready = T.alloc_barrier(arrive_count=WG)

            clk = T.alloc_local((1,), "int64")
            spent = T.alloc_local((NUM_PHASES,), "int64")
            if profile:
                for i in T.serial(NUM_PHASES):
                    spent[i] = 0
                clk[0] = T.call_extern("int64", "clock64")

            tx = T.get_thread_binding()

            if tx < WG:
                # ---- WG0: the state ----
                T.set_max_nreg(NREG_STATE, 1)
                s = T.alloc_fragment((dk, block_v), acc)
                gam = T.alloc_local((1,), acc)
                if state_pass:  # M slices start from I (or stay 0 when skipped: no chunks run)
                    for i, j in T.Parallel(dk, block_v):
                        s[i, j] = T.if_then_else(v0 >= dv and i == v0 - dv + j and n_chunks > 0, 1.0, 0.0)
                elif use_initial_state:
                    for i, j in T.Parallel(dk, block_v):
                        if state_v_first:
                            s[i, j] = h0[seq, bh, v0 + j, i]
                        else:
                            s[i, j] = h0[seq, bh, i, v0 + j]
                else:
                    T.clear(s)
                for c in T.serial(n_chunks):
                    st = c % 2
                    if profile:
                        clk[0] = T.call_extern("int64", "clock64")
                    if c > 0:
                        T.barrier_wait(qs_done, (c + 1) % 2)
                        if store_states:  # the last chunk's store has read s_sh
                            T.tma_store_wait()
                            T.sync_threads(3, WG)
                    tick(clk, spent, 0)
                    T.copy(s, s_sh)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    if store_states:
                        T.sync_threads(3, WG)  # every WG0 thread's s_sh writes are in and fenced
                        T.tma_copy(s_sh, states[chunk_offsets[seq] + c, bh, 0:dk, v0 : v0 + block_v])
                    tick(clk, spent, 1)
                    T.barrier_wait(full[st], (c // 2) % 2)
                    tick(clk, spent, 2)
                    gam[0] = T.exp2(g_sh[st, C - 1] * LOG2E)
                    for i, j in T.Parallel(dk, block_v):
                        s[i, j] = s[i, j] * gam[0]
                    tick(clk, spent, 3)
                    T.barrier_wait(vd_ready, c % 2)
                    tick(clk, spent, 4)
                    T.gemm(k_sh[st, :, :], vd_sh, s, transpose_A=True)
                    tick(clk, spent, 5)
                    T.barrier_arrive(empty[st])
                    tick(clk, spent, 6)
                if store_states:
                    T.tma_store_wait(0, False)  # every state store has landed before the CTA exits
                for i, j in T.Parallel(dk, block_v):
                    if state_v_first:
                        ht[seq, bh, v0 + j, i] = s[i, j]
                    else:
                        ht[seq, bh, i, v0 + j] = s[i, j]
                if profile and tx == 0:
                    for i in T.serial(NUM_PHASES):
                        prof[bid, 0, i] = spent[i]

            elif tx < 2 * WG:
                if ab:
                    # ---- WG1, rev 7: -Wk and U ahead of the state, then Vnew = U - Wk S -> Vd ----
                    T.set_max_nreg(nreg_delta, 1)
                    agd = T.alloc_fragment((C, C), dtype)  # -Agb D = -D A0 diag(beta): Wk's GEMM's register operand
                    wk = T.alloc_fragment((C, dk), acc)  # -Wk = -Agb D K
                    wkb = T.alloc_fragment((C, dk), dtype)  # -Wk in bf16: the register operand of the chain's GEMM
                    u = T.alloc_fragment((C, block_v), acc)  # U, then Vnew
                    if async_prep:
                        ud = T.alloc_fragment((C, block_v), acc)  # Vd = D_r Vnew, stored ahead of Vnew (rev 9)
                    for c in T.serial(n_chunks):
                        st = c % 2
                        t0 = start + c * C
                        if profile:
                            clk[0] = T.call_extern("int64", "clock64")
                        T.barrier_wait(full[st], (c // 2) % 2)
                        tick(clk, spent, 0)
                        for i in T.Parallel(C):
                            d1_sh[st, i] = T.exp2(g_sh[st, i] * LOG2E)
                            dr1_sh[st, i] = T.if_then_else(
                                t0 + i < end, T.exp2((g_sh[st, C - 1] - g_sh[st, i]) * LOG2E), 0.0
                            )
                            if diag_fix:
                                rb_sh[st, i] = b_sh[st, i] - T.cast(T.cast(b_sh[st, i], dtype), acc)
                        T.sync_threads(1, WG)
                        tick(clk, spent, 1)
                        T.copy(a_sh[st, :, :], agd)
                        if diag_fix:  # Agb's diagonal is beta (A0 and Gamma are 1 there): take it unrounded
                            for i, j in T.Parallel(C, C):
                                agd[i, j] = T.cast(
                                    T.if_then_else(i == j, -b_sh[st, j], -T.cast(agd[i, j], acc)) * d1_sh[st, j], dtype
                                )
                        else:
                            for i, j in T.Parallel(C, C):
                                agd[i, j] = T.cast(-T.cast(agd[i, j], acc) * d1_sh[st, j], dtype)
                        if async_prep:
                            T.wgmma_gemm(agd, k_sh[st, :, :], wk, clear_accum=True)
                            # the diagonal's share of U with beta unrounded, under -Wk's GEMM; U's GEMM adds onto it
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = rb_sh[st, i] * T.cast(v_sh[st, i, j], acc)
                            T.wgmma_gemm(a_sh[st, :, :], v_sh[st, :, :], u)
                            T.wait_wgmma(0)
                            # no read of either accumulator moves above the wait (counts: 32-bit registers per thread)
                            T.warpgroup_fence_operand(wk, 0, C * dk // WG)
                            T.warpgroup_fence_operand(u, 0, C * block_v // WG)
                            T.copy(wk, wkb)
                            tick(clk, spent, 2)
                        else:
                            T.gemm(agd, k_sh[st, :, :], wk, clear_accum=True)
                            T.copy(wk, wkb)
                            tick(clk, spent, 2)
                            T.gemm(a_sh[st, :, :], v_sh[st, :, :], u, clear_accum=True)
                        if diag_fix and not async_prep:  # the diagonal's share of U with beta unrounded
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = u[i, j] + rb_sh[st, i] * T.cast(v_sh[st, i, j], acc)
                        if state_pass:  # the transition slices run with V = 0
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = T.if_then_else(v0 < dv, u[i, j], 0.0)
                        tick(clk, spent, 3)
                        T.barrier_wait(s_ready, c % 2)
                        tick(clk, spent, 4)
                        T.gemm(wkb, s_sh, u)
                        tick(clk, spent, 5)
                        if async_prep:
                            # Vd first: WG0's state update waits on it, WG2's Vnew read does not hold up the
                            # chain (WG0 read vd_sh(c - 1) before it published this chunk's state)
                            for i, j in T.Parallel(C, block_v):
                                ud[i, j] = u[i, j] * dr1_sh[st, i]
                            T.copy(ud, vd_sh)
                            T.fence_proxy_async()
                            T.barrier_arrive(vd_ready)
                            tick(clk, spent, 6)
                            T.barrier_wait(ag_ready, c % 2)  # WG2 has read vn_sh for chunk c - 1
                            tick(clk, spent, 7)
                            if not state_pass:  # nobody reads Vnew in the state pass
                                T.copy(u, vn_sh)
                                T.fence_proxy_async()
                        else:
                            T.barrier_wait(ag_ready, c % 2)  # WG2 has read vn_sh for chunk c - 1
                            tick(clk, spent, 6)
                            if not state_pass:  # nobody reads Vnew in the state pass
                                T.copy(u, vn_sh)
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = u[i, j] * dr1_sh[st, i]
                            T.copy(u, vd_sh)
                            T.fence_proxy_async()
                            T.barrier_arrive(vd_ready)
                            tick(clk, spent, 7)
                        T.barrier_arrive(vn_ready)
                        T.barrier_arrive(empty[st])
                        tick(clk, spent, 8)
                    if profile and tx == WG:
                        for i in T.serial(NUM_PHASES):
                            prof[bid, 1, i] = spent[i]
                else:
                    # ---- WG1: K S -> W -> Vnew -> Vd ----
                    T.set_max_nreg(nreg_delta, 1)
                    u = T.alloc_fragment((C, block_v), acc)  # K S, then Vnew (one accumulator: registers)
                    for c in T.serial(n_chunks):
                        st = c % 2
                        t0 = start + c * C
                        if profile:
                            clk[0] = T.call_extern("int64", "clock64")
                        T.barrier_wait(full[st], (c // 2) % 2)
                        tick(clk, spent, 0)
                        for i in T.Parallel(C):
                            d1_sh[st, i] = T.exp2(g_sh[st, i] * LOG2E)
                            dr1_sh[st, i] = T.if_then_else(
                                t0 + i < end, T.exp2((g_sh[st, C - 1] - g_sh[st, i]) * LOG2E), 0.0
                            )
                        T.sync_threads(1, WG)
                        tick(clk, spent, 1)
                        T.barrier_wait(s_ready, c % 2)
                        tick(clk, spent, 2)
                        T.gemm(k_sh[st, :, :], s_sh, u, clear_accum=True)
                        tick(clk, spent, 3)
                        if state_pass:  # the M slices run with V = 0
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = (T.if_then_else(v0 < dv, T.cast(v_sh[st, i, j], acc), 0.0)
                                           - d1_sh[st, i] * u[i, j])
                            T.copy(u, v_sh[st, :, :])
                        elif beta_in_w:  # W' = diag(beta) W, rounded once
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = (T.cast(v_sh[st, i, j], acc) - d1_sh[st, i] * u[i, j]) * b_sh[st, i]
                            T.copy(u, v_sh[st, :, :])
                        elif v5:
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = T.cast(v_sh[st, i, j], acc) - d1_sh[st, i] * u[i, j]
                            T.copy(u, v_sh[st, :, :])
                        else:
                            for i, j in T.Parallel(C, block_v):
                                v_sh[st, i, j] = T.cast(T.cast(v_sh[st, i, j], acc) - d1_sh[st, i] * u[i, j], dtype)
                        T.fence_proxy_async()
                        T.sync_threads(1, WG)
                        tick(clk, spent, 4)
                        T.barrier_wait(ag_ready, c % 2)
                        tick(clk, spent, 5)
                        T.gemm(a_sh[st, :, :], v_sh[st, :, :], u, clear_accum=True)
                        tick(clk, spent, 6)
                        if state_pass:  # nobody reads Vnew
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = u[i, j] * dr1_sh[st, i]
                            T.copy(u, vd_sh)
                            T.fence_proxy_async()
                            T.barrier_arrive(vd_ready)
                            T.barrier_arrive(vn_ready)
                            T.barrier_arrive(empty[st])
                        elif v5:
                            T.copy(u, vn_sh)
                            for i, j in T.Parallel(C, block_v):
                                u[i, j] = u[i, j] * dr1_sh[st, i]
                            T.copy(u, vd_sh)
                            T.fence_proxy_async()
                            T.barrier_arrive(vd_ready)
                            tick(clk, spent, 7)
                            T.barrier_arrive(vn_ready)
                            T.barrier_arrive(empty[st])
                            tick(clk, spent, 8)
                        else:
                            for i, j in T.Parallel(C, block_v):
                                vd_sh[i, j] = T.cast(u[i, j] * dr1_sh[st, i], dtype)
                            T.fence_proxy_async()
                            T.barrier_arrive(vd_ready)
                            tick(clk, spent, 7)
                            T.copy(u, vn_sh)
                            T.fence_proxy_async()
                            T.barrier_arrive(vn_ready)
                            T.barrier_arrive(empty[st])
                            tick(clk, spent, 8)
                    if profile and tx == WG:
                        for i in T.serial(NUM_PHASES):
                            prof[bid, 1, i] = spent[i]

            elif tx < 3 * WG:
                # ---- WG2: P, Ag, O ----
                T.set_max_nreg(nreg_out, 1)
                p = T.alloc_fragment((C, C), acc)
                if not ab:  # rev 7 gates P in place and has no Ag to build
                    gm = T.alloc_fragment((C, C), acc)
                ob = T.alloc_fragment((C, block_v), acc)
                if state_pass:
                    # only Ag for WG1 (rev 7: nothing, stage 1 gated it); the waits keep this warpgroup in
                    # step with the barrier phases
                    for c in T.serial(n_chunks):
                        st = c % 2
                        T.barrier_wait(full[st], (c // 2) % 2)
                        if not ab:
                            for i, j in T.Parallel(C, C):
                                gm[i, j] = T.if_then_else(
                                    i >= j, T.exp2((g_sh[st, i] - g_sh[st, j]) * LOG2E), 0.0
                                ) * T.cast(a_sh[st, i, j], acc) * b_sh[st, j]
                            T.copy(gm, a_sh[st, :, :])
                            T.fence_proxy_async()
                        T.barrier_arrive(ag_ready)
                        T.barrier_wait(s_ready, c % 2)
                        T.barrier_arrive(qs_done)
                        T.barrier_wait(vn_ready, c % 2)
                        T.barrier_arrive(empty[st])
                if not state_pass:
                    for c in T.serial(n_chunks):
                        st = c % 2
                        t0 = start + c * C
                        if profile:
                            clk[0] = T.call_extern("int64", "clock64")
                        T.barrier_wait(full[st], (c // 2) % 2)
                        tick(clk, spent, 0)
                        T.gemm(q_sh[st, :, :], k_sh[st, :, :], p, transpose_B=True, clear_accum=True)
                        tick(clk, spent, 1)
                        if ab:  # Pg = scale Gamma o P; no A0 to gate (stage 1 did); ag_ready: vn_sh(c - 1) read
                            for i, j in T.Parallel(C, C):
                                p[i, j] = T.if_then_else(
                                    i >= j, p[i, j] * T.exp2((g_sh[st, i] - g_sh[st, j]) * LOG2E) * scale, 0.0
                                )
                            T.barrier_arrive(ag_ready)
                            tick(clk, spent, 2)
                            for i in T.Parallel(C):
                                d2_sh[st, i] = T.exp2(g_sh[st, i] * LOG2E) * scale
                            T.copy(p, p_sh)
                        else:
                            for i, j in T.Parallel(C, C):
                                gm[i, j] = T.if_then_else(
                                    i >= j, T.exp2((g_sh[st, i] - g_sh[st, j]) * LOG2E), 0.0
                                )
                        if v5 and not ab:
                            for i, j in T.Parallel(C, C):
                                p[i, j] = p[i, j] * gm[i, j] * scale
                            for i, j in T.Parallel(C, C):
                                if beta_in_w:  # beta is in W' (WG1)
                                    gm[i, j] = gm[i, j] * T.cast(a_sh[st, i, j], acc)
                                else:
                                    gm[i, j] = gm[i, j] * T.cast(a_sh[st, i, j], acc) * b_sh[st, j]
                            T.copy(gm, a_sh[st, :, :])
                            T.fence_proxy_async()
                            T.barrier_arrive(ag_ready)
                            tick(clk, spent, 2)
                            for i in T.Parallel(C):
                                d2_sh[st, i] = T.exp2(g_sh[st, i] * LOG2E) * scale
                            T.copy(p, p_sh)
                        elif not ab:
                            for i, j in T.Parallel(C, C):
                                a_sh[st, i, j] = T.cast(T.cast(a_sh[st, i, j], acc) * gm[i, j] * b_sh[st, j], dtype)
                            T.fence_proxy_async()
                            T.barrier_arrive(ag_ready)
                            tick(clk, spent, 2)
                            for i in T.Parallel(C):
                                d2_sh[st, i] = T.exp2(g_sh[st, i] * LOG2E) * scale
                            for i, j in T.Parallel(C, C):
                                p_sh[i, j] = T.cast(p[i, j] * gm[i, j] * scale, dtype)
                        T.fence_proxy_async()
                        T.sync_threads(2, WG)
                        tick(clk, spent, 3)
                        T.barrier_wait(s_ready, c % 2)
                        tick(clk, spent, 4)
                        T.gemm(q_sh[st, :, :], s_sh, ob, clear_accum=True)
                        T.barrier_arrive(qs_done)
                        tick(clk, spent, 5)
                        for i, j in T.Parallel(C, block_v):
                            ob[i, j] = ob[i, j] * d2_sh[st, i]
                        tick(clk, spent, 6)
                        T.barrier_wait(vn_ready, c % 2)
                        tick(clk, spent, 7)
                        T.gemm(p_sh, vn_sh, ob)
                        T.barrier_arrive(empty[st])
                        tick(clk, spent, 8)
                        if ab:
                            if t0 + C <= end:
                                T.tma_store_wait(1)  # the store of chunk c - 2 (the same stage) has read o_sh[st]
                                T.sync_threads(2, WG)
                                if async_prep:
                                    # a stage slice of one 3-D buffer was filled by 4-byte stores (32 per thread at
                                    # BV = 128: ~1.1 K cycles per chunk behind the busy shared-memory pipe, session
                                    # 13's profile); a 2-D buffer gets stmatrix, 8 per thread
                                    tick(clk, spent, 9)
                                    if st == 0:
                                        T.copy(ob, o_sh0)
                                    else:
                                        T.copy(ob, o_sh1)
                                    tick(clk, spent, 10)
                                    T.fence_proxy_async()
                                    T.sync_threads(2, WG)
                                    tick(clk, spent, 11)
                                    if st == 0:
                                        T.tma_copy(o_sh0, o[0, t0 : t0 + C, bh, v0 : v0 + block_v])
                                    else:
                                        T.tma_copy(o_sh1, o[0, t0 : t0 + C, bh, v0 : v0 + block_v])
                                else:
                                    T.copy(ob, o_sh[st, :, :])
                                    T.fence_proxy_async()
                                    T.sync_threads(2, WG)
                                    T.tma_copy(o_sh[st, :, :], o[0, t0 : t0 + C, bh, v0 : v0 + block_v])
                            else:
                                for i, j in T.Parallel(C, block_v):
                                    if t0 + i < end:
                                        o[0, t0 + i, bh, v0 + j] = T.cast(ob[i, j], dtype)
                        elif v5 and t0 + C <= end:
                            T.tma_store_wait()  # the previous chunk's TMA store has read o_sh
                            T.sync_threads(2, WG)
                            T.copy(ob, o_sh)
                            T.fence_proxy_async()
                            T.sync_threads(2, WG)
                            T.tma_copy(o_sh, o[0, t0 : t0 + C, bh, v0 : v0 + block_v])
                        elif t0 + C <= end:
                            for i, j in T.Parallel(C, block_v):
                                o[0, t0 + i, bh, v0 + j] = T.cast(ob[i, j], dtype)
                        else:
                            for i, j in T.Parallel(C, block_v):
                                if t0 + i < end:
                                    o[0, t0 + i, bh, v0 + j] = T.cast(ob[i, j], dtype)
                        tick(clk, spent, 12 if async_prep else 9)
                if v5 and not state_pass:
                    T.tma_store_wait(0, False)  # every O store has landed before the CTA exits
                if profile and tx == 2 * WG:
                    for i in T.serial(NUM_PHASES):
                        prof[bid, 2, i] = spent[i]

            else:
                # ---- WG3: loads (one warp) ----
                T.set_max_nreg(NREG_LOAD, 0)
                if tx < 3 * WG + 32:
                    for c in T.serial(n_chunks):
                        st = c % 2
                        t0 = start + c * C
                        if c >= 2:
                            T.barrier_wait(empty[st], (c // 2 + 1) % 2)
                        if not state_pass:
                            T.tma_copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh[st, :, :], barrier=full[st])
                        T.tma_copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh[st, :, :], barrier=full[st])
                        if state_pass:  # M slices (v0 >= V) load slice 0 and ignore it
                            vc = T.if_then_else(v0 < dv, v0, 0)
                            T.tma_copy(v[0, t0 : t0 + C, bh, vc : vc + block_v], v_sh[st, :, :], barrier=full[st])
                        else:
                            T.tma_copy(v[0, t0 : t0 + C, bh, v0 : v0 + block_v], v_sh[st, :, :], barrier=full[st])
                        T.tma_copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh[st, :, :], barrier=full[st])
                        for i in T.Parallel(C):
                            g_sh[st, i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                            b_sh[st, i] = beta[0, T.min(t0 + i, end - 1), bh]
                        T.barrier_arrive(full[st])

    if state_pass:

        @T.prim_func
        def cp_state_pass(
            q: T.Tensor((1, nt, h_qk, dk), dtype),
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            v: T.Tensor((1, nt, h_v, dv), dtype),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            a0: T.Tensor((1, nt, h_v, C), dtype),
            cu_seqlens: T.Tensor((ns + 1,), "int32"),
            hm: T.Tensor((ns, h_v, dk, 2 * dv), acc),
        ):
            kernel_body(q, k, v, g_cumsum, beta, a0, None, cu_seqlens, None, hm, None, None, None)

        return cp_state_pass

    if profile:

        @T.prim_func
        def fused_fwd_ws_profile(
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
            prof: T.Tensor((ns * h_v * nv, 3, NUM_PHASES), "int64"),
        ):
            kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, prof, None, None)

        return fused_fwd_ws_profile

    if store_states:

        @T.prim_func
        def fused_fwd_ws_states(
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
            kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, None, chunk_offsets, states)

        return fused_fwd_ws_states

    @T.prim_func
    def fused_fwd_ws(
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
        seq_order: T.Tensor((ns,), "int32"),
    ):
        kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, None, None, None, seq_order)

    return fused_fwd_ws


fused_fwd_ws_kernel = tilelang.jit(fused_fwd_ws_program, pass_configs=PASS_CONFIGS)
