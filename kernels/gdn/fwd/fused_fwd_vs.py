"""Fused forward with the state split over two warpgroups along V (FlashInfer's layout; step 1 of NOTES.md's
one-kernel design, session 14). On an H100 (session 15): all seven float64 forward cases pass, at ws12's speed.

One CTA per (sequence or piece, value head) and the whole V = 128, 512 threads:
- WG0, producer (24 registers): one warp loads Q, K, both halves of V and stage 1's Agb (TMA) and g_cumsum,
  beta, two stages.
- WG1, WG2, state (192 each): rows v0..v0+63 of V, S^T [64, K] fp32 as a wgmma accumulator. Per chunk, with
  X = bf(S^T) as the register operand:
      O1^T = X Q^T,  W^T = X K^T                       (m64n64k128)
      Vnew^T = V^T Agb^T - (W^T D) Agb^T + fix         (V^T read transposed from shared memory; D = diag(e^g))
      O^T = scale O1^T D + bf(Vnew^T) Pg^T
      S^T = e^(g_last) S^T + bf(Vnew^T D_r) K          (D_r = diag(e^(g_last - g)), 0 past the sequence end)
  fix = (beta_t - bf(beta_t)) (V - D W)[t]: Agb's diagonal is bf(beta); rounding_study's "one-kernel" order
  (0.80x FLA's one-token state error with it, 1.03x without). O^T goes out through shared memory by TMA. The
  state never leaves registers: no s_sh, vd_sh, vn_sh.
- WG3, auxiliary (104): Pg = scale (Q K^T o Gamma), lower triangle with the diagonal, and the gate vectors,
  per stage, for both state warpgroups. Step 2 of the design moves stage 1's inverse here.

Same arguments as fused_fwd_ws's main build (a0 is stage 1's emit_agb output), so the api can run it as an
AGB fused kernel ("vs1"). No profile, state-pass or state-store builds yet; states [N, H_v, K, V] only.

solve_in_kernel=True ("vs2", step 2 of the design, session 15; H100: correct, 1.6x slower than kkt + ws12 because
the auxiliary warpgroup's chunk takes ~8 us, NOTES.md; session 16's profile build: ~14 K cycles of it, issue-bound,
while the state warpgroups wait 8.6 K of theirs) drops stage 1: the
kernel takes the raw gate g, and WG3 forms per chunk, after Pg, the chunk-local cumsum of g (written out as
g_cumsum), L = StrictLower(diag(beta) K K^T), A0 = (I + L)^-1 by fwd/chunk_inverse.py's block recursion (tf32
products, 3xTF32 with precise=True) and Agb = Gamma o A0 diag(beta) into the stage the state warpgroups read.
Arguments: (q, k, v, g, beta, h0, cu_seqlens, o, ht, g_cumsum).
"""

import tilelang
import tilelang.language as T

from .chunk_inverse import BLK, HALF, make_chunk_inverse
from .fused_fwd_ws import CHUNK, LOG2E, PASS_CONFIGS, WG
from .kkt_solve_v10 import BLK as BLK8
from .kkt_solve_v10 import make_fp16_inverse

# setmaxnreg per warpgroup: 24 + 192 + 192 + 104 = 512 (the 64 K register file at 128 threads each). The
# kernel compiles at 128 per thread (512 threads), so the state warpgroups increase and the others decrease.
NREG_LOAD = 24
NREG_STATE = 192
NREG_AUX = 104
# (solve_in_kernel keeps these: at 184 / 120 the state warpgroups spill a few words; at 192 / 104 only the
# auxiliary warpgroup does, ~18 loop-invariant words, read back from L1 a few times a chunk)


# The profile build's phases (clock64 cycles of each warpgroup's first thread, summed over its chunks)
PHASES = (
    ("wait full", "wait aux_ready", "gemms X Q^T, X K^T", "O1 scale, -W D", "gemms Vnew", "Pg Vnew, S update",
     "O out"),
    ("wait full", "cumsum, g_cumsum out", "gemm Q K^T, Pg -> p_sh", "gemm K K^T, L operands", "diagonal blocks",
     "level 1", "level 2, Agb", "gate vectors, arrive"),
)
# fast_gates (vs3): WG3's phase 1 is Q K^T with the scan and the gate vectors under it, phase 7 is empty
PHASES_FAST_GATES = (
    PHASES[0],
    ("wait full", "gemm Q K^T under the scan, gate vectors", "Pg -> p_sh") + PHASES[1][3:7] + ("arrive",),
)
# fp16_inverse (vs4): WG3's inverse as kkt v10's (phases 3-6)
PHASES_FP16_INVERSE = (
    PHASES[0],
    PHASES_FAST_GATES[1][:3] + ("gemm K K^T, L' (gated, fp16)", "8 x 8 diagonal blocks", "level 8 -> 16",
                                "levels 16 -> 64, Agb", "arrive"),
)
NUM_PHASES = max(len(p) for p in PHASES)


def fused_fwd_vs_program(dk: int, dv: int, scale: float, dtype: str, use_initial_state: bool,
                         solve_in_kernel: bool = False, precise: bool = False, profile: bool = False,
                         fast_gates: bool = False, fp16_inverse: bool = False):
    """(q, k, v, g_cumsum, beta, agb, h0, cu_seqlens, o, ht) as fused_fwd_ws_program's main build; with
    solve_in_kernel, (q, k, v, g, beta, h0, cu_seqlens, o, ht, g_cumsum). precise: the in-kernel inverse's
    products in 3xTF32 (stage 1 v4's) instead of one tf32 pass (v4t's). profile (solve_in_kernel only): a
    measuring build with one more argument last, prof [num_seqs * h_v, 2, NUM_PHASES] int64, where the first
    thread of WG1 (row 0) and of WG3 (row 1) add up the clock64 cycles of each phase of PHASES.

    fast_gates (solve_in_kernel only; "vs3", session 25): WG3's first phases for latency. Q K^T goes out to the
    tensor cores first; under it, WG3 scans the chunk's gate with warp shuffles (two values a lane,
    five shuffle rounds, where vs2 had 64 threads each sum their own prefix from shared memory: 1.4 K cycles a
    chunk in session 16's profile) and writes g_cumsum and the gate vectors (0.5 K cycles in vs2, a pass of its
    own); then one named barrier. Pg's gate is exp2(d m) (i >= j ? scale : 0) with m = (i >= j): its two g loads
    no longer sit in a branch, so each thread reads its 2 row and 16 column values once (vs2: 64 loads); the
    inverse's beta and Agb gates the same way (make_chunk_inverse's masked_loads). The
    scan adds in another order than vs2's (fp32 rounding only); the state warpgroups are vs2's. (No explicit
    barrier: TileLang's own, id 4 over WG3's threads, orders the scan's writes before Pg's reads; it gives id 3 to
    the producer warp, so a hand-written T.sync_threads(3, 128) here would share an id with a 32-thread one.)

    fp16_inverse (with fast_gates; "vs4", session 26): WG3's inverse as kkt v10's (fwd/kkt_solve_v10.py): the gate
    and beta's rows go into L' in K K^T's epilogue (fp16), X = 0, 8 x 8 diagonal blocks, three whole-tile fp16
    doublings on wgmma, Agb = X diag(beta) into the stage's a_sh; in place of chunk_inverse's staged 16 -> 32 -> 64
    recursion (~7.9 K of vs3's ~12.6 K cycles a chunk) and its separate gating of A0."""
    C = CHUNK
    assert not precise or solve_in_kernel
    assert not profile or solve_in_kernel
    assert not fast_gates or solve_in_kernel
    assert not fp16_inverse or fast_gates
    assert dk == 128 and dv == 128, "two state warpgroups of 64 rows of V, K = 128"
    vh = dv // 2
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs")
    nh0 = T.dynamic("num_h0")
    acc = "float32"

    @T.macro
    def tick(clk, spent, phase):
        """End of a phase: add the cycles since the last tick to spent[phase] (profile builds only; WG2, whose
        spent is None, is not timed)."""
        if profile and spent is not None:
            now = T.call_extern("int64", "clock64")
            spent[phase] = spent[phase] + (now - clk[0])
            clk[0] = now

    @T.macro
    def state_walk(q_sh, k_sh, v_sh, a_sh, p_sh, o_sh, e1_sh, er_sh, rb_sh, gl_sh, full, aux_ready, empty,
                   h0, o, ht, seq, bh, start, end, n_chunks, half, bar_id, clk, spent):  # fmt: skip
        """One state warpgroup: rows half * 64 .. half * 64 + 63 of V (clk, spent: the profile build's)."""
        T.set_max_nreg(NREG_STATE, 1)
        v0 = half * vh
        s = T.alloc_fragment((vh, dk), acc)  # S^T
        xb = T.alloc_fragment((vh, dk), dtype)  # bf(S^T): the register operand of the chunk's first GEMMs
        o1 = T.alloc_fragment((vh, C), acc)  # O^T
        w = T.alloc_fragment((vh, C), acc)  # W^T = S^T K^T
        wb = T.alloc_fragment((vh, C), dtype)  # -(W^T D), rounded
        vn = T.alloc_fragment((vh, C), acc)  # Vnew^T
        vb = T.alloc_fragment((vh, C), dtype)  # bf(Vnew^T), then bf(Vnew^T D_r)
        if use_initial_state:
            for i, j in T.Parallel(vh, dk):
                s[i, j] = h0[seq, bh, j, v0 + i]
        else:
            T.clear(s)
        for c in T.serial(n_chunks):
            st = c % 2
            t0 = start + c * C
            tick(clk, spent, 0)
            T.barrier_wait(full[st], (c // 2) % 2)
            tick(clk, spent, 0)
            T.barrier_wait(aux_ready[st], (c // 2) % 2)
            tick(clk, spent, 1)
            T.copy(s, xb)
            # both first GEMMs in flight under one wait; no read of either accumulator moves above it
            T.wgmma_gemm(xb, q_sh[st, :, :], o1, transpose_B=True, clear_accum=True)
            T.wgmma_gemm(xb, k_sh[st, :, :], w, transpose_B=True, clear_accum=True)
            T.wait_wgmma(0)
            T.warpgroup_fence_operand(o1, 0, vh * C // WG)
            T.warpgroup_fence_operand(w, 0, vh * C // WG)
            tick(clk, spent, 2)
            for i, j in T.Parallel(vh, C):
                o1[i, j] = o1[i, j] * e1_sh[st, j] * scale
                wb[i, j] = T.cast(-w[i, j] * e1_sh[st, j], dtype)
            # the diagonal's share with beta unrounded (its own rounding of W costs ~2^-9 of ~2^-9 beta)
            for i, j in T.Parallel(vh, C):
                vn[i, j] = rb_sh[st, j] * (T.cast(v_sh[st, j, i], acc) + T.cast(wb[i, j], acc))
            tick(clk, spent, 3)
            T.wgmma_gemm(v_sh[st, :, :], a_sh[st, :, :], vn, transpose_A=True, transpose_B=True)
            T.wgmma_gemm(wb, a_sh[st, :, :], vn, transpose_B=True)
            T.wait_wgmma(0)
            T.warpgroup_fence_operand(vn, 0, vh * C // WG)
            tick(clk, spent, 4)
            T.copy(vn, vb)
            T.gemm(vb, p_sh[st, :, :], o1, transpose_B=True)
            for i, j in T.Parallel(vh, C):
                vb[i, j] = T.cast(vn[i, j] * er_sh[st, j], dtype)
            for i, j in T.Parallel(vh, dk):
                s[i, j] = s[i, j] * gl_sh[st]
            T.gemm(vb, k_sh[st, :, :], s)
            T.barrier_arrive(empty[st])
            tick(clk, spent, 5)
            if t0 + C <= end:
                T.tma_store_wait()  # the previous chunk's store has read o_sh
                T.sync_threads(bar_id, WG)
                for i, j in T.Parallel(vh, C):
                    o_sh[j, i] = T.cast(o1[i, j], dtype)
                T.fence_proxy_async()
                T.sync_threads(bar_id, WG)
                T.tma_copy(o_sh, o[0, t0 : t0 + C, bh, v0 : v0 + vh])
            else:
                for i, j in T.Parallel(vh, C):
                    if t0 + j < end:
                        o[0, t0 + j, bh, v0 + i] = T.cast(o1[i, j], dtype)
            tick(clk, spent, 6)
        T.tma_store_wait(0, False)  # every O store has landed before the CTA exits
        for i, j in T.Parallel(vh, dk):
            ht[seq, bh, j, v0 + i] = s[i, j]

    alloc_work, clear_constant_blocks, inv = make_chunk_inverse(dtype, precise, masked_loads=fast_gates)

    @T.macro
    def wg_gemm(a, b, out, clear):
        T.gemm(a, b, out, clear_accum=clear)

    diagonal16, doubling16 = make_fp16_inverse(wg_gemm, acc, "float16")

    @T.macro
    def warp_gates(g_sh, b_sh, gs, e1_sh, er_sh, rb_sh, gl_sh, g_cumsum, st, t0, end, bh, tw, sc):
        """gs[st, :] = the chunk-local inclusive cumsum of g_sh[st, :] (each lane holds tokens lane and lane + 32;
        Hillis-Steele over the lanes, five shuffle rounds, then the first half's total added to the second),
        g_cumsum out, and the gate vectors of the stage (vs2's values). Every warp of the warpgroup (tw: the
        thread's index in it) runs the scan, so no shuffle sits in a branch the compiler cannot prove
        warp-uniform (it emulates those lane by lane); only the first warp writes."""
        # sc: (4,) local; [2], [3] take each round's shuffles, stored before the lane's branch reads them
        lane = tw % 32
        sc[0] = g_sh[st, lane]
        sc[1] = g_sh[st, lane + 32]
        for r in T.unroll(5):
            sc[2] = T.shfl_up(sc[0], 1 << r)
            sc[3] = T.shfl_up(sc[1], 1 << r)
            if lane >= (1 << r):
                sc[0] = sc[0] + sc[2]
                sc[1] = sc[1] + sc[3]
        sc[2] = T.shfl_sync(sc[0], 31)
        sc[1] = sc[1] + sc[2]
        sc[3] = T.shfl_sync(sc[1], 31)  # the chunk's last cumsum
        if tw < 32:
            gs[st, lane] = sc[0]
            gs[st, lane + 32] = sc[1]
            for half in T.unroll(2):
                if t0 + lane + half * 32 < end:
                    g_cumsum[0, t0 + lane + half * 32, bh] = sc[half]
                e1_sh[st, lane + half * 32] = T.exp2(sc[half] * LOG2E)
                er_sh[st, lane + half * 32] = T.if_then_else(
                    t0 + lane + half * 32 < end, T.exp2((sc[3] - sc[half]) * LOG2E), 0.0
                )
                rb_sh[st, lane + half * 32] = (b_sh[st, lane + half * 32]
                                               - T.cast(T.cast(b_sh[st, lane + half * 32], dtype), acc))  # fmt: skip
            if tw == 0:
                gl_sh[st] = T.exp2(sc[3] * LOG2E)


    @T.macro
    def kernel_body(q, k, v, g, beta, a0, h0, cu_seqlens, o, ht, g_cumsum, prof):
        """g is g_cumsum from stage 1 (a0 its Agb), or with solve_in_kernel the raw gate (a0 None, and the
        chunk-local cumsum goes out to g_cumsum)."""
        with T.Kernel(ns * h_v, threads=4 * WG) as (bid,):
            seq = T.alloc_var("int32", init=bid // h_v)
            bh = T.alloc_var("int32", init=bid % h_v)
            bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
            start = T.alloc_var("int32", init=cu_seqlens[bid // h_v])
            end = T.alloc_var("int32", init=cu_seqlens[bid // h_v + 1])
            n_chunks = T.ceildiv(end - start, C)

            q_sh = T.alloc_shared((2, C, dk), dtype)
            k_sh = T.alloc_shared((2, C, dk), dtype)
            v_sh0 = T.alloc_shared((2, C, vh), dtype)
            v_sh1 = T.alloc_shared((2, C, vh), dtype)
            a_sh = T.alloc_shared((2, C, C), dtype)  # Agb (stage 1)
            p_sh = T.alloc_shared((2, C, C), dtype)  # Pg (WG3)
            o_sh0 = T.alloc_shared((C, vh), dtype)
            o_sh1 = T.alloc_shared((C, vh), dtype)
            g_sh = T.alloc_shared((2, C), acc)
            b_sh = T.alloc_shared((2, C), acc)
            # WG3's gate vectors per stage: e^g, e^(g_last - g) (0 past the end), beta - bf(beta), e^(g_last)
            e1_sh = T.alloc_shared((2, C), acc)
            er_sh = T.alloc_shared((2, C), acc)
            rb_sh = T.alloc_shared((2, C), acc)
            gl_sh = T.alloc_shared((2,), acc)
            # WG3's gates: with solve_in_kernel g_sh holds the raw gate and gs its chunk-local cumsum
            # (T.meta_var: bound without renaming the buffer, so vs1's program, and its cache key, stay as they were)
            gs = T.alloc_shared((2, C), acc) if solve_in_kernel else T.meta_var(g_sh)
            work = T.meta_var(alloc_work() if solve_in_kernel and not fp16_inverse else None)
            # vs4's inverse tiles: L', X, P (fp16)
            l16 = T.alloc_shared((C, C), "float16") if fp16_inverse else T.meta_var(None)
            x16 = T.alloc_shared((C, C), "float16") if fp16_inverse else T.meta_var(None)
            p16 = T.alloc_shared((C, C), "float16") if fp16_inverse else T.meta_var(None)
            clk = T.alloc_local((1,), "int64") if profile else T.meta_var(None)
            spent = T.alloc_local((NUM_PHASES,), "int64") if profile else T.meta_var(None)

            full = T.alloc_barrier(arrive_count=[32, 32])
            aux_ready = T.alloc_barrier(arrive_count=[WG, WG])
            empty = T.alloc_barrier(arrive_count=[3 * WG, 3 * WG])

            tx = T.get_thread_binding()
            if profile:
                for i in T.serial(NUM_PHASES):
                    spent[i] = 0
                clk[0] = T.call_extern("int64", "clock64")
            if tx < WG:
                # ---- WG0: loads (one warp) ----
                T.set_max_nreg(NREG_LOAD, 0)
                if tx < 32:
                    for c in T.serial(n_chunks):
                        st = c % 2
                        t0 = start + c * C
                        if c >= 2:
                            T.barrier_wait(empty[st], (c // 2 + 1) % 2)
                        T.tma_copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh[st, :, :], barrier=full[st])
                        T.tma_copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh[st, :, :], barrier=full[st])
                        T.tma_copy(v[0, t0 : t0 + C, bh, 0:vh], v_sh0[st, :, :], barrier=full[st])
                        T.tma_copy(v[0, t0 : t0 + C, bh, vh:dv], v_sh1[st, :, :], barrier=full[st])
                        if solve_in_kernel:
                            # the raw gate, 0 past the end, so the cumsum stays at the last token's there
                            for i in T.Parallel(C):
                                g_sh[st, i] = T.if_then_else(t0 + i < end, g[0, T.min(t0 + i, end - 1), bh], 0.0)
                                b_sh[st, i] = beta[0, T.min(t0 + i, end - 1), bh]
                        else:
                            T.tma_copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh[st, :, :], barrier=full[st])
                            for i in T.Parallel(C):
                                g_sh[st, i] = g[0, T.min(t0 + i, end - 1), bh]
                                b_sh[st, i] = beta[0, T.min(t0 + i, end - 1), bh]
                        T.barrier_arrive(full[st])
            elif tx < 2 * WG:
                state_walk(q_sh, k_sh, v_sh0, a_sh, p_sh, o_sh0, e1_sh, er_sh, rb_sh, gl_sh, full, aux_ready, empty,
                           h0, o, ht, seq, bh, start, end, n_chunks, 0, 1, clk, spent)  # fmt: skip
                if profile and tx == WG:
                    for i in T.serial(NUM_PHASES):
                        prof[bid, 0, i] = spent[i]
            elif tx < 3 * WG:
                state_walk(q_sh, k_sh, v_sh1, a_sh, p_sh, o_sh1, e1_sh, er_sh, rb_sh, gl_sh, full, aux_ready, empty,
                           h0, o, ht, seq, bh, start, end, n_chunks, 1, 2, None, None)  # fmt: skip
            else:
                # ---- WG3: Pg and the gate vectors (with solve_in_kernel: the cumsum of g and Agb too) ----
                T.set_max_nreg(NREG_AUX, 0)
                p = T.alloc_fragment((C, C), acc)  # P, then (solve_in_kernel) K K^T
                # the inverse's registers (None without it: never read then)
                tw = T.meta_var(tx - 3 * WG)
                col = T.alloc_local((BLK8 if fp16_inverse else BLK,), acc) if solve_in_kernel else T.meta_var(None)
                part = T.alloc_local((4,), acc) if solve_in_kernel and not fast_gates else T.meta_var(None)
                sc = T.alloc_local((4,), acc) if fast_gates else T.meta_var(None)  # warp_gates' scan values
                staged = solve_in_kernel and not fp16_inverse  # chunk_inverse's recursion
                t1 = T.alloc_fragment((HALF, BLK), acc) if staged else T.meta_var(None)
                u1 = T.alloc_fragment((HALF, BLK), acc) if staged else T.meta_var(None)
                t2 = T.alloc_fragment((HALF, HALF), acc) if staged else T.meta_var(None)
                u2 = T.alloc_fragment((HALF, HALF), acc) if staged else T.meta_var(None)
                if staged:
                    clear_constant_blocks(work, a_sh, tw)
                for c in T.serial(n_chunks):
                    st = c % 2
                    t0 = start + c * C
                    tick(clk, spent, 7)
                    T.barrier_wait(full[st], (c // 2) % 2)
                    tick(clk, spent, 0)
                    if fast_gates:
                        # Q K^T on the tensor cores while every warp scans the gate (the first writes gs, the vectors)
                        T.wgmma_gemm(q_sh[st, :, :], k_sh[st, :, :], p, transpose_B=True, clear_accum=True)
                        warp_gates(g_sh, b_sh, gs, e1_sh, er_sh, rb_sh, gl_sh, g_cumsum, st, t0, end, bh, tw, sc)
                        T.wait_wgmma(0)
                        T.warpgroup_fence_operand(p, 0, C * C // WG)
                        # (TileLang puts WG3's named barrier here: the first warp's gs writes, every warp's reads)
                        tick(clk, spent, 1)
                        for i, j in T.Parallel(C, C):
                            p[i, j] = (p[i, j] * T.exp2((gs[st, i] - gs[st, j]) * T.if_then_else(i >= j, LOG2E, 0.0))
                                       * T.if_then_else(i >= j, scale, 0.0))  # fmt: skip
                    else:
                        if solve_in_kernel:
                            inv["cumsum"](g_sh, gs, st, tw, part)
                            if tw < C:  # noqa: SIM102 (Python cannot `and` two PrimExpr conditions)
                                if t0 + tw < end:
                                    g_cumsum[0, t0 + tw, bh] = gs[st, tw]
                        tick(clk, spent, 1)
                        T.gemm(q_sh[st, :, :], k_sh[st, :, :], p, transpose_B=True, clear_accum=True)
                        for i, j in T.Parallel(C, C):
                            p[i, j] = T.if_then_else(
                                i >= j, p[i, j] * T.exp2((gs[st, i] - gs[st, j]) * LOG2E) * scale, 0.0
                            )
                    T.copy(p, p_sh[st, :, :])
                    tick(clk, spent, 2)
                    if fp16_inverse:
                        # kkt v10's inverse: L' = StrictLower(diag(beta) (Gamma o K K^T)) (rows past the end 0: b_sh
                        # holds the clamped last token's beta there), X = 0
                        T.gemm(k_sh[st, :, :], k_sh[st, :, :], p, transpose_B=True, clear_accum=True)
                        for i, j in T.Parallel(C, C):
                            l16[i, j] = T.cast(
                                T.if_then_else(
                                    i > j,
                                    p[i, j] * b_sh[st, i] * T.if_then_else(t0 + i < end, 1.0, 0.0)
                                    * T.exp2((gs[st, i] - gs[st, j]) * LOG2E),
                                    0.0,
                                ),
                                "float16",
                            )  # fmt: skip
                            x16[i, j] = T.cast(0.0, "float16")
                        tick(clk, spent, 3)
                        diagonal16(l16, x16, col, tw)
                        tick(clk, spent, 4)
                        doubling16(x16, l16, p16, p, BLK8)
                        tick(clk, spent, 5)
                        doubling16(x16, l16, p16, p, 2 * BLK8)
                        doubling16(x16, l16, p16, p, 4 * BLK8)
                        for i, j in T.Parallel(C, C):  # Agb = X diag(beta), columns past the end 0
                            a_sh[st, i, j] = T.cast(
                                T.cast(x16[i, j], acc) * b_sh[st, j] * T.if_then_else(t0 + j < end, 1.0, 0.0), dtype
                            )
                        tick(clk, spent, 6)
                    elif solve_in_kernel:
                        T.gemm(k_sh[st, :, :], k_sh[st, :, :], p, transpose_B=True, clear_accum=True)
                        inv["lower"](p, b_sh, st, t0, end, work)
                        tick(clk, spent, 3)
                        inv["diagonal"](col, work, tw)
                        tick(clk, spent, 4)
                        inv["level1"](t1, u1, work)
                        tick(clk, spent, 5)
                        inv["level2"](t2, u2, b_sh, gs, st, t0, end, work, a_sh)
                        tick(clk, spent, 6)
                    if not fast_gates:  # (fast_gates: the first warp wrote them under Q K^T)
                        for i in T.Parallel(C):
                            e1_sh[st, i] = T.exp2(gs[st, i] * LOG2E)
                            er_sh[st, i] = T.if_then_else(
                                t0 + i < end, T.exp2((gs[st, C - 1] - gs[st, i]) * LOG2E), 0.0
                            )
                            rb_sh[st, i] = b_sh[st, i] - T.cast(T.cast(b_sh[st, i], dtype), acc)
                        if tx == 3 * WG:
                            gl_sh[st] = T.exp2(gs[st, C - 1] * LOG2E)
                    T.fence_proxy_async()
                    T.barrier_arrive(aux_ready[st])
                    T.barrier_arrive(empty[st])
                if profile and tx == 3 * WG:
                    for i in T.serial(NUM_PHASES):
                        prof[bid, 1, i] = spent[i]

    if profile:

        @T.prim_func
        def fused_fwd_vs_solve_profile(
            q: T.Tensor((1, nt, h_qk, dk), dtype),
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            v: T.Tensor((1, nt, h_v, dv), dtype),
            g: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            h0: T.Tensor((nh0, h_v, dk, dv), acc),
            cu_seqlens: T.Tensor((ns + 1,), "int32"),
            o: T.Tensor((1, nt, h_v, dv), dtype),
            ht: T.Tensor((ns, h_v, dk, dv), acc),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
            prof: T.Tensor((ns * h_v, 2, NUM_PHASES), "int64"),
        ):
            kernel_body(q, k, v, g, beta, None, h0, cu_seqlens, o, ht, g_cumsum, prof)

        return fused_fwd_vs_solve_profile

    if solve_in_kernel:

        @T.prim_func
        def fused_fwd_vs_solve(
            q: T.Tensor((1, nt, h_qk, dk), dtype),
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            v: T.Tensor((1, nt, h_v, dv), dtype),
            g: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            h0: T.Tensor((nh0, h_v, dk, dv), acc),
            cu_seqlens: T.Tensor((ns + 1,), "int32"),
            o: T.Tensor((1, nt, h_v, dv), dtype),
            ht: T.Tensor((ns, h_v, dk, dv), acc),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
        ):
            kernel_body(q, k, v, g, beta, None, h0, cu_seqlens, o, ht, g_cumsum, None)

        return fused_fwd_vs_solve

    @T.prim_func
    def fused_fwd_vs(
        q: T.Tensor((1, nt, h_qk, dk), dtype),
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        v: T.Tensor((1, nt, h_v, dv), dtype),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
        h0: T.Tensor((nh0, h_v, dk, dv), acc),
        cu_seqlens: T.Tensor((ns + 1,), "int32"),
        o: T.Tensor((1, nt, h_v, dv), dtype),
        ht: T.Tensor((ns, h_v, dk, dv), acc),
    ):
        kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, None, None)

    return fused_fwd_vs


fused_fwd_vs_kernel = tilelang.jit(fused_fwd_vs_program, pass_configs=PASS_CONFIGS)
