"""The warp-specialised fused backward (session 28; issue 6's gap): the fused walk's math in four roles.

One CTA per (sequence or CP piece, value head) walks the piece's chunks last to first, as the fused walk does
(bwd/chunk_grads.py, `fused`: rev 12's math and roundings), but its per-chunk work is split over three consumer
warpgroups and a producer warp that run concurrently (FlashQLA's arrangement, NOTES.md session 27, on our math):

  WG0 chain   dS' (the state gradient after the chunk) in fp32 registers for the whole walk. Per chunk: publishes
              bf16(dS') and <S, dS'>, then dS = exp(gamma) dS' + Q^T (scale D dO) (high and low bf16 parts)
              - K^T (D dW) once WG1 has D dW.
  WG1 K side  dVn = P^T dO + D_r (K dS'); dW~ = (Gamma o A0)^T dVn, dbeta's first part rowsum(W o dW~), dv =
              diag(beta) dW~ (stored), -D dW for the chain; <D dW, K S> (K S again); dk; dq (WG2's with dq_aside).
  WG2 A side  (A0's upper triangle cleared), P = scale Gamma o Q K^T, W = V - D (K S), Vn = Ag W, dQK and the
              pair terms from dO Vn^T; dAg from dVn W^T; the A0 path (dKKt, dbeta's second part); dg and dbeta.
  WG3 loads   one warp: the next chunk's tiles by TMA once every consumer is done with this chunk's, g and beta.

Every input tile is single-buffered; the walk's first chunk (a sequence's last, possibly partial) is loaded by
all threads, masked, before the roles split, so every later chunk is whole and comes by TMA. Hand-offs are
mbarriers, each completing once a chunk (parity = the chunk's step % 2): ds_ready (WG0), a_ready and dq_ready
(WG2), dvn_ready, dwd_ready and k_done (WG1; k_done: x, <D dW, KS>, the column sums and D scale <dO, QS> for
dg), full (the producer) and inputs_free (all three consumers). The early-release schedule (ws3, below) adds
full_b and early_free (two load groups), sdo_free (WG0), pt_ready and pt_read (WG1) and dg_done (WG2), and
changes what the shared tiles carry (its docstring); this paragraph and the next describe ws and ws2.

Why single buffers and hand-off tiles can be reused: every consumer waits for `full` of step it + 1 before it
writes anything of that step, and `full` of step it + 1 follows `inputs_free` of step it, which each consumer
arrives at only after its last read of step it. Within a step, three buffers carry more than one value, in an
order the hand-offs fix: V's tile takes D_r Vn (WG2, after its own W pass read V), Vn's takes dVn (WG1, after
a_ready: WG2 has read Vn), P's takes T and then dKKt (WG2, after dvn_ready: WG1 has read P). Shared memory:
225.8 KiB dynamic, under the 231424 B a launch allows beside the mbarriers (static, padded to 1 KiB;
tests/kernels/test_compile.py checks it). dg's column sums of the pair terms need no cross-warp reduction
(aside_dag says why), and the named barriers avoid the ids TileLang takes for its own.

Measured (session 28, H100): every float64 case passes; 1.37-1.45x the staged backward where the fused path runs
without CP (NOTES.md).

cpu_debug=True runs the same phase macros one after another in one thread of TileLang's C backend (GEMMs as
loops, fp32 in and out, mbarriers and role branches dropped), in an order the hand-offs allow, so
tests/kernels/test_bwd_chunk_grads_cpu.py checks the math and the buffer reuse against float64; what it cannot
check is the GPU's concurrency (the hand-off protocol above).
"""

import tilelang
import tilelang.language as T

from ..fwd.fused_fwd import CHUNK, LOG2E, PASS_CONFIGS
from .tl_common import build_helpers

WG = 128
# setmaxnreg budgets (x 128 threads each <= the 64 K register file, which the kernel's 128 registers at entry x 512
# threads fill exactly: test_compile checks the 128, or the setmaxnreg.inc would wait forever). The chain holds dS'
# (128 fp32 a thread); of the splits tried (session 28: 168/160/152, 160/152/168, 152/152/176, ...) this one spills
# least (172/216 B, 59 spill instructions a chunk in WG2) and keeps every wgmma unserialised
NREG_CHAIN = 160
NREG_KSIDE = 160
NREG_ASIDE = 160
NREG_LOAD = 32  # the g / beta / gate loads' 64-bit addresses spilled at 24
# Phases of the profile build, per consumer warpgroup, in program order (each ends at a tick).
PHASES = (
    ("wait full", "publish dS', <S, dS'>", "exp(gamma) dS' + Q^T (scale D dO)", "wait dwd_ready", "- K^T (D dW)"),
    ("wait full", "wait a_ready", "P^T dO, colsum", "wait ds_ready", "K dS', dVn", "dW~, dbeta, dv, -D dW",
     "K S, row_b", "dk's D_r Vn dS'^T, x", "wait dq_ready", "dk's rest, store", "dq, store"),
    ("wait full", "P, W, Vn, dO Vn^T", "wait dvn_ready", "dAg, pair rows", "A0 path", "wait ds_ready, k_done",
     "dg, dbeta"),
)  # fmt: skip
# dq_aside=True ($QLA_BWD_FUSED=ws2): dq in WG2 after the A0 path, beside WG1's dk
PHASES_DQ_ASIDE = (
    PHASES[0],
    PHASES[1][:10],
    PHASES[2][:5] + ("dq, store", "wait ds_ready, k_done", "dg, dbeta"),
)
# early_release=True ($QLA_BWD_FUSED=ws3)
PHASES_EARLY = (
    ("wait full", "publish dS', <S, dS'>", "exp(gamma) dS' + Q^T (scale D dO)", "wait dwd_ready", "- K^T (D dW)"),
    ("wait full", "K Q^T, P^T", "wait ds_ready", "K dS', dVn, wait sdo_free", "dW~, dv, -D dW", "wait a_ready",
     "colsums, dq, store", "dk's first products, row_b, x", "wait dg_done, publish", "wait dq_ready",
     "dKKt K, dKKt^T K, store"),
    ("wait full", "W, Vn, wait pt_ready, dO Vn^T", "wait dvn_ready", "dAg, pair rows", "wait pt_read", "A0 path",
     "wait ds_ready, release", "wait k_done", "dg, dbeta"),
)  # fmt: skip
NUM_PHASES = max(len(p) for table in (PHASES, PHASES_DQ_ASIDE, PHASES_EARLY) for p in table)


def phases(dq_aside: bool, early_release: bool = False) -> tuple[tuple[str, ...], ...]:
    """The profile build's phase names per consumer warpgroup."""
    return PHASES_EARLY if early_release else PHASES_DQ_ASIDE if dq_aside else PHASES


# named barriers within one warpgroup (0 is __syncthreads)
# TileLang takes 1 and 2 for cross-warp reductions and one id per thread range for its own syncs (3-6 here: the
# three warpgroups and the producer warp); a shared id would join two roles' barriers (test_compile checks)
BAR_CHAIN, BAR_KSIDE, BAR_ASIDE = 12, 13, 14
# WG2's Gamma as a [C, C] fp32 fragment, evaluated once a chunk, instead of at each of its four gated passes: 15 %
# fewer of WG2's instructions a chunk (3.0 K against 3.6 K) but 146-218 spill instructions in its loop at 152-160
# registers (session 28's builds), so off until a GPU profile says which costs more
GAMMA_IN_REGISTERS = False


def bwd_fused_ws_program(
    dk: int,
    dv: int,
    scale: float,
    dtype: str,
    cpu_debug: bool = False,
    profile: bool = False,
    dq_aside: bool = False,
    early_release: bool = False,
):
    """TileLang program with the fused walk's signature: (q, k, v, g_cumsum, beta, A0, dO, states, ds_slots
    [P,H_v,K,V] fp32 (each piece's end gradient in, its start gradient out), cu_seqlens of the pieces [P+1],
    chunk_offsets [P+1], dq_v, dk_v [1,T,H_v,K] fp32, dbeta, dg [1,T,H_v] fp32, dv [1,T,H_v,V]).

    profile=True (a measuring build, never what the backward runs) takes one more argument, prof [P * H_v, 3,
    NUM_PHASES] int64: each consumer warpgroup's first thread sums the clock64 cycles of each phase of
    phases(dq_aside)[role] over the CTA's chunks (no barrier added: a phase that waits shows as its wait).

    dq_aside=True ($QLA_BWD_FUSED=ws2) forms dq in WG2 after the A0 path (its [C, V] accumulator as the row sum's
    scratch), beside WG1's dk, instead of in WG1 after dk: a shorter tail for the busier A side. Same math.

    early_release=True ($QLA_BWD_FUSED=ws3, session 29) is the early-release schedule: WG1 forms its own P^T (K Q^T,
    into P's tile until pt_read), so dVn, dW~ and -D dW no longer wait for WG2's forward part; dVn goes into the tile of
    WG0's scale D dO parts (sdo_free: WG0 is done with them); dq comes right after a_ready, dk's (D dW) S^T and
    dQK^T Q with its first product (<D dW, K S> from (D dW) S^T: no K S again); S, Q, V, dO and A0 (`full`) are
    released (early_free) once those have read them and load under the chunk's tail, K and the gates (full_b) after
    it; WG2's dg of a chunk runs after its release (dg_done guards WG1's next row terms); WG2 forms no P: it reads
    P transposed from WG1's P^T tile after pt_ready. Same math; dVn's two products summed in the other order, x as
    a difference of two row sums."""
    assert not (profile and cpu_debug)
    assert not (dq_aside and early_release)
    assert not (GAMMA_IN_REGISTERS and early_release)  # ws3's A side evaluates no P pass to fill gm in
    early = early_release
    assert NREG_CHAIN + NREG_KSIDE + NREG_ASIDE + NREG_LOAD <= 512
    assert dk == dv == 2 * CHUNK
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_pieces_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"
    mm, alloc_sh, alloc_acc = build_helpers(cpu_debug)

    def alloc_frag(shape, dt):
        """A register fragment of dt on the GPU (a GEMM's register operand); a static shared buffer on the CPU."""
        return alloc_sh(shape, dt) if cpu_debug else T.alloc_fragment(shape, dt)

    @T.macro
    def wg_sync(bar_id):
        """This warpgroup's shared-memory writes are visible to its own next GEMM (async proxy) and threads."""
        if not cpu_debug:
            T.fence_proxy_async()
            T.sync_threads(bar_id, WG)

    @T.macro
    def arrive(bar):
        if not cpu_debug:
            T.fence_proxy_async()  # generic writes before another role's wgmma or the next TMA load
            T.barrier_arrive(bar)

    @T.macro
    def wait(bar, parity):
        if not cpu_debug:
            T.barrier_wait(bar, parity)

    @T.macro
    def row_sum(src, red):
        """red[i] = sum_j src[i, j] (src a fragment, red a [C] fragment: registers, each row's sum in the threads
        that hold the row; shared buffers on the CPU)."""
        if cpu_debug:
            for a in T.Parallel(src.shape[0]):
                red[a] = 0.0
                for b in T.serial(src.shape[1]):
                    red[a] = red[a] + src[a, b]
        else:
            T.reduce_sum(src, red, dim=1)

    @T.macro
    def gates_r(g_sh, drf, t0, end):
        """drf[i] = D_r,i = exp(g_last - g_i), 0 past the sequence's end: a [C] fragment (each row's value in the
        threads that hold the row), no shared vector for it."""
        for i in T.Parallel(C):
            drf[i] = T.if_then_else(t0 + i < end, T.exp2((g_sh[C - 1] - g_sh[i]) * LOG2E), 0.0)

    def gam(g_sh, i, j):
        """Gamma_ij = exp(g_i - g_j) on i >= j, else 0."""
        return T.if_then_else(i >= j, T.exp2((g_sh[i] - g_sh[j]) * LOG2E), 0.0)

    def gmv(gm, g_sh, i, j):
        """Gamma_ij for WG2: from its register copy (GAMMA_IN_REGISTERS) or evaluated again."""
        return gm[i, j] if GAMMA_IN_REGISTERS else gam(g_sh, i, j)

    @T.macro
    def load_masked(q, k, v, a0, grad_o, states, g_cumsum, beta, q_sh, k_sh, v_sh, a_sh, do_sh, s_sh, g_sh, b_sh,
                    d_sh, bc, t0, end, bh, bhg):  # fmt: skip
        """A chunk's tiles by element loads, rows at or past `end` as zero (g clamped to the last valid token's),
        and its gates d = exp(g)."""
        for i, j in T.Parallel(C, dk):
            q_sh[i, j] = T.if_then_else(t0 + i < end, q[0, T.min(t0 + i, end - 1), bhg, j], T.cast(0, dtype))
            k_sh[i, j] = T.if_then_else(t0 + i < end, k[0, T.min(t0 + i, end - 1), bhg, j], T.cast(0, dtype))
        for i, j in T.Parallel(C, dv):
            v_sh[i, j] = T.if_then_else(t0 + i < end, v[0, T.min(t0 + i, end - 1), bh, j], T.cast(0, dtype))
            do_sh[i, j] = T.if_then_else(t0 + i < end, grad_o[0, T.min(t0 + i, end - 1), bh, j], T.cast(0, dtype))
        for i, j in T.Parallel(C, C):
            a_sh[i, j] = T.if_then_else(t0 + i < end, a0[0, T.min(t0 + i, end - 1), bh, j], T.cast(0, dtype))
        for i, j in T.Parallel(dk, dv):
            s_sh[i, j] = states[bc, bh, i, j]
        for i in T.Parallel(C):
            g_sh[i] = g_cumsum[0, T.min(t0 + i, end - 1), bh]
            b_sh[i] = T.if_then_else(t0 + i < end, beta[0, T.min(t0 + i, end - 1), bh], 0.0)
            d_sh[i] = T.exp2(g_cumsum[0, T.min(t0 + i, end - 1), bh] * LOG2E)

    # ---- WG0, the chain ----
    @T.macro
    def chain_publish(sds, ds_sh, s_sh, part_sh, part):
        """bf16(dS') for the other roles; <S, dS'> as one partial sum per warp (part_sh, summed by WG2's dg)."""
        T.copy(sds, ds_sh)
        if cpu_debug:
            part_sh[0] = 0.0
            for i, j in T.Parallel(dk, dv):
                part_sh[0] = part_sh[0] + sds[i, j] * T.cast(s_sh[i, j], acc)
            for i in T.serial(3):
                part_sh[i + 1] = 0.0
        else:
            part[0] = 0.0
            for i, j in T.Parallel(dk, dv):
                part[0] = part[0] + sds[i, j] * T.cast(s_sh[i, j], acc)
            part[0] = T.warp_reduce_sum(part[0])
            if T.get_thread_binding() % 32 == 0:
                part_sh[(T.get_thread_binding() % WG) // 32] = part[0]

    @T.macro
    def chain_q_terms(sds, q_sh, do_sh, d_sh, sdo_sh):
        """dS' <- exp(gamma) dS' + Q^T (scale D dO), scale D dO as two bf16 parts (stage 1 rev 4's rounding)
        through one buffer in turn."""
        for i, j in T.Parallel(dk, dv):
            sds[i, j] = d_sh[C - 1] * sds[i, j]
        for i, j in T.Parallel(C, dv):
            sdo_sh[i, j] = T.cast(scale * d_sh[i] * T.cast(do_sh[i, j], acc), dtype)
        wg_sync(BAR_CHAIN)
        mm(q_sh, sdo_sh, sds, transpose_a=True, clear=False)
        wg_sync(BAR_CHAIN)  # every warp's GEMM has read the high part
        for i, j in T.Parallel(C, dv):
            sdo_sh[i, j] = T.cast(
                scale * d_sh[i] * T.cast(do_sh[i, j], acc)
                - T.cast(T.cast(scale * d_sh[i] * T.cast(do_sh[i, j], acc), dtype), acc),
                dtype,
            )
        wg_sync(BAR_CHAIN)
        mm(q_sh, sdo_sh, sds, transpose_a=True, clear=False)

    # ---- WG2, the A side ----
    @T.macro
    def aside_forward(q_sh, k_sh, v_sh, a_sh, do_sh, s_sh, g_sh, b_sh, d_sh, p_sh, w_sh, vn_sh, dqk_sh, cc, cv, ag,
                      pr, gm, cb, drf, t0, end):  # fmt: skip
        """A0's upper triangle cleared; Gamma once into gm (registers, for the chunk's four gated passes); P; W;
        Vn = Ag W (Ag a register operand); D_r Vn into V's tile; dO Vn^T: dQK and the pair terms' first part
        P o dO Vn^T (pr, kept for dvn_ready). The [C, C] bf16 tiles leave through cb by fragment copies (stmatrix),
        not element stores."""
        # through registers: in place, TileLang put a warpgroup barrier in each of the pass's unrolled steps
        T.copy(a_sh, cb)
        for i, j in T.Parallel(C, C):
            cb[i, j] = T.if_then_else(i >= j, cb[i, j], T.cast(0, dtype))
        T.copy(cb, a_sh)
        if not early:  # ws3: P comes from the K side's P^T tile (aside_dqk3)
            mm(q_sh, k_sh, cc, transpose_b=True)
            for i, j in T.Parallel(C, C):
                if GAMMA_IN_REGISTERS:
                    gm[i, j] = gam(g_sh, i, j)
                cb[i, j] = T.cast(scale * gmv(gm, g_sh, i, j) * cc[i, j], dtype)
            T.copy(cb, p_sh)
        mm(k_sh, s_sh, cv)
        for i, j in T.Parallel(C, dv):
            w_sh[i, j] = T.cast(T.cast(v_sh[i, j], acc) - d_sh[i] * cv[i, j], dtype)
        for i, j in T.Parallel(C, C):
            ag[i, j] = T.cast(T.cast(a_sh[i, j], acc) * gmv(gm, g_sh, i, j) * b_sh[j], dtype)
        wg_sync(BAR_ASIDE)  # W and A0's cleared triangle; every read of V is done
        mm(ag, w_sh, cv)
        T.copy(cv, vn_sh)
        gates_r(g_sh, drf, t0, end)
        for i, j in T.Parallel(C, dv):
            cv[i, j] = drf[i] * cv[i, j]
        T.copy(cv, v_sh)  # D_r Vn, dk's operand (WG1)
        wg_sync(BAR_ASIDE)
        if not early:  # ws3: aside_dqk3, after pt_ready
            mm(do_sh, vn_sh, cc, transpose_b=True)
            for i, j in T.Parallel(C, C):
                pr[i, j] = T.cast(cb[i, j], acc) * cc[i, j]  # cb: P as rounded
                cb[i, j] = T.cast(scale * gmv(gm, g_sh, i, j) * cc[i, j], dtype)
            T.copy(cb, dqk_sh)

    @T.macro
    def aside_dqk3(do_sh, vn_sh, p_sh, g_sh, dqk_sh, cc, pr, gm, cb):
        """ws3's end of aside_forward: dO Vn^T -> dQK and the pair terms' first part P o dO Vn^T, P read transposed
        from the K side's P^T tile (after pt_ready): no Q K^T and no gate pass for P on the A side."""
        mm(do_sh, vn_sh, cc, transpose_b=True)
        for i, j in T.Parallel(C, C):
            pr[i, j] = T.cast(p_sh[j, i], acc) * cc[i, j]
            cb[i, j] = T.cast(scale * gmv(gm, g_sh, i, j) * cc[i, j], dtype)
        T.copy(cb, dqk_sh)

    @T.macro
    def aside_dag(vn_sh, w_sh, a_sh, g_sh, b_sh, da0_sh, cc, pr, gm, cb, red_p):
        """dAg = (dVn W^T) o L (dVn in Vn's tile): the pair terms' second part; dA0 = dAg o Gamma diag(beta);
        the pair terms' row sums. Their column sums need no cross-warp reduction: colsum(P o dO Vn^T)_j =
        <Vn, P^T dO>_j and colsum(dAg o Agb)_j = beta_j <W, dW~>_j, both WG1's (kside_pt_do, kside_dw)."""
        mm(vn_sh, w_sh, cc, transpose_b=True)
        for i, j in T.Parallel(C, C):
            cc[i, j] = T.if_then_else(i >= j, cc[i, j] * gmv(gm, g_sh, i, j) * b_sh[j], 0.0)  # dA0 in fp32
            pr[i, j] = pr[i, j] + cc[i, j] * T.cast(a_sh[i, j], acc)
            cb[i, j] = T.cast(cc[i, j], dtype)
        T.copy(cb, da0_sh)
        row_sum(pr, red_p)

    @T.macro
    def aside_a0_path(a_sh, k_sh, b_sh, da0_sh, p_sh, cc, cc2, cb, red_a):
        """dM = -A0^T dA0 A0^T, dL = StrictLower(dM), dKKt = diag(beta) dL (into P's tile: dk's operand, WG1), dbeta's
        second part rowsum(dL o K K^T)."""
        mm(a_sh, da0_sh, cc, transpose_a=True)
        for i, j in T.Parallel(C, C):
            cb[i, j] = T.cast(cc[i, j], dtype)  # T
        T.copy(cb, p_sh)
        wg_sync(BAR_ASIDE)
        mm(p_sh, a_sh, cc, transpose_b=True)
        mm(k_sh, k_sh, cc2, transpose_b=True)
        wg_sync(BAR_ASIDE)  # every warp's products have read T
        for i, j in T.Parallel(C, C):
            cc[i, j] = T.if_then_else(i > j, -cc[i, j], 0.0)
            cb[i, j] = T.cast(b_sh[i] * cc[i, j], dtype)  # dKKt
            cc2[i, j] = cc[i, j] * cc2[i, j]
        T.copy(cb, p_sh)
        row_sum(cc2, red_a)

    @T.macro
    def dq_products(do_sh, s_sh, q_sh, k_sh, d_sh, dqk_sh, ck, tmp, red_q, dq_v, t0, end, bh):
        """dq = scale D (dO S^T) + dQK K, with D_i scale <dO, QS>_i = rowsum(Q o the first product) (rev 12). WG1's
        by default, after dk (its accumulator again): the A side is the busiest role, and this pair of products
        held 128 of its registers; WG2's with dq_aside."""
        mm(do_sh, s_sh, ck, transpose_b=True)
        for i, j in T.Parallel(C, dk):
            ck[i, j] = scale * d_sh[i] * ck[i, j]
            tmp[i, j] = ck[i, j] * T.cast(q_sh[i, j], acc)
        row_sum(tmp, red_q)
        mm(dqk_sh, k_sh, ck, clear=False)
        for i, j in T.Parallel(C, dk):
            if t0 + i < end:
                dq_v[0, t0 + i, bh, j] = ck[i, j]

    @T.macro
    def aside_dg(d_sh, part_sh, x_sh, comb_sh, cola_sh, dgc_sh, red_p, red_a, red_q, tot, dg, dbeta, t0, end, bh):
        """dgc_i = D_i scale <dO, QS>_i - <D dW, KS>_i - x_i + rowsum(pair)_i - colsum(pair)_i (WG1's comb_sh has all
        but the pair rows, red_p, and with dq_aside D scale <dO, QS>, red_q); dg_i = the sum of dgc_j over the valid
        j >= i, plus dgamma = sum_j x_j + exp(gamma) <S, dS'> (every row); dbeta = WG1's part + red_a."""
        for i in T.Parallel(C):  # the threads holding row i's sums write it (the same value each)
            if dq_aside:
                dgc_sh[i] = T.if_then_else(t0 + i < end, comb_sh[i] + red_p[i] + red_q[i], 0.0)
            else:
                dgc_sh[i] = T.if_then_else(t0 + i < end, comb_sh[i] + red_p[i], 0.0)
            if t0 + i < end:
                dbeta[0, t0 + i, bh] = cola_sh[i] + red_a[i]
        wg_sync(BAR_ASIDE)
        for i in T.Parallel(C):
            tot[0] = (part_sh[0] + part_sh[1] + part_sh[2] + part_sh[3]) * d_sh[C - 1]
            for j in T.serial(C):
                tot[0] = tot[0] + x_sh[j] + T.if_then_else(j >= i, dgc_sh[j], 0.0)
            if t0 + i < end:
                dg[0, t0 + i, bh] = tot[0]

    # ---- WG1, the K side ----
    @T.macro
    def kside_pt_do(p_sh, do_sh, vn_sh, u, tmp, red_p):
        """P^T dO, dVn's state-free part, before WG1 waits for dS'; colsum(P o dO Vn^T)_j = <Vn, P^T dO>_j for dg."""
        mm(p_sh, do_sh, u, transpose_a=True)
        for i, j in T.Parallel(C, dv):
            tmp[i, j] = u[i, j] * T.cast(vn_sh[i, j], acc)
        row_sum(tmp, red_p)

    @T.macro
    def kside_dvn_state(k_sh, ds_sh, g_sh, vn_sh, u, cv, drf, t0, end):
        """dVn = P^T dO + D_r (K dS') into Vn's tile (WG2 has read Vn by a_ready; this warpgroup by the sync), by a
        fragment copy (stmatrix; the element stores had a warpgroup barrier in each unrolled step)."""
        mm(k_sh, ds_sh, cv)
        gates_r(g_sh, drf, t0, end)
        for i, j in T.Parallel(C, dv):
            cv[i, j] = drf[i] * cv[i, j] + u[i, j]
        wg_sync(BAR_KSIDE)
        T.copy(cv, vn_sh)

    @T.macro
    def kside_dw(a_sh, g_sh, b_sh, d_sh, vn_sh, w_sh, ndwd_sh, agt, cv, tmp, red_a, dv_out, t0, end, bh):
        """dW~ = (Gamma o A0)^T dVn ((.)^T a register operand); dbeta's first part rowsum(W o dW~); dv = diag(beta)
        dW~ (stored); -D dW for the chain and dk (a fragment copy)."""
        for i, j in T.Parallel(C, C):
            agt[i, j] = T.cast(T.cast(a_sh[j, i], acc) * gam(g_sh, j, i), dtype)
        mm(agt, vn_sh, cv)
        for i, j in T.Parallel(C, dv):
            tmp[i, j] = cv[i, j] * T.cast(w_sh[i, j], acc)
        row_sum(tmp, red_a)
        for i, j in T.Parallel(C, dv):
            cv[i, j] = b_sh[i] * cv[i, j]
        for i, j in T.Parallel(C, dv):
            if t0 + i < end:
                dv_out[0, t0 + i, bh, j] = T.cast(cv[i, j], dtype)
        for i, j in T.Parallel(C, dv):
            cv[i, j] = -d_sh[i] * cv[i, j]
        T.copy(cv, ndwd_sh)

    @T.macro
    def kside_rowb(k_sh, s_sh, ndwd_sh, cv, red_b):
        """-<D dW, K S>_i (K S again: WG2's is gone)."""
        mm(k_sh, s_sh, cv)
        for i, j in T.Parallel(C, dv):
            cv[i, j] = cv[i, j] * T.cast(ndwd_sh[i, j], acc)
        row_sum(cv, red_b)

    @T.macro
    def kside_dk_state(v_sh, ds_sh, k_sh, ck, tmp, red_x):
        """dk's first product D_r Vn dS'^T (D_r Vn in V's tile); x_i = rowsum(K o it)."""
        mm(v_sh, ds_sh, ck, transpose_b=True)
        for i, j in T.Parallel(C, dk):
            tmp[i, j] = ck[i, j] * T.cast(k_sh[i, j], acc)
        row_sum(tmp, red_x)

    @T.macro
    def kside_publish(b_sh, comb_sh, x_sh, cola_sh, red_b, red_x, red_p, red_a, red_q):
        """dg's and dbeta's row terms of this warpgroup, for WG2 (k_done): comb = <D dW, KS> terms - x - colsum(pair)
        (+ D scale <dO, QS> unless dq_aside), x, and dbeta's first part."""
        for i in T.Parallel(C):  # the threads holding row i's sums write it (the same value each)
            if dq_aside:
                comb_sh[i] = red_b[i] - red_x[i] - red_p[i] - b_sh[i] * red_a[i]
            else:
                comb_sh[i] = red_q[i] + red_b[i] - red_x[i] - red_p[i] - b_sh[i] * red_a[i]
            x_sh[i] = red_x[i]
            cola_sh[i] = red_a[i]

    @T.macro
    def kside_dk_rest(dqk_sh, q_sh, p_sh, k_sh, ndwd_sh, s_sh, ck, dk_v, t0, end, bh):
        """dk += dQK^T Q + dKKt K + dKKt^T K - (D dW) S^T (dKKt in P's tile)."""
        mm(dqk_sh, q_sh, ck, transpose_a=True, clear=False)
        mm(p_sh, k_sh, ck, clear=False)
        mm(p_sh, k_sh, ck, transpose_a=True, clear=False)
        mm(ndwd_sh, s_sh, ck, transpose_b=True, clear=False)
        for i, j in T.Parallel(C, dk):
            if t0 + i < end:
                dk_v[0, t0 + i, bh, j] = ck[i, j]

    # ---- ws3's K side (early_release): its own P^T, dVn before WG2's forward part, dq before dk ----
    @T.macro
    def kside_pt3(k_sh, q_sh, g_sh, p_sh, cq, ptb):
        """P^T = scale Gamma^T o (K Q^T) into P's tile (WG1's own: no wait for WG2's P; WG2 writes T there only
        after pt_read)."""
        mm(k_sh, q_sh, cq, transpose_b=True)
        for i, j in T.Parallel(C, C):
            ptb[i, j] = T.cast(scale * gam(g_sh, j, i) * cq[i, j], dtype)
        T.copy(ptb, p_sh)

    @T.macro
    def kside_dvn3(k_sh, ds_sh, do_sh, g_sh, p_sh, cv, drf, t0, end):
        """dVn = D_r (K dS') + P^T dO in cv (P^T dO accumulated onto the gated state product)."""
        mm(k_sh, ds_sh, cv)
        gates_r(g_sh, drf, t0, end)
        for i, j in T.Parallel(C, dv):
            cv[i, j] = drf[i] * cv[i, j]
        mm(p_sh, do_sh, cv, clear=False)

    @T.macro
    def kside_dw3(a_sh, g_sh, b_sh, d_sh, dvn_sh, ndwd_sh, agt, cv, nd, dv_out, t0, end, bh):
        """dW~ = (Gamma o A0)^T dVn in cv (kept for dbeta's first part after a_ready); dv = diag(beta) dW~ (stored);
        -D dW for the chain and dk. A0's upper triangle is selected away, not multiplied by 0: WG2 may clear it
        concurrently (the same values below it)."""
        for i, j in T.Parallel(C, C):  # selects of plain values, the exp2 on a masked argument: no branch
            agt[i, j] = T.cast(T.if_then_else(j >= i, T.cast(a_sh[j, i], acc), 0.0)
                               * T.exp2(T.if_then_else(j >= i, g_sh[j] - g_sh[i], 0.0) * LOG2E), dtype)  # fmt: skip
        mm(agt, dvn_sh, cv)
        for i, j in T.Parallel(C, dv):
            if t0 + i < end:
                dv_out[0, t0 + i, bh, j] = T.cast(b_sh[i] * cv[i, j], dtype)
        for i, j in T.Parallel(C, dv):
            nd[i, j] = T.cast(-d_sh[i] * (b_sh[i] * cv[i, j]), dtype)
        T.copy(nd, ndwd_sh)

    @T.macro
    def kside_colsums3(w_sh, vn_sh, do_sh, p_sh, cv, u, red_a, red_p):
        """After a_ready: dbeta's first part rowsum(W o dW~) and colsum(P o dO Vn^T)_j = <Vn, P^T dO>_j (P^T dO
        again: dVn holds it summed with the state term)."""
        for i, j in T.Parallel(C, dv):
            cv[i, j] = cv[i, j] * T.cast(w_sh[i, j], acc)
        row_sum(cv, red_a)
        mm(p_sh, do_sh, u)
        for i, j in T.Parallel(C, dv):
            u[i, j] = u[i, j] * T.cast(vn_sh[i, j], acc)
        row_sum(u, red_p)

    @T.macro
    def kside_dk_first3(v_sh, ds_sh, k_sh, ndwd_sh, s_sh, dqk_sh, q_sh, ck, u, red_b, red_x):
        """dk's first products, and the row terms from them without K S again: <-D dW, K S>_i = rowsum(K o (-D dW)
        S^T) after the first product, then x_i = rowsum(K o (that + D_r Vn dS'^T)) - that sum; then dQK^T Q."""
        mm(ndwd_sh, s_sh, ck, transpose_b=True)
        for i, j in T.Parallel(C, dk):
            u[i, j] = ck[i, j] * T.cast(k_sh[i, j], acc)
        row_sum(u, red_b)
        mm(v_sh, ds_sh, ck, transpose_b=True, clear=False)
        for i, j in T.Parallel(C, dk):
            u[i, j] = ck[i, j] * T.cast(k_sh[i, j], acc)
        row_sum(u, red_x)
        for i in T.Parallel(C):
            red_x[i] = red_x[i] - red_b[i]
        mm(dqk_sh, q_sh, ck, transpose_a=True, clear=False)

    @T.macro
    def kside_dk_rest3(p_sh, k_sh, ck, dk_v, t0, end, bh):
        """dk += dKKt K + dKKt^T K (- (D dW) S^T and dQK^T Q came with dk's first product: the step's tail reads
        no tile but K's)."""
        mm(p_sh, k_sh, ck, clear=False)
        mm(p_sh, k_sh, ck, transpose_a=True, clear=False)
        for i, j in T.Parallel(C, dk):
            if t0 + i < end:
                dk_v[0, t0 + i, bh, j] = ck[i, j]

    @T.macro
    def aside_dg3(pd, x_sh, comb_sh, cola_sh, dgc_sh, red_p, red_a, tot, dg, dbeta, t0, end, bh):
        """aside_dg with exp(gamma) <S, dS'> read before the release (pd): the gates' and WG0's buffers may hold the
        next chunk's by now."""
        for i in T.Parallel(C):
            dgc_sh[i] = T.if_then_else(t0 + i < end, comb_sh[i] + red_p[i], 0.0)
            if t0 + i < end:
                dbeta[0, t0 + i, bh] = cola_sh[i] + red_a[i]
        wg_sync(BAR_ASIDE)
        for i in T.Parallel(C):
            tot[0] = pd[0]
            for j in T.serial(C):
                tot[0] = tot[0] + x_sh[j] + T.if_then_else(j >= i, dgc_sh[j], 0.0)
            if t0 + i < end:
                dg[0, t0 + i, bh] = tot[0]

    @T.macro
    def tick_start(clk, spent):
        if profile:
            for i in T.serial(NUM_PHASES):
                spent[i] = 0
            clk[0] = T.call_extern("int64", "clock64")

    @T.macro
    def tick(clk, spent, phase):
        """End of a phase: the cycles since the last tick go to spent[phase] (profile builds only)."""
        if profile:
            now = T.call_extern("int64", "clock64")
            spent[phase] = spent[phase] + (now - clk[0])
            clk[0] = now

    @T.macro
    def tick_store(prof, bid, role, spent):
        """The warpgroup's first thread writes its phase sums (profile builds only)."""
        if profile:  # noqa: SIM102 (a Python flag around a TIR condition)
            if T.get_thread_binding() % WG == 0:
                for i in T.serial(NUM_PHASES):
                    prof[bid, role, i] = spent[i]

    @T.macro
    def body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_slots, cu_seqlens, chunk_offsets, dq_v, dk_v, dbeta, dg,
             dv_out, prof):  # fmt: skip
        with T.Kernel((ns - 1) * h_v, threads=4 * WG) as (bid,):
            piece = T.alloc_var("int32", init=bid // h_v)
            bh = T.alloc_var("int32", init=bid % h_v)
            bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
            end = T.alloc_var("int32", init=cu_seqlens[bid // h_v + 1])
            n_iter = T.alloc_var("int32", init=T.ceildiv(cu_seqlens[bid // h_v + 1] - cu_seqlens[bid // h_v], C))
            c_last = T.alloc_var("int32", init=chunk_offsets[bid // h_v] + n_iter - 1)
            t_last = T.alloc_var("int32", init=cu_seqlens[bid // h_v] + (n_iter - 1) * C)

            # inputs (single-buffered; V's tile later holds D_r Vn)
            q_sh = alloc_sh((C, dk), dtype)
            k_sh = alloc_sh((C, dk), dtype)
            v_sh = alloc_sh((C, dv), dtype)
            do_sh = alloc_sh((C, dv), dtype)
            a_sh = alloc_sh((C, C), dtype)
            s_sh = alloc_sh((dk, dv), dtype)
            g_sh = alloc_sh((C,), acc)
            b_sh = alloc_sh((C,), acc)
            d_sh = alloc_sh((C,), acc)
            # hand-offs
            ds_sh = alloc_sh((dk, dv), dtype)  # bf16 dS' (WG0)
            w_sh = alloc_sh((C, dv), dtype)  # W (WG2)
            vn_sh = alloc_sh((C, dv), dtype)  # Vn (WG2), then dVn (WG1)
            ndwd_sh = alloc_sh((C, dv), dtype)  # -D dW (WG1)
            sdo_sh = alloc_sh((C, dv), dtype)  # scale D dO's parts (WG0's own)
            p_sh = alloc_sh((C, C), dtype)  # P (WG2), then T (WG2's own) and dKKt (for WG1)
            dqk_sh = alloc_sh((C, C), dtype)  # dQK (WG2)
            da0_sh = alloc_sh((C, C), dtype)  # dA0 (WG2's own)
            part_sh = alloc_sh((4,), acc)  # <S, dS'> per WG0 warp
            # dg's and dbeta's row terms: WG1's three vectors (kside_publish), WG2's dgc; the other row sums stay
            # in registers (the shared memory is full: the mbarriers' static 16 bytes are padded to 1 KiB)
            comb_sh = alloc_sh((C,), acc)
            x_sh = alloc_sh((C,), acc)
            cola_sh = alloc_sh((C,), acc)
            dgc_sh = alloc_sh((C,), acc)

            if cpu_debug:
                sds = alloc_acc((dk, dv))
                cc = alloc_acc((C, C))
                cc2 = alloc_acc((C, C))
                pr = alloc_acc((C, C))
                cv = alloc_acc((C, dv))
                u = alloc_acc((C, dv))
                ck = alloc_acc((C, dk))
                tmp = alloc_acc((C, dk))
                tot = alloc_sh((1,), acc)
                ag = alloc_frag((C, C), dtype)
                agt = alloc_frag((C, C), dtype)
                gm = alloc_acc((C, C))
                cb = alloc_frag((C, C), dtype)
                red_b, red_x, red_p, red_a, red_q = (alloc_sh((C,), acc) for _ in range(5))  # WG1's
                red_p2, red_a2 = alloc_sh((C,), acc), alloc_sh((C,), acc)  # WG2's
                drf = alloc_sh((C,), acc)
                for i, j in T.Parallel(dk, dv):
                    sds[i, j] = ds_slots[piece, bh, i, j]
                cq = alloc_acc((C, C))
                ptf = alloc_frag((C, C), dtype)
                nd = alloc_frag((C, dv), dtype)
                pd = alloc_sh((1,), acc)
                cv2 = alloc_acc((C, dv))  # WG2's while WG1's holds dW~
                for it in T.serial(n_iter):
                    bc = c_last - it
                    t0 = t_last - it * C
                    load_masked(q, k, v, a0, grad_o, states, g_cumsum, beta, q_sh, k_sh, v_sh, a_sh, do_sh, s_sh,
                                g_sh, b_sh, d_sh, bc, t0, end, bh, bhg)  # fmt: skip
                    if early:  # one order ws3's hand-offs allow (dVn in sdo's tile, after WG0's Q^T terms)
                        chain_publish(sds, ds_sh, s_sh, part_sh, None)
                        chain_q_terms(sds, q_sh, do_sh, d_sh, sdo_sh)
                        kside_pt3(k_sh, q_sh, g_sh, p_sh, cq, ptf)
                        kside_dvn3(k_sh, ds_sh, do_sh, g_sh, p_sh, cv, drf, t0, end)
                        T.copy(cv, sdo_sh)
                        kside_dw3(a_sh, g_sh, b_sh, d_sh, sdo_sh, ndwd_sh, agt, cv, nd, dv_out, t0, end, bh)
                        mm(k_sh, ndwd_sh, sds, transpose_a=True, clear=False)
                        aside_forward(q_sh, k_sh, v_sh, a_sh, do_sh, s_sh, g_sh, b_sh, d_sh, p_sh, w_sh, vn_sh,
                                      dqk_sh, cc, cv2, ag, pr, gm, cb, drf, t0, end)  # fmt: skip
                        aside_dqk3(do_sh, vn_sh, p_sh, g_sh, dqk_sh, cc, pr, gm, cb)
                        kside_colsums3(w_sh, vn_sh, do_sh, p_sh, cv, u, red_a, red_p)
                        dq_products(do_sh, s_sh, q_sh, k_sh, d_sh, dqk_sh, ck, tmp, red_q, dq_v, t0, end, bh)
                        kside_dk_first3(v_sh, ds_sh, k_sh, ndwd_sh, s_sh, dqk_sh, q_sh, ck, u, red_b, red_x)
                        aside_dag(sdo_sh, w_sh, a_sh, g_sh, b_sh, da0_sh, cc, pr, gm, cb, red_p2)
                        aside_a0_path(a_sh, k_sh, b_sh, da0_sh, p_sh, cc, cc2, cb, red_a2)
                        pd[0] = (part_sh[0] + part_sh[1] + part_sh[2] + part_sh[3]) * d_sh[C - 1]
                        kside_publish(b_sh, comb_sh, x_sh, cola_sh, red_b, red_x, red_p, red_a, red_q)
                        kside_dk_rest3(p_sh, k_sh, ck, dk_v, t0, end, bh)
                        aside_dg3(pd, x_sh, comb_sh, cola_sh, dgc_sh, red_p2, red_a2, tot, dg, dbeta, t0, end, bh)
                    else:
                        # one order the hand-offs allow
                        chain_publish(sds, ds_sh, s_sh, part_sh, None)
                        aside_forward(q_sh, k_sh, v_sh, a_sh, do_sh, s_sh, g_sh, b_sh, d_sh, p_sh, w_sh, vn_sh,
                                      dqk_sh, cc, cv, ag, pr, gm, cb, drf, t0, end)  # fmt: skip
                        kside_pt_do(p_sh, do_sh, vn_sh, u, tmp, red_p)
                        kside_dk_state(v_sh, ds_sh, k_sh, ck, tmp, red_x)
                        kside_dvn_state(k_sh, ds_sh, g_sh, vn_sh, u, cv, drf, t0, end)
                        chain_q_terms(sds, q_sh, do_sh, d_sh, sdo_sh)
                        kside_dw(a_sh, g_sh, b_sh, d_sh, vn_sh, w_sh, ndwd_sh, agt, cv, tmp, red_a, dv_out, t0, end, bh)
                        mm(k_sh, ndwd_sh, sds, transpose_a=True, clear=False)  # the chain's last product
                        aside_dag(vn_sh, w_sh, a_sh, g_sh, b_sh, da0_sh, cc, pr, gm, cb, red_p2)
                        kside_rowb(k_sh, s_sh, ndwd_sh, cv, red_b)
                        aside_a0_path(a_sh, k_sh, b_sh, da0_sh, p_sh, cc, cc2, cb, red_a2)
                        kside_dk_rest(dqk_sh, q_sh, p_sh, k_sh, ndwd_sh, s_sh, ck, dk_v, t0, end, bh)
                        dq_products(do_sh, s_sh, q_sh, k_sh, d_sh, dqk_sh, ck, tmp, red_q, dq_v, t0, end, bh)
                        kside_publish(b_sh, comb_sh, x_sh, cola_sh, red_b, red_x, red_p, red_a, red_q)
                        aside_dg(d_sh, part_sh, x_sh, comb_sh, cola_sh, dgc_sh, red_p2, red_a2, red_q, tot, dg,
                                 dbeta, t0, end, bh)  # fmt: skip
                for i, j in T.Parallel(dk, dv):
                    ds_slots[piece, bh, i, j] = sds[i, j]
            else:
                full = T.alloc_barrier(arrive_count=32)
                inputs_free = T.alloc_barrier(arrive_count=3 * WG)
                ds_ready = T.alloc_barrier(arrive_count=WG)
                a_ready = T.alloc_barrier(arrive_count=WG)
                dvn_ready = T.alloc_barrier(arrive_count=WG)
                dwd_ready = T.alloc_barrier(arrive_count=WG)
                dq_ready = T.alloc_barrier(arrive_count=WG)
                k_done = T.alloc_barrier(arrive_count=WG)
                if early:
                    full_b = T.alloc_barrier(arrive_count=32)  # K and the gates (`full`: S, Q, V, dO, A0)
                    early_free = T.alloc_barrier(arrive_count=3 * WG)
                    sdo_free = T.alloc_barrier(arrive_count=WG)
                    dg_done = T.alloc_barrier(arrive_count=WG)
                    pt_read = T.alloc_barrier(arrive_count=WG)
                    pt_ready = T.alloc_barrier(arrive_count=WG)
                tx = T.get_thread_binding()
                clk = T.alloc_local((1,), "int64")
                spent = T.alloc_local((NUM_PHASES,), "int64")
                # the walk's first chunk (a sequence's last, perhaps partial), masked, by every thread
                load_masked(q, k, v, a0, grad_o, states, g_cumsum, beta, q_sh, k_sh, v_sh, a_sh, do_sh, s_sh, g_sh,
                            b_sh, d_sh, c_last, t_last, end, bh, bhg)  # fmt: skip
                T.fence_proxy_async()
                T.sync_threads()

                if early:
                    if tx < WG:
                        T.set_max_nreg(NREG_CHAIN, 1)
                        sds = T.alloc_fragment((dk, dv), acc)
                        part = T.alloc_local((1,), acc)
                        T.copy(ds_slots[piece, bh, 0:dk, 0:dv], sds)
                        tick_start(clk, spent)
                        for it in T.serial(n_iter):
                            if it > 0:
                                T.barrier_wait(full, (it - 1) % 2)
                                T.barrier_wait(full_b, (it - 1) % 2)
                            tick(clk, spent, 0)
                            chain_publish(sds, ds_sh, s_sh, part_sh, part)
                            arrive(ds_ready)
                            tick(clk, spent, 1)
                            chain_q_terms(sds, q_sh, do_sh, d_sh, sdo_sh)
                            arrive(sdo_free)
                            arrive(early_free)
                            tick(clk, spent, 2)
                            T.barrier_wait(dwd_ready, it % 2)
                            tick(clk, spent, 3)
                            mm(k_sh, ndwd_sh, sds, transpose_a=True, clear=False)
                            arrive(inputs_free)
                            tick(clk, spent, 4)
                        T.copy(sds, ds_slots[piece, bh, 0:dk, 0:dv])
                        tick_store(prof, bid, 0, spent)
                    elif tx < 2 * WG:
                        T.set_max_nreg(NREG_KSIDE, 1)
                        u = T.alloc_fragment((C, dv), acc)
                        cv = T.alloc_fragment((C, dv), acc)
                        ck = T.alloc_fragment((C, dk), acc)
                        tmp = T.alloc_fragment((C, dk), acc)
                        cq = T.alloc_fragment((C, C), acc)
                        ptf = T.alloc_fragment((C, C), dtype)  # P^T on its way to shared memory
                        agt = T.alloc_fragment((C, C), dtype)
                        nd = T.alloc_fragment((C, dv), dtype)
                        red_b = T.alloc_fragment((C,), acc)
                        red_x = T.alloc_fragment((C,), acc)
                        red_p = T.alloc_fragment((C,), acc)
                        red_a = T.alloc_fragment((C,), acc)
                        red_q = T.alloc_fragment((C,), acc)
                        drf = T.alloc_fragment((C,), acc)
                        tick_start(clk, spent)
                        for it in T.serial(n_iter):
                            t0 = t_last - it * C
                            if it > 0:
                                T.barrier_wait(full, (it - 1) % 2)
                                T.barrier_wait(full_b, (it - 1) % 2)
                            tick(clk, spent, 0)
                            kside_pt3(k_sh, q_sh, g_sh, p_sh, cq, ptf)
                            arrive(pt_ready)
                            tick(clk, spent, 1)
                            T.barrier_wait(ds_ready, it % 2)
                            wg_sync(BAR_KSIDE)  # P^T in shared memory for this warpgroup's products
                            tick(clk, spent, 2)
                            kside_dvn3(k_sh, ds_sh, do_sh, g_sh, p_sh, cv, drf, t0, end)
                            T.barrier_wait(sdo_free, it % 2)  # WG0's Q^T terms are done with sdo's tile
                            T.copy(cv, sdo_sh)
                            arrive(dvn_ready)
                            tick(clk, spent, 3)
                            wg_sync(BAR_KSIDE)  # dVn in shared memory for this warpgroup's own product
                            kside_dw3(a_sh, g_sh, b_sh, d_sh, sdo_sh, ndwd_sh, agt, cv, nd, dv_out, t0, end, bh)
                            arrive(dwd_ready)
                            tick(clk, spent, 4)
                            T.barrier_wait(a_ready, it % 2)
                            tick(clk, spent, 5)
                            kside_colsums3(w_sh, vn_sh, do_sh, p_sh, cv, u, red_a, red_p)
                            arrive(pt_read)
                            dq_products(do_sh, s_sh, q_sh, k_sh, d_sh, dqk_sh, ck, tmp, red_q, dq_v, t0, end, bh)
                            tick(clk, spent, 6)
                            wg_sync(BAR_KSIDE)  # -D dW in shared memory for this warpgroup's products
                            kside_dk_first3(v_sh, ds_sh, k_sh, ndwd_sh, s_sh, dqk_sh, q_sh, ck, u, red_b, red_x)
                            arrive(early_free)
                            tick(clk, spent, 7)
                            # WG2 has read the last chunk's row terms. Redundant with this loop's order today
                            # (a_ready of this step comes after WG2's dg of the last), but not if the publish moves
                            # before a_ready: then k_done could complete twice before WG2 waits (session 29's review)
                            if it > 0:
                                T.barrier_wait(dg_done, (it - 1) % 2)
                            kside_publish(b_sh, comb_sh, x_sh, cola_sh, red_b, red_x, red_p, red_a, red_q)
                            arrive(k_done)
                            tick(clk, spent, 8)
                            T.barrier_wait(dq_ready, it % 2)
                            tick(clk, spent, 9)
                            kside_dk_rest3(p_sh, k_sh, ck, dk_v, t0, end, bh)
                            arrive(inputs_free)
                            tick(clk, spent, 10)
                        tick_store(prof, bid, 1, spent)
                    elif tx < 3 * WG:
                        T.set_max_nreg(NREG_ASIDE, 1)
                        cc = T.alloc_fragment((C, C), acc)
                        cc2 = T.alloc_fragment((C, C), acc)
                        pr = T.alloc_fragment((C, C), acc)
                        cv = T.alloc_fragment((C, dv), acc)
                        ag = T.alloc_fragment((C, C), dtype)
                        gm = T.alloc_fragment((C, C), acc)
                        cb = T.alloc_fragment((C, C), dtype)
                        red_p2 = T.alloc_fragment((C,), acc)
                        red_a2 = T.alloc_fragment((C,), acc)
                        drf = T.alloc_fragment((C,), acc)
                        tot = T.alloc_local((1,), acc)
                        pd = T.alloc_local((1,), acc)
                        tick_start(clk, spent)
                        for it in T.serial(n_iter):
                            t0 = t_last - it * C
                            if it > 0:
                                T.barrier_wait(full, (it - 1) % 2)
                                T.barrier_wait(full_b, (it - 1) % 2)
                            tick(clk, spent, 0)
                            aside_forward(q_sh, k_sh, v_sh, a_sh, do_sh, s_sh, g_sh, b_sh, d_sh, p_sh, w_sh, vn_sh,
                                          dqk_sh, cc, cv, ag, pr, gm, cb, drf, t0, end)  # fmt: skip
                            T.barrier_wait(pt_ready, it % 2)  # the K side's P^T is in P's tile
                            aside_dqk3(do_sh, vn_sh, p_sh, g_sh, dqk_sh, cc, pr, gm, cb)
                            arrive(a_ready)
                            tick(clk, spent, 1)
                            T.barrier_wait(dvn_ready, it % 2)
                            tick(clk, spent, 2)
                            aside_dag(sdo_sh, w_sh, a_sh, g_sh, b_sh, da0_sh, cc, pr, gm, cb, red_p2)
                            wg_sync(BAR_ASIDE)
                            tick(clk, spent, 3)
                            T.barrier_wait(pt_read, it % 2)  # WG1 is done with P^T: T goes into its tile
                            tick(clk, spent, 4)
                            aside_a0_path(a_sh, k_sh, b_sh, da0_sh, p_sh, cc, cc2, cb, red_a2)
                            arrive(dq_ready)
                            tick(clk, spent, 5)
                            T.barrier_wait(ds_ready, it % 2)
                            pd[0] = (part_sh[0] + part_sh[1] + part_sh[2] + part_sh[3]) * d_sh[C - 1]
                            arrive(early_free)
                            arrive(inputs_free)
                            tick(clk, spent, 6)
                            T.barrier_wait(k_done, it % 2)
                            tick(clk, spent, 7)
                            aside_dg3(pd, x_sh, comb_sh, cola_sh, dgc_sh, red_p2, red_a2, tot, dg, dbeta, t0, end, bh)
                            arrive(dg_done)
                            tick(clk, spent, 8)
                        tick_store(prof, bid, 2, spent)
                    else:
                        T.set_max_nreg(NREG_LOAD, 0)
                        if tx < 3 * WG + 32:
                            for it in T.serial(n_iter - 1):
                                bc = c_last - it - 1
                                t0 = t_last - (it + 1) * C
                                T.barrier_wait(early_free, it % 2)  # S, Q, V, dO, A0: read early in a chunk
                                T.tma_copy(states[bc, bh, 0:dk, 0:dv], s_sh, barrier=full)
                                T.tma_copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh, barrier=full)
                                T.tma_copy(v[0, t0 : t0 + C, bh, 0:dv], v_sh, barrier=full)
                                T.tma_copy(grad_o[0, t0 : t0 + C, bh, 0:dv], do_sh, barrier=full)
                                T.tma_copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh, barrier=full)
                                T.barrier_arrive(full)
                                T.barrier_wait(inputs_free, it % 2)  # K and the gates: read to the end
                                T.tma_copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh, barrier=full_b)
                                for i in T.Parallel(C):
                                    g_sh[i] = g_cumsum[0, t0 + i, bh]
                                    b_sh[i] = beta[0, t0 + i, bh]
                                    d_sh[i] = T.exp2(g_cumsum[0, t0 + i, bh] * LOG2E)
                                T.barrier_arrive(full_b)
                else:
                    if tx < WG:
                        T.set_max_nreg(NREG_CHAIN, 1)
                        sds = T.alloc_fragment((dk, dv), acc)
                        part = T.alloc_local((1,), acc)
                        T.copy(ds_slots[piece, bh, 0:dk, 0:dv], sds)
                        tick_start(clk, spent)
                        for it in T.serial(n_iter):
                            if it > 0:
                                T.barrier_wait(full, (it - 1) % 2)
                            tick(clk, spent, 0)
                            chain_publish(sds, ds_sh, s_sh, part_sh, part)
                            arrive(ds_ready)
                            tick(clk, spent, 1)
                            chain_q_terms(sds, q_sh, do_sh, d_sh, sdo_sh)
                            tick(clk, spent, 2)
                            T.barrier_wait(dwd_ready, it % 2)
                            tick(clk, spent, 3)
                            mm(k_sh, ndwd_sh, sds, transpose_a=True, clear=False)
                            arrive(inputs_free)
                            tick(clk, spent, 4)
                        T.copy(sds, ds_slots[piece, bh, 0:dk, 0:dv])
                        tick_store(prof, bid, 0, spent)
                    elif tx < 2 * WG:
                        T.set_max_nreg(NREG_KSIDE, 1)
                        u = T.alloc_fragment((C, dv), acc)
                        cv = T.alloc_fragment((C, dv), acc)
                        ck = T.alloc_fragment((C, dk), acc)
                        tmp = T.alloc_fragment((C, dk), acc)
                        agt = T.alloc_fragment((C, C), dtype)
                        red_b = T.alloc_fragment((C,), acc)
                        red_x = T.alloc_fragment((C,), acc)
                        red_p = T.alloc_fragment((C,), acc)
                        red_a = T.alloc_fragment((C,), acc)
                        red_q = T.alloc_fragment((C,), acc)
                        drf = T.alloc_fragment((C,), acc)
                        tick_start(clk, spent)
                        for it in T.serial(n_iter):
                            t0 = t_last - it * C
                            if it > 0:
                                T.barrier_wait(full, (it - 1) % 2)
                            tick(clk, spent, 0)
                            T.barrier_wait(a_ready, it % 2)
                            tick(clk, spent, 1)
                            kside_pt_do(p_sh, do_sh, vn_sh, u, tmp, red_p)
                            tick(clk, spent, 2)
                            T.barrier_wait(ds_ready, it % 2)
                            tick(clk, spent, 3)
                            kside_dvn_state(k_sh, ds_sh, g_sh, vn_sh, u, cv, drf, t0, end)
                            arrive(dvn_ready)
                            tick(clk, spent, 4)
                            wg_sync(BAR_KSIDE)  # dVn in shared memory for this warpgroup's own product
                            kside_dw(a_sh, g_sh, b_sh, d_sh, vn_sh, w_sh, ndwd_sh, agt, cv, tmp, red_a, dv_out, t0, end,
                                     bh)  # fmt: skip
                            arrive(dwd_ready)
                            tick(clk, spent, 5)
                            wg_sync(BAR_KSIDE)
                            kside_rowb(k_sh, s_sh, ndwd_sh, cv, red_b)
                            tick(clk, spent, 6)
                            kside_dk_state(v_sh, ds_sh, k_sh, ck, tmp, red_x)
                            if dq_aside:
                                kside_publish(b_sh, comb_sh, x_sh, cola_sh, red_b, red_x, red_p, red_a, red_q)
                                arrive(k_done)
                            tick(clk, spent, 7)
                            T.barrier_wait(dq_ready, it % 2)
                            tick(clk, spent, 8)
                            kside_dk_rest(dqk_sh, q_sh, p_sh, k_sh, ndwd_sh, s_sh, ck, dk_v, t0, end, bh)
                            tick(clk, spent, 9)
                            if not dq_aside:
                                dq_products(do_sh, s_sh, q_sh, k_sh, d_sh, dqk_sh, ck, tmp, red_q, dq_v, t0, end, bh)
                                kside_publish(b_sh, comb_sh, x_sh, cola_sh, red_b, red_x, red_p, red_a, red_q)
                                arrive(k_done)
                            arrive(inputs_free)
                            tick(clk, spent, 9 if dq_aside else 10)
                        tick_store(prof, bid, 1, spent)
                    elif tx < 3 * WG:
                        T.set_max_nreg(NREG_ASIDE, 1)
                        cc = T.alloc_fragment((C, C), acc)
                        cc2 = T.alloc_fragment((C, C), acc)
                        pr = T.alloc_fragment((C, C), acc)
                        cv = T.alloc_fragment((C, dv), acc)
                        ag = T.alloc_fragment((C, C), dtype)
                        gm = T.alloc_fragment((C, C), acc)  # Gamma
                        cb = T.alloc_fragment((C, C), dtype)  # a [C, C] tile on its way to shared memory
                        ckq = T.alloc_fragment((C, dk), acc) if dq_aside else None
                        red_p2 = T.alloc_fragment((C,), acc)
                        red_a2 = T.alloc_fragment((C,), acc)
                        red_q2 = T.alloc_fragment((C,), acc) if dq_aside else None
                        drf = T.alloc_fragment((C,), acc)
                        tot = T.alloc_local((1,), acc)
                        tick_start(clk, spent)
                        for it in T.serial(n_iter):
                            t0 = t_last - it * C
                            if it > 0:
                                T.barrier_wait(full, (it - 1) % 2)
                            tick(clk, spent, 0)
                            aside_forward(q_sh, k_sh, v_sh, a_sh, do_sh, s_sh, g_sh, b_sh, d_sh, p_sh, w_sh,
                                          vn_sh, dqk_sh, cc, cv, ag, pr, gm, cb, drf, t0, end)  # fmt: skip
                            arrive(a_ready)
                            tick(clk, spent, 1)
                            T.barrier_wait(dvn_ready, it % 2)
                            tick(clk, spent, 2)
                            aside_dag(vn_sh, w_sh, a_sh, g_sh, b_sh, da0_sh, cc, pr, gm, cb, red_p2)
                            wg_sync(BAR_ASIDE)
                            tick(clk, spent, 3)
                            aside_a0_path(a_sh, k_sh, b_sh, da0_sh, p_sh, cc, cc2, cb, red_a2)
                            arrive(dq_ready)
                            tick(clk, spent, 4)
                            if dq_aside:
                                dq_products(do_sh, s_sh, q_sh, k_sh, d_sh, dqk_sh, ckq, cv, red_q2, dq_v, t0, end, bh)
                                tick(clk, spent, 5)
                            T.barrier_wait(ds_ready, it % 2)
                            T.barrier_wait(k_done, it % 2)
                            tick(clk, spent, 6 if dq_aside else 5)
                            aside_dg(d_sh, part_sh, x_sh, comb_sh, cola_sh, dgc_sh, red_p2, red_a2, red_q2, tot, dg,
                                     dbeta, t0, end, bh)  # fmt: skip
                            arrive(inputs_free)
                            tick(clk, spent, 7 if dq_aside else 6)
                        tick_store(prof, bid, 2, spent)
                    else:
                        T.set_max_nreg(NREG_LOAD, 0)
                        if tx < 3 * WG + 32:
                            for it in T.serial(n_iter - 1):
                                bc = c_last - it - 1
                                t0 = t_last - (it + 1) * C
                                T.barrier_wait(inputs_free, it % 2)
                                T.tma_copy(k[0, t0 : t0 + C, bhg, 0:dk], k_sh, barrier=full)
                                T.tma_copy(states[bc, bh, 0:dk, 0:dv], s_sh, barrier=full)
                                T.tma_copy(q[0, t0 : t0 + C, bhg, 0:dk], q_sh, barrier=full)
                                T.tma_copy(v[0, t0 : t0 + C, bh, 0:dv], v_sh, barrier=full)
                                T.tma_copy(grad_o[0, t0 : t0 + C, bh, 0:dv], do_sh, barrier=full)
                                T.tma_copy(a0[0, t0 : t0 + C, bh, 0:C], a_sh, barrier=full)
                                for i in T.Parallel(C):  # whole chunks from here on: no clamping
                                    g_sh[i] = g_cumsum[0, t0 + i, bh]
                                    b_sh[i] = beta[0, t0 + i, bh]
                                    d_sh[i] = T.exp2(g_cumsum[0, t0 + i, bh] * LOG2E)
                                T.barrier_arrive(full)

    if profile:

        @T.prim_func
        def bwd_fused_ws_profile(
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
            prof: T.Tensor(((ns - 1) * h_v, 3, NUM_PHASES), "int64"),
        ):
            body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_slots, cu_seqlens, chunk_offsets, dq_v, dk_v, dbeta,
                 dg, dv_out, prof)  # fmt: skip

        return bwd_fused_ws_profile

    @T.prim_func
    def bwd_fused_ws(
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
        body(q, k, v, g_cumsum, beta, a0, grad_o, states, ds_slots, cu_seqlens, chunk_offsets, dq_v, dk_v, dbeta, dg,
             dv_out, None)  # fmt: skip

    return bwd_fused_ws


bwd_fused_ws_kernel = tilelang.jit(bwd_fused_ws_program, pass_configs=PASS_CONFIGS)
