"""Stage 2 of the forward, rev 7: the state kept transposed (S^T [V-slice, K]) in one warpgroup's registers,
so the whole state chain runs there with the state as the register operand of its GEMMs and no shared
memory round trip on the critical path.

Why: rev 5/6 (fused_fwd_ws.py) keep S [K, BV] as an accumulator and hand it to the next chunk's K S through
shared memory (wgmma's B operand must be in shared memory); the chain then crosses three warpgroups
per chunk (S -> s_sh, K S, W, Ag W, Vd copies, K^T Vd: ~5 K cycles, NOTES.md v5). Transposed, every
chain GEMM has the state or the new values on the left (M = BV = 64), where wgmma takes A from registers:

    Vnew^T = U^T + S^T (-Wk)^T      U = (Gamma o A0) diag(beta) V,  Wk = (Gamma o A0) diag(beta exp(g)) K
    S'^T   = exp(gamma) S^T + (Vnew^T D_r) K

(the same math as rev 6: Vnew = (Gamma o A0) diag(beta) (V - D K S)). U and Wk do not depend on S, so
another warpgroup prepares them one chunk ahead; beta is applied to V and K in fp32 before their bf16
rounding, as FLA forms its u and w.

Warpgroups (128 threads each), one CTA per (sequence, value head, 64-wide V-slice):
  WG0 chain   S^T fp32 [64, K] in registers. Per chunk: bf16(S^T) -> s_sh for WG2, x = Vb^T Ag^T (U^T,
              operands from WG1), x += bf16(S^T) (-Wk)^T (A from registers), bf16(x) -> vn_sh for WG2,
              S^T = exp(gamma) S^T + bf16(x D_r) K (A from registers).
  WG1 prep    Ag = Gamma o A0 (over A0), Vb = diag(beta) V (over V), Kb = diag(beta exp(g)) K, -Wk = -(Ag Kb)
              and D_r for the chunk, into per-stage buffers; runs up to two chunks ahead of WG0.
  WG2 output  Pg = scale Gamma o (Q K^T); O = scale D (Q S) + Pg Vnew, out through one TMA store a chunk.
  WG3 loads   one warp: TMA tiles of q, k (shared by the GVA group), the v slice, A0; g and beta as
              scalars, clamped to the sequence's last token so gamma is right on a ragged tail.

Measured on the H200 (session 8, NOTES.md): correct on every case, but 0.80x rev 6's forward through
qwen35-fwd: the chain's own work fell to ~2 K cycles a chunk, while WG1's element-wise passes take ~4 K and
set the step. Not the default (`fused_impl="ws7"`, "ws8", "ws9" measure it).

Hand-offs are mbarriers: full/empty/prep_ready per input stage (parity (chunk // 2) % 2), s_ready/qs_done
and vn_ready/vn_done for the single s_sh and vn_sh buffers (parity chunk % 2). Ragged tails load whole
tiles as rev 5 does: rows past the end only reach invalid rows (Gamma, Pg are lower triangular), add nothing
to S (D_r = 0 there) and are never stored.
"""

import tilelang
import tilelang.language as T

CHUNK = 64
LOG2E = 1.4426950408889634
WG = 128
BLOCK_V = 64  # the chain's M: one wgmma row block of S^T per warpgroup

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}

# setmaxnreg budgets; every consumer asks for >= 128 (see fused_fwd_ws.py) and the sum x 128 fits 64 K.
NREG_CHAIN = 200
NREG_PREP = 160
NREG_OUT = 128
NREG_LOAD = 24


# Phases timed by the profile build (clock64 cycles of each warpgroup's first thread, summed over the
# chunks), in program order; the loads' phases are timed by the load warp's first lane.
PHASES = (
    ("cast S", "wait prep_ready", "issue U, S Wk", "wait qs_done", "S -> s_sh", "decay S", "U, S Wk done",
     "wait vn_done", "Vnew -> vn_sh", "D_r, cast", "gemm Vd K"),
    ("wait full", "D_r", "Ag", "Vb", "Kb", "gemm Wk", "-Wk -> wk_sh"),
    ("wait full", "gemm Q K^T", "Pg, d2 -> p_sh", "wait s_ready", "gemm Q S", "O *= d2", "wait vn_ready",
     "gemm Pg Vnew", "O store"),
    ("wait empty", "TMA issue", "g, beta loads"),
)
NUM_PHASES = max(len(p) for p in PHASES)


def fused_fwd_ws7_program(
    dk: int,
    dv: int,
    scale: float,
    dtype: str,
    use_initial_state: bool,
    state_v_first: bool = False,
    overlap: bool = False,
    profile: bool = False,
    lean_prep: bool = False,
):
    """TileLang program with fused_fwd_ws.fused_fwd_ws_program's signature and outputs (plain forward
    only: no profile, state-pass or state-store builds); the V-slice is always 64 wide.

    overlap=True (rev 8) issues the chain's first two GEMMs (U^T, then the state's product with -Wk^T)
    without waiting, and publishes bf16(S^T) to s_sh and decays S^T while they run: both were on the
    chain's critical path in rev 7 (the GEMMs read s_bf, which the store only reads too, and not S^T).

    profile=True is a measuring build with one more argument, prof [num_ctas, 4, NUM_PHASES] int64, where
    each warpgroup adds up the clock64 cycles it spends in each phase of PHASES.

    lean_prep=True (rev 9, with overlap) forms Kb's row factor -beta exp(g) once per row instead of per
    element (64 exp2 a thread less) and so gets -Wk from the GEMM without a negation pass."""
    C = CHUNK
    bv = BLOCK_V
    assert dv % bv == 0
    assert NREG_CHAIN + NREG_PREP + NREG_OUT + NREG_LOAD <= 512
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nv = dv // bv
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs")
    nh0 = T.dynamic("num_h0")
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
    def vnew_products(gemm, vb, ag, s_bf, wk, x):
        """x = U^T + S^T (-Wk)^T = Vb^T Ag^T + bf16(S^T) (-Wk)^T, with gemm = T.gemm or T.wgmma_gemm (no wait)."""
        gemm(vb, ag, x, transpose_A=True, transpose_B=True, clear_accum=True)
        gemm(s_bf, wk, x, transpose_B=True)

    @T.macro
    def kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, prof):
        with T.Kernel(ns * h_v * nv, threads=4 * WG) as (bid,):
            seq = T.alloc_var("int32", init=bid // (h_v * nv))
            bh = T.alloc_var("int32", init=(bid // nv) % h_v)
            v0 = T.alloc_var("int32", init=(bid % nv) * bv)
            bhg = T.alloc_var("int32", init=((bid // nv) % h_v) // (h_v // h_qk))
            start = T.alloc_var("int32", init=cu_seqlens[bid // (h_v * nv)])
            end = T.alloc_var("int32", init=cu_seqlens[bid // (h_v * nv) + 1])
            n_chunks = T.ceildiv(end - start, C)

            # input stages (A0 becomes Ag and V becomes Vb in place, by WG1)
            q_sh = T.alloc_shared((2, C, dk), dtype)
            k_sh = T.alloc_shared((2, C, dk), dtype)
            v_sh = T.alloc_shared((2, C, bv), dtype)
            a_sh = T.alloc_shared((2, C, C), dtype)
            g_sh = T.alloc_shared((2, C), acc)
            b_sh = T.alloc_shared((2, C), acc)
            # WG1's products, per stage
            wk_sh = T.alloc_shared((2, C, dk), dtype)  # -Wk
            dr_sh = T.alloc_shared((2, C), acc)  # D_r, zero past the sequence's end
            kb_sh = T.alloc_shared((C, dk), dtype)  # WG1's scratch: Kb
            kf_sh = T.alloc_shared((C,), acc)  # WG1's scratch: -beta exp(g) per row (lean_prep)
            # WG0 -> WG2
            s_sh = T.alloc_shared((bv, dk), dtype)  # bf16(S^T) at the chunk's start
            vn_sh = T.alloc_shared((bv, C), dtype)  # Vnew^T
            # WG2 private
            p_sh = T.alloc_shared((C, C), dtype)
            o_sh = T.alloc_shared((C, bv), dtype)
            d2_sh = T.alloc_shared((2, C), acc)

            full = T.alloc_barrier(arrive_count=[32, 32])
            empty = T.alloc_barrier(arrive_count=[3 * WG, 3 * WG])
            prep_ready = T.alloc_barrier(arrive_count=[WG, WG])
            s_ready = T.alloc_barrier(arrive_count=WG)
            qs_done = T.alloc_barrier(arrive_count=WG)
            vn_ready = T.alloc_barrier(arrive_count=WG)
            vn_done = T.alloc_barrier(arrive_count=WG)

            clk = T.alloc_local((1,), "int64")
            spent = T.alloc_local((NUM_PHASES,), "int64")
            if profile:
                for i in T.serial(NUM_PHASES):
                    spent[i] = 0
                clk[0] = T.call_extern("int64", "clock64")

            tx = T.get_thread_binding()

            if tx < WG:
                # ---- WG0: the state chain ----
                T.set_max_nreg(NREG_CHAIN, 1)
                s = T.alloc_fragment((bv, dk), acc)  # S^T
                s_bf = T.alloc_fragment((bv, dk), dtype)
                x = T.alloc_fragment((bv, C), acc)  # U^T, then Vnew^T, then Vnew^T D_r
                vd = T.alloc_fragment((bv, C), dtype)
                gam = T.alloc_local((1,), acc)
                if use_initial_state:
                    for i, j in T.Parallel(bv, dk):
                        if state_v_first:
                            s[i, j] = h0[seq, bh, v0 + i, j]
                        else:
                            s[i, j] = h0[seq, bh, j, v0 + i]
                else:
                    T.clear(s)
                for c in T.serial(n_chunks):
                    st = c % 2
                    if profile:
                        clk[0] = T.call_extern("int64", "clock64")
                    T.copy(s, s_bf)
                    tick(clk, spent, 0)
                    T.barrier_wait(prep_ready[st], (c // 2) % 2)  # also orders the reads of g_sh[st]
                    tick(clk, spent, 1)
                    if overlap:
                        vnew_products(T.wgmma_gemm, v_sh[st, :, :], a_sh[st, :, :], s_bf, wk_sh[st, :, :], x)
                    tick(clk, spent, 2)
                    if c > 0:
                        T.barrier_wait(qs_done, (c + 1) % 2)  # WG2 has read the last chunk's s_sh
                    tick(clk, spent, 3)
                    T.copy(s_bf, s_sh)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    tick(clk, spent, 4)
                    gam[0] = T.exp2(g_sh[st, C - 1] * LOG2E)
                    for i, j in T.Parallel(bv, dk):
                        s[i, j] = s[i, j] * gam[0]
                    tick(clk, spent, 5)
                    if overlap:
                        T.wait_wgmma(0)
                    else:
                        vnew_products(T.gemm, v_sh[st, :, :], a_sh[st, :, :], s_bf, wk_sh[st, :, :], x)
                    tick(clk, spent, 6)
                    if c > 0:
                        T.barrier_wait(vn_done, (c + 1) % 2)  # WG2 has read the last chunk's vn_sh
                    tick(clk, spent, 7)
                    T.copy(x, vn_sh)
                    T.fence_proxy_async()
                    T.barrier_arrive(vn_ready)
                    tick(clk, spent, 8)
                    for i, j in T.Parallel(bv, C):
                        x[i, j] = x[i, j] * dr_sh[st, j]
                    T.copy(x, vd)
                    tick(clk, spent, 9)
                    T.gemm(vd, k_sh[st, :, :], s)
                    T.barrier_arrive(empty[st])
                    tick(clk, spent, 10)
                for i, j in T.Parallel(bv, dk):
                    if state_v_first:
                        ht[seq, bh, v0 + i, j] = s[i, j]
                    else:
                        ht[seq, bh, j, v0 + i] = s[i, j]
                if profile and tx == 0:
                    for i in T.serial(NUM_PHASES):
                        prof[bid, 0, i] = spent[i]

            elif tx < 2 * WG:
                # ---- WG1: Ag, Vb, -Wk, D_r for the chunk ----
                T.set_max_nreg(NREG_PREP, 1)
                ag = T.alloc_fragment((C, C), acc)
                vb = T.alloc_fragment((C, bv), acc)
                w = T.alloc_fragment((C, dk), acc)  # Kb, then Wk
                for c in T.serial(n_chunks):
                    st = c % 2
                    t0 = start + c * C
                    if profile:
                        clk[0] = T.call_extern("int64", "clock64")
                    T.barrier_wait(full[st], (c // 2) % 2)
                    tick(clk, spent, 0)
                    for i in T.Parallel(C):
                        dr_sh[st, i] = T.if_then_else(
                            t0 + i < end, T.exp2((g_sh[st, C - 1] - g_sh[st, i]) * LOG2E), 0.0
                        )
                        if lean_prep:  # Kb's row factor, once per row, negated so the GEMM gives -Wk
                            kf_sh[i] = -b_sh[st, i] * T.exp2(g_sh[st, i] * LOG2E)
                    tick(clk, spent, 1)
                    # one operand at a time, so only one of them is live in registers
                    for i, j in T.Parallel(C, C):
                        ag[i, j] = T.if_then_else(
                            i >= j, T.exp2((g_sh[st, i] - g_sh[st, j]) * LOG2E), 0.0
                        ) * T.cast(a_sh[st, i, j], acc)
                    T.copy(ag, a_sh[st, :, :])
                    tick(clk, spent, 2)
                    for i, j in T.Parallel(C, bv):
                        vb[i, j] = T.cast(v_sh[st, i, j], acc) * b_sh[st, i]
                    T.copy(vb, v_sh[st, :, :])
                    tick(clk, spent, 3)
                    if lean_prep:
                        T.sync_threads(1, WG)  # kf_sh
                        for i, j in T.Parallel(C, dk):
                            w[i, j] = T.cast(k_sh[st, i, j], acc) * kf_sh[i]
                    else:
                        for i, j in T.Parallel(C, dk):
                            w[i, j] = T.cast(k_sh[st, i, j], acc) * (b_sh[st, i] * T.exp2(g_sh[st, i] * LOG2E))
                    T.copy(w, kb_sh)
                    T.fence_proxy_async()
                    T.sync_threads(1, WG)
                    tick(clk, spent, 4)
                    T.gemm(a_sh[st, :, :], kb_sh, w, clear_accum=True)
                    tick(clk, spent, 5)
                    if not lean_prep:
                        for i, j in T.Parallel(C, dk):
                            w[i, j] = -w[i, j]
                    T.copy(w, wk_sh[st, :, :])
                    T.fence_proxy_async()
                    T.barrier_arrive(prep_ready[st])
                    T.barrier_arrive(empty[st])
                    tick(clk, spent, 6)
                if profile and tx == WG:
                    for i in T.serial(NUM_PHASES):
                        prof[bid, 1, i] = spent[i]

            elif tx < 3 * WG:
                # ---- WG2: the output ----
                T.set_max_nreg(NREG_OUT, 1)
                p = T.alloc_fragment((C, C), acc)
                ob = T.alloc_fragment((C, bv), acc)
                for c in T.serial(n_chunks):
                    st = c % 2
                    t0 = start + c * C
                    if profile:
                        clk[0] = T.call_extern("int64", "clock64")
                    T.barrier_wait(full[st], (c // 2) % 2)
                    tick(clk, spent, 0)
                    T.gemm(q_sh[st, :, :], k_sh[st, :, :], p, transpose_B=True, clear_accum=True)
                    tick(clk, spent, 1)
                    for i, j in T.Parallel(C, C):
                        p[i, j] = T.if_then_else(
                            i >= j, T.exp2((g_sh[st, i] - g_sh[st, j]) * LOG2E) * scale, 0.0
                        ) * p[i, j]
                    for i in T.Parallel(C):
                        d2_sh[st, i] = T.exp2(g_sh[st, i] * LOG2E) * scale
                    T.copy(p, p_sh)
                    T.fence_proxy_async()
                    T.sync_threads(2, WG)
                    tick(clk, spent, 2)
                    T.barrier_wait(s_ready, c % 2)
                    tick(clk, spent, 3)
                    T.gemm(q_sh[st, :, :], s_sh, ob, transpose_B=True, clear_accum=True)
                    T.barrier_arrive(qs_done)
                    tick(clk, spent, 4)
                    for i, j in T.Parallel(C, bv):
                        ob[i, j] = ob[i, j] * d2_sh[st, i]
                    tick(clk, spent, 5)
                    T.barrier_wait(vn_ready, c % 2)
                    tick(clk, spent, 6)
                    T.gemm(p_sh, vn_sh, ob, transpose_B=True)
                    T.barrier_arrive(vn_done)
                    T.barrier_arrive(empty[st])
                    tick(clk, spent, 7)
                    if t0 + C <= end:
                        T.tma_store_wait()  # the previous chunk's TMA store has read o_sh
                        T.sync_threads(2, WG)
                        T.copy(ob, o_sh)
                        T.fence_proxy_async()
                        T.sync_threads(2, WG)
                        T.tma_copy(o_sh, o[0, t0 : t0 + C, bh, v0 : v0 + bv])
                    else:
                        for i, j in T.Parallel(C, bv):
                            if t0 + i < end:
                                o[0, t0 + i, bh, v0 + j] = T.cast(ob[i, j], dtype)
                    tick(clk, spent, 8)
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
                        if profile:
                            clk[0] = T.call_extern("int64", "clock64")
                        if c >= 2:
                            T.barrier_wait(empty[st], (c // 2 + 1) % 2)
                        tick(clk, spent, 0)
                        T.tma_copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh[st, :, :], barrier=full[st])
                        T.tma_copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh[st, :, :], barrier=full[st])
                        T.tma_copy(v[0, t0 : t0 + C, bh, v0 : v0 + bv], v_sh[st, :, :], barrier=full[st])
                        T.tma_copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh[st, :, :], barrier=full[st])
                        tick(clk, spent, 1)
                        for i in T.Parallel(C):
                            g_sh[st, i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
                            b_sh[st, i] = beta[0, T.min(t0 + i, end - 1), bh]
                        T.barrier_arrive(full[st])
                        tick(clk, spent, 2)
                    if profile and tx == 3 * WG:
                        for i in T.serial(NUM_PHASES):
                            prof[bid, 3, i] = spent[i]

    if profile:

        @T.prim_func
        def fused_fwd_ws7_profile(
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
            prof: T.Tensor((ns * h_v * nv, 4, NUM_PHASES), "int64"),
        ):
            kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, prof)

        return fused_fwd_ws7_profile

    @T.prim_func
    def fused_fwd_ws7(
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
        kernel_body(q, k, v, g_cumsum, beta, a0, h0, cu_seqlens, o, ht, None)

    return fused_fwd_ws7


fused_fwd_ws7_kernel = tilelang.jit(fused_fwd_ws7_program, pass_configs=PASS_CONFIGS)
