"""One chunk's gated inverse inside a warp-specialised kernel: the chunk-local cumsum of g, then

    L = StrictLower(diag(beta) K K^T),   A0 = (I + L)^-1,   Agb = Gamma o A0 diag(beta)

computed by one warpgroup (128 threads) from a K tile already in shared memory, written as bf16 into the
stage the kernel's GEMMs read. This is stage 1's work (kkt_solve_v3.py: the same 16 -> 32 -> 64 block
recursion) without its own launch, HBM round trip or CTA life: fused_fwd_vs's solve_in_kernel build runs it
in its auxiliary warpgroup while the state warpgroups walk the previous chunk.

Buffers are allocated once per CTA (alloc_work, in the kernel's top scope) and passed to the macros, which
run inside the auxiliary warpgroup's branch: TileLang turns their shared-memory hazards into named barriers
over that warpgroup's 128 threads (seen in vs1's generated CUDA), never into __syncthreads.

Each barrier phase costs the warpgroup a shared-memory round trip, so the work is laid out in few of them
(session 16; session 15's first form had ~25 and took ~14 K cycles a chunk on an H100):
    cumsum        every thread of the first 64 sums its prefix itself (four partial sums): one phase, not 12
    L             K K^T's fragment writes L's diagonal blocks, blockdiag(L10, L32) and L21 straight into the
                  operand buffers (no full L in shared memory, no copy phase)
    diagonal      right-looking substitution (the updates of one step are independent: ~15 FMA latencies,
                  not 120), each column written straight into the operands that use it
    products      four tf32 products, one phase each
The operands' blocks that are always zero are written once per CTA (clear_constant_blocks), as is Agb's
upper-right block. Measured (session 16, H100 profile build): still ~14 K cycles a chunk. The barriers were not
the cost: the warpgroup is bound by its instruction count at the issue share the state warps leave it.

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
LOG2E = 1.4426950408889634


def make_chunk_inverse(dtype: str, precise: bool, masked_loads: bool = False):
    """(alloc_work, clear_constant_blocks, phases) for bf16/fp16 K tiles of CHUNK rows; phases is a dict of
    macros run in this order by one warpgroup (tw: the thread's index within it):

      cumsum(g_sh, gc_sh, st, tw, part)          gc_sh[st, :] = inclusive prefix sums of g_sh[st, :]
      lower(kk, b_sh, st, t0, end, work)         kk = K K^T (a (CHUNK, CHUNK) fp32 fragment) -> L's operands
      diagonal(col, work, tw)                    X_b = (I + L_bb)^-1 into the operands (col: a (BLK,) local)
      level1(t1, u1, work)                       X10, X32 into x11, x22 (t1, u1: (HALF, BLK) fragments)
      level2(t2, u2, b_sh, gc_sh, st, t0, end, work, agb_sh)
                                                 X21 = -X22 L21 X11 and Agb = Gamma o A0 diag(beta) into
                                                 agb_sh[st] (t2, u2: (HALF, HALF) fragments)

    masked_loads (vs3, session 25): beta and the gates are read unconditionally and masked by multiplying with
    0 or 1 (the exponent too, so nothing above the diagonal can overflow), where the default selects them in a
    branch: loads in a branch stay per element (vs2's level 2 reads 112 words a thread), unconditional ones are
    read once per distinct row and column. Same values: beta past `end` is the last token's (the producer
    clamps), finite, times 0.

    alloc_work() -> dict of shared buffers (call it in the kernel's top scope; ~18 KB, ~36 KB precise).
    clear_constant_blocks(work, agb_sh, tw): once per CTA, before the first chunk. Tokens at or past `end` get
    beta = 0: their rows of L are zero and their columns of Agb too.
    """
    acc = "float32"
    C = CHUNK
    parts = ("hi", "lo") if precise else ("hi",)

    def alloc_work() -> dict:
        work = {"ld": T.alloc_shared((C, BLK + 1), acc)}  # L's four diagonal 16 x 16 blocks, stacked
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

    def beta_in(b_sh, st, t0, end, i):
        if masked_loads:
            return b_sh[st, i] * T.if_then_else(t0 + i < end, 1.0, 0.0)
        return T.if_then_else(t0 + i < end, b_sh[st, i], 0.0)

    def gate(gc_sh, st, i, j):
        """Gamma_ij = exp(g_i - g_j) on and below the diagonal, 0 above (where exp could overflow)."""
        if masked_loads:
            return T.exp2((gc_sh[st, i] - gc_sh[st, j]) * T.if_then_else(i >= j, LOG2E, 0.0)) * T.if_then_else(
                i >= j, 1.0, 0.0
            )
        return T.if_then_else(i >= j, T.exp2((gc_sh[st, i] - gc_sh[st, j]) * LOG2E), 0.0)

    @T.macro
    def clear_constant_blocks(work, agb_sh, tw):
        """The blocks no chunk writes: a1's and a2's off-diagonal 16 x 16 blocks, the upper-right 16 x 16
        blocks of x11 and x22, and Agb's upper-right 32 x 32 block in both stages."""
        for e in T.serial(BLK * BLK // (4 * 32)):
            r = (e * 4 * 32 + tw) // BLK
            c = (e * 4 * 32 + tw) % BLK
            put(0.0, work, "a1", r, BLK + c)
            put(0.0, work, "a1", BLK + r, c)
            put(0.0, work, "a2", r, BLK + c)
            put(0.0, work, "a2", BLK + r, c)
            put(0.0, work, "x11", r, BLK + c)
            put(0.0, work, "x22", r, BLK + c)
        for e in T.serial(2 * HALF * HALF // (4 * 32)):
            idx = e * 4 * 32 + tw
            agb_sh[idx // (HALF * HALF), (idx // HALF) % HALF, HALF + idx % HALF] = T.cast(0.0, dtype)

    @T.macro
    def cumsum(g_sh, gc_sh, st, tw, part):
        """Thread i < CHUNK: gc_sh[st, i] = g_sh[st, 0] + ... + g_sh[st, i], in four interleaved partial sums
        (part: a (4,) fp32 local) so the adds overlap; every thread reads the same word at once (broadcast)."""
        if tw < C:
            for m in T.unroll(4):
                part[m] = 0.0
            for j in T.unroll(C):  # unrolled: constant indices into part, which stays in registers
                part[j % 4] = part[j % 4] + T.if_then_else(j <= tw, g_sh[st, j], 0.0)
            gc_sh[st, tw] = (part[0] + part[1]) + (part[2] + part[3])

    @T.macro
    def lower(kk, b_sh, st, t0, end, work):
        """L = StrictLower(diag(beta) K K^T) from the fragment into the operands that read it: the diagonal
        blocks (ld), blockdiag(L10, L32) (a1) and L21 (l21)."""
        ld = work["ld"]
        for i, j in T.Parallel(C, C):
            x = T.if_then_else(i > j, kk[i, j] * beta_in(b_sh, st, t0, end, i), 0.0)
            if i // BLK == j // BLK:
                ld[i, j % BLK] = x
            if i // BLK % 2 == 1 and j // BLK == i // BLK - 1:
                put(x, work, "a1", i // HALF * BLK + i % BLK, i // HALF * BLK + j % BLK)
            if i >= HALF and j < HALF:
                put(x, work, "l21", i - HALF, j)

    @T.macro
    def diagonal(col, work, tw):
        """Thread (b, c) = (tw // 16, tw % 16) of the first 64: column c of X_b = (I + L_bb)^-1 by right-looking
        substitution, written to [X0; X2] (b1), blockdiag(X1, X3) (a2) and the diagonal blocks of x11, x22."""
        ld = work["ld"]
        if tw < 4 * BLK:
            b = tw // BLK
            c = tw % BLK
            for i in T.unroll(BLK):  # unrolled: constant indices into col, which stays in registers
                col[i] = T.if_then_else(c == i, 1.0, 0.0)
            for j in T.unroll(BLK):
                for i in T.unroll(BLK):
                    if i > j:
                        col[i] = col[i] - ld[b * BLK + i, j] * col[j]
            for i in T.unroll(BLK):
                if b % 2 == 0:
                    put(col[i], work, "b1", b // 2 * BLK + i, c)
                else:
                    put(col[i], work, "a2", b // 2 * BLK + i, b // 2 * BLK + c)
                if b < 2:
                    put(col[i], work, "x11", b * BLK + i, b * BLK + c)
                else:
                    put(col[i], work, "x22", (b - 2) * BLK + i, (b - 2) * BLK + c)

    @T.macro
    def level1(t1, u1, work):
        """[X10; X32] = -blockdiag(X1, X3) (blockdiag(L10, L32) [X0; X2]) into x11's and x22's lower-left."""
        product(work, "a1", "b1", t1)
        for r, c in T.Parallel(HALF, BLK):
            put(t1[r, c], work, "t1", r, c)
        product(work, "a2", "t1", u1)
        for r, c in T.Parallel(HALF, BLK):
            if r < BLK:
                put(-u1[r, c], work, "x11", BLK + r, c)
            else:
                put(-u1[r, c], work, "x22", r, c)

    @T.macro
    def level2(t2, u2, b_sh, gc_sh, st, t0, end, work, agb_sh):
        """X21 = -X22 (L21 X11); Agb's diagonal 32 x 32 blocks (from x11, x22) go out alongside the first
        product, its lower-left block (from X21) after the second; all rounded once from fp32."""
        product(work, "l21", "x11", t2)
        for r, c in T.Parallel(HALF, HALF):
            agb_sh[st, r, c] = T.cast(value(work, "x11", r, c) * beta_in(b_sh, st, t0, end, c) * gate(gc_sh, st, r, c),
                                      dtype)  # fmt: skip
            agb_sh[st, HALF + r, HALF + c] = T.cast(
                value(work, "x22", r, c) * beta_in(b_sh, st, t0, end, HALF + c) * gate(gc_sh, st, HALF + r, HALF + c),
                dtype,
            )
        for r, c in T.Parallel(HALF, HALF):
            put(t2[r, c], work, "t2", r, c)
        product(work, "x22", "t2", u2)
        for r, c in T.Parallel(HALF, HALF):
            agb_sh[st, HALF + r, c] = T.cast(
                -u2[r, c] * beta_in(b_sh, st, t0, end, c) * T.exp2((gc_sh[st, HALF + r] - gc_sh[st, c]) * LOG2E), dtype
            )

    phases = {"cumsum": cumsum, "lower": lower, "diagonal": diagonal, "level1": level1, "level2": level2}
    return alloc_work, clear_constant_blocks, phases
