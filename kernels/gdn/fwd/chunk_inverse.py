"""One chunk's gated inverse inside a warp-specialised kernel: the chunk-local cumsum of g, then

    L = StrictLower(diag(beta) K K^T),   A0 = (I + L)^-1,   Agb = Gamma o A0 diag(beta)

computed by one warpgroup (128 threads) from a K tile already in shared memory, written as bf16 into the
stage the kernel's GEMMs read. This is stage 1's work (kkt_solve_v3.py: the same 16 -> 32 -> 64 block
recursion) without its own launch, HBM round trip or CTA life: fused_fwd_vs's solve_in_kernel build runs it
in its auxiliary warpgroup while the state warpgroups walk the previous chunk.

Buffers are allocated once per CTA (alloc_work, in the kernel's top scope) and passed to the macros, which
run inside the auxiliary warpgroup's branch: TileLang turns their shared-memory hazards into named barriers
over that warpgroup's 128 threads (seen in vs1's generated CUDA), never into __syncthreads.

    X_b = (I + L_bb)^-1, b = 0..3               forward substitution in fp32, one thread per column
    [X10; X32] = -blockdiag(X1, X3) blockdiag(L10, L32) [X0; X2]
    X21 = -X22 L21 X11                          (32 x 32 blocks)

The block products are tf32 mma.sync (fp32 operands from shared memory); precise=True splits each operand
x = hi + lo and sums lo*hi + hi*lo + hi*hi (3xTF32, stage 1 v4's accuracy), else one pass (v4t's).
"""

import tilelang.language as T

from .kkt_solve_v3 import _tf32_hi

CHUNK = 64
BLK = 16
HALF = 32
LPAD = 8  # L's row padding (floats), as kkt_solve_v3's lean scatter
LOG2E = 1.4426950408889634
SCAN_STEPS = (1, 2, 4, 8, 16, 32)  # Hillis-Steele over the 64 gates of a chunk


def make_chunk_inverse(dtype: str, precise: bool):
    """(alloc_work, chunk_cumsum, solve) for bf16/fp16 K tiles of CHUNK rows.

    alloc_work() -> dict of shared buffers (call it in the kernel's top scope; ~27 KB, ~45 KB precise).
    chunk_cumsum(g_sh, gc_sh, scan_sh, st): gc_sh[st, :] = inclusive prefix sums of g_sh[st, :].
    solve(k_sh, b_sh, gc_sh, st, t0, end, kk, col, t1, u1, t2, u2, work, agb_sh, tw): Agb of stage st into
    agb_sh[st]; kk is a (CHUNK, CHUNK) fp32 fragment, col a (BLK,) local, t1/u1 (HALF, BLK) and t2/u2
    (HALF, HALF) fp32 fragments; tw the thread's index within the warpgroup. Tokens at or past `end` get
    beta = 0: their rows of L are zero and their columns of Agb too.
    """
    acc = "float32"
    C = CHUNK
    parts = ("hi", "lo") if precise else ("hi",)

    def alloc_work() -> dict:
        work = {
            "l": T.alloc_shared((C, C + LPAD), acc),  # L, all of it (rows padded against bank conflicts)
            "dx": T.alloc_shared((C, BLK + 1), acc),  # X_0..X_3 stacked 16 wide
        }
        shapes = {"a1": (HALF, HALF), "b1": (HALF, BLK), "a2": (HALF, HALF), "t1": (HALF, BLK),
                  "l21": (HALF, HALF), "x11": (HALF, HALF), "x22": (HALF, HALF), "t2": (HALF, HALF)}  # fmt: skip
        for name, shape in shapes.items():
            for part in parts:
                work[f"{name}_{part}"] = T.alloc_shared(shape, acc)
        return work

    def hi(work, name):
        return work[f"{name}_hi"]

    def lo(work, name):
        """The low part's buffer; without precise there is none and the high part stands in (never read)."""
        return work[f"{name}_lo"] if precise else work[f"{name}_hi"]

    @T.macro
    def put(x, work, name, r, c):
        """Operand `name`[r, c] = x, split hi + lo when precise."""
        if precise:
            hi(work, name)[r, c] = _tf32_hi(x)
            lo(work, name)[r, c] = x - _tf32_hi(x)
        else:
            hi(work, name)[r, c] = x

    @T.macro
    def product(work, a, b, out):
        """out = A B in fp32 (tf32 mma.sync), the small cross terms first when precise."""
        if precise:
            T.gemm(lo(work, a), hi(work, b), out, clear_accum=True)
            T.gemm(hi(work, a), lo(work, b), out)
            T.gemm(hi(work, a), hi(work, b), out)
        else:
            T.gemm(hi(work, a), hi(work, b), out, clear_accum=True)

    def value(work, name, r, c):
        """The fp32 value an operand buffer holds."""
        return hi(work, name)[r, c] + lo(work, name)[r, c] if precise else hi(work, name)[r, c]

    @T.macro
    def chunk_cumsum(g_sh, gc_sh, scan_sh, st):
        for i in T.Parallel(C):
            gc_sh[st, i] = g_sh[st, i]
        for d in T.unroll(len(SCAN_STEPS)):
            for i in T.Parallel(C):
                scan_sh[i] = gc_sh[st, i] + T.if_then_else(i >= (1 << d), gc_sh[st, T.max(i - (1 << d), 0)], 0.0)
            for i in T.Parallel(C):
                gc_sh[st, i] = scan_sh[i]

    def beta_in(b_sh, st, t0, end, i):
        return T.if_then_else(t0 + i < end, b_sh[st, i], 0.0)

    def gate(gc_sh, st, i, j):
        """Gamma_ij = exp(g_i - g_j) on and below the diagonal, 0 above (where exp could overflow)."""
        return T.if_then_else(i >= j, T.exp2((gc_sh[st, i] - gc_sh[st, j]) * LOG2E), 0.0)

    @T.macro
    def solve(k_sh, b_sh, gc_sh, st, t0, end, kk, col, t1, u1, t2, u2, work, agb_sh, tw):
        l_sh = work["l"]
        dx_sh = work["dx"]
        T.gemm(k_sh[st, :, :], k_sh[st, :, :], kk, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(C, C):
            kk[i, j] = T.if_then_else(i > j, kk[i, j] * beta_in(b_sh, st, t0, end, i), 0.0)
        T.copy(kk, l_sh[0:C, 0:C])
        # level-1 and level-2 operands taken from L: blockdiag(L10, L32) and L21
        for r, c in T.Parallel(HALF, HALF):
            put(T.if_then_else(r // BLK == c // BLK, l_sh[r // BLK * HALF + BLK + r % BLK, r // BLK * HALF + c % BLK],
                               0.0), work, "a1", r, c)  # fmt: skip
        for r, c in T.Parallel(HALF, HALF):
            put(l_sh[HALF + r, c], work, "l21", r, c)
        # the four diagonal blocks: thread (block b, column c) of the first 64 solves (I + L_bb) x = e_c
        if tw < 4 * BLK:
            for i in T.unroll(BLK):
                col[i] = T.if_then_else(tw % BLK == i, 1.0, 0.0)
                for j in T.unroll(i):
                    col[i] = col[i] - l_sh[tw // BLK * BLK + i, tw // BLK * BLK + j] * col[j]
            for i in T.unroll(BLK):
                dx_sh[tw // BLK * BLK + i, tw % BLK] = col[i]
        # level 1: [X10; X32] = -blockdiag(X1, X3) (blockdiag(L10, L32) [X0; X2])
        for r, c in T.Parallel(HALF, BLK):
            put(dx_sh[r // BLK * HALF + r % BLK, c], work, "b1", r, c)
        for r, c in T.Parallel(HALF, HALF):
            put(T.if_then_else(r // BLK == c // BLK, dx_sh[r // BLK * HALF + BLK + r % BLK, c % BLK], 0.0),
                work, "a2", r, c)  # fmt: skip
        product(work, "a1", "b1", t1)
        for r, c in T.Parallel(HALF, BLK):
            put(t1[r, c], work, "t1", r, c)
        product(work, "a2", "t1", u1)
        # level 2: X11 = [X0 0; X10 X1], X22 = [X2 0; X32 X3]; X21 = -X22 (L21 X11). Every element of each
        # operand is written by one loop that covers its region whole (no conditionally skipped stores)
        for r, c in T.Parallel(HALF, BLK):
            if r < BLK:
                put(-u1[r, c], work, "x11", BLK + r, c)
            else:
                put(-u1[r, c], work, "x22", r, c)
        for r, c in T.Parallel(BLK, BLK):
            put(dx_sh[r, c], work, "x11", r, c)
            put(0.0, work, "x11", r, BLK + c)
            put(dx_sh[BLK + r, c], work, "x11", BLK + r, BLK + c)
            put(dx_sh[HALF + r, c], work, "x22", r, c)
            put(0.0, work, "x22", r, BLK + c)
            put(dx_sh[HALF + BLK + r, c], work, "x22", BLK + r, BLK + c)
        product(work, "l21", "x11", t2)
        for r, c in T.Parallel(HALF, HALF):
            put(t2[r, c], work, "t2", r, c)
        product(work, "x22", "t2", u2)
        # Agb = Gamma o A0 diag(beta), rounded once from fp32
        for r, c in T.Parallel(HALF, HALF):
            agb_sh[st, HALF + r, c] = T.cast(
                -u2[r, c] * beta_in(b_sh, st, t0, end, c) * T.exp2((gc_sh[st, HALF + r] - gc_sh[st, c]) * LOG2E), dtype
            )
        for r, c in T.Parallel(HALF, HALF):
            agb_sh[st, r, c] = T.cast(value(work, "x11", r, c) * beta_in(b_sh, st, t0, end, c) * gate(gc_sh, st, r, c),
                                      dtype)  # fmt: skip
            agb_sh[st, HALF + r, HALF + c] = T.cast(
                value(work, "x22", r, c) * beta_in(b_sh, st, t0, end, HALF + c) * gate(gc_sh, st, HALF + r, HALF + c),
                dtype,
            )
            agb_sh[st, r, HALF + c] = T.cast(0.0, dtype)

    return alloc_work, chunk_cumsum, solve
