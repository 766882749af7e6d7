"""Stage 1 for the forward-only path, v10: the gated inverse with the gate inside, fp16 doublings on whole tiles.

    Agb = Gamma o (I + StrictLower(diag(beta) K K^T))^-1 diag(beta) = (I + L')^-1 diag(beta),
    L'  = StrictLower(diag(beta) (Gamma o K K^T))

(Gamma o M = E M E^-1 with E = diag(e^g), so gating before the inverse is exact algebra; FlashInfer's auxiliary
warpgroup and FLA gate first too.) Same contract as kkt_solve_v3's emit_agb builds (v4t: the forward's stage 1
for ws12): (k, g, beta, cu_seqlens, chunk_indices) -> (g_cumsum, Agb in the input dtype), one CTA per (chunk,
value head), 128 threads. No A0 comes out, so no backward can use it.

v4t takes ~17 K cycles a CTA (session 7's profile of v4: 14 barrier phases, most of them staging 16 x 16 and
32 x 32 operand blocks through fp32 shared buffers for tf32 products). v10 keeps every operand as one 64 x 64 fp16
tile in shared memory and doubles the inverse with whole-tile products on the tensor cores, masking instead of
staging (rounding_study_inverse.inverse_fp16_full is this algorithm, checked against float64):

    L' -> l_sh (fp16), X = 0                        K K^T's epilogue: gate, beta's rows, strict-lower mask
    X_b = (I + L'_bb)^-1, 8 x 8 diagonal blocks      forward substitution in fp32, one thread per column (8 steps)
    for s in 8, 16, 32:                              X holds the level's block-diagonal inverse
        P = -(X L') on the partner blocks -> p_sh   (row in the second half of a 2s block, column in its first)
        X = X + P X                                  (P X = -D C A = X21 on the partner blocks, 0 elsewhere)
    Agb = X diag(beta) -> the output dtype

Three levels of two 64 x 64 x 64 fp16 products (wgmma, fp32 sums), ~20 CTA barriers, no operand staging; the sm_90a
build takes 60 registers and 25 KiB of shared memory, so eight CTAs fit an SM (v4t: 80 and 34.5 KiB, six).
The products do ~8x the needed multiply-adds (whole tiles, mostly zeros), ~0.8 K cycles of tensor time a CTA.
Numerics (float64 emulation, rounding_study_inverse, 8 seeds x 6 input kinds): Agb's error is set by its final
rounding, as v4t's; with correlated keys and g = 0 heads the walk's o error is 1.02x an fp32 inverse's where v4t's
is 1.08x.

Checked: the program itself on TileLang's C backend (cpu_debug, fp32, products as loops) against float64 on
ragged, T = 1, T = 65, GVA 1-4 and strong-decay cases (tests/kernels/test_kkt_v10_cpu.py); compiled for sm_90a.
Not yet run on a GPU (NOTES.md, session 26).
"""

import tilelang
import tilelang.language as T

CHUNK = 64
BLK = 8
LOG2E = 1.4426950408889634

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}

# Profile build (profile=True): thread 0 of every CTA stamps clock64 after a barrier at these points; consecutive
# differences are the phases (profile_fwd.profile_kkt_v10).
PROFILE_STAMPS = (
    "start", "K, g, beta loaded, cumsum", "K K^T", "L' and X = 0 stored", "8 x 8 diagonal blocks", "level 8 -> 16",
    "level 16 -> 32", "level 32 -> 64", "Agb stored",
)  # fmt: skip


def _partner(i, j, size: int):
    """(i, j) is where the doubling from blocks of `size` to 2 size writes X21."""
    return T.And(T.And(i // (2 * size) == j // (2 * size), (i // size) % 2 == 1), (j // size) % 2 == 0)


def make_fp16_inverse(gemm, acc: str, half: str):
    """(diagonal, doubling) T.macros of the inverse on 64 x 64 tiles, shared by kkt v10 and the one-kernel forward's
    vs4 (fused_fwd_vs): gemm(a, b, out, clear) is the caller's product (wgmma, or loops on the CPU), half the tiles'
    type (fp16; fp32 in cpu_debug builds).

      diagonal(l_sh, x_sh, col, tw)          X's 8 x 8 diagonal blocks = (I + L'_bb)^-1, thread tw < 64 (block
                                             tw // 8, column tw % 8) substituting down its column in fp32 (col: a
                                             (8,) local); X must be 0 elsewhere
      doubling(x_sh, l_sh, p_sh, prod, size) X at blocks of `size` -> at blocks of 2 size (prod: a 64 x 64 fp32
                                             fragment)"""
    C = CHUNK

    @T.macro
    def diagonal(l_sh, x_sh, col, tw):
        if tw < C:
            blk = tw // BLK
            c = tw % BLK
            for i in T.unroll(BLK):
                col[i] = T.if_then_else(c == i, 1.0, 0.0)
                for j in T.unroll(i):
                    col[i] = col[i] - T.cast(l_sh[blk * BLK + i, blk * BLK + j], acc) * col[j]
            for i in T.unroll(BLK):
                x_sh[blk * BLK + i, blk * BLK + c] = T.cast(col[i], half)

    @T.macro
    def doubling(x_sh, l_sh, p_sh, prod, size):
        gemm(x_sh, l_sh, prod, True)  # X L': its partner blocks are D C
        for i, j in T.Parallel(C, C):
            p_sh[i, j] = T.cast(T.if_then_else(_partner(i, j, size), -prod[i, j], 0.0), half)
        # X + P X: P X is -D C A on the partner blocks and exactly 0 elsewhere (P is 0 off them, X off its blocks),
        # so the whole tile is written back unconditionally (a select that reads x_sh made TileLang put a barrier
        # in every iteration of the store loop)
        for i, j in T.Parallel(C, C):
            prod[i, j] = T.cast(x_sh[i, j], acc)
        gemm(p_sh, x_sh, prod, False)
        for i, j in T.Parallel(C, C):
            x_sh[i, j] = T.cast(prod[i, j], half)

    return diagonal, doubling


def kkt_solve_v10_program(dk: int, dtype: str, min_blocks_per_sm: int = 4, cpu_debug: bool = False,
                          profile: bool = False):
    """TileLang program: (k, g, beta, cu_seqlens, chunk_indices) -> (g_cumsum, Agb). Varlen layout (B = 1); head
    counts are runtime values. min_blocks_per_sm caps registers so that many CTAs fit an SM.

    cpu_debug=True builds the same program for TileLang's C backend (fp32 in and out, dtype "float32"): the
    products become loops, the TMA load a plain copy, the cumsum and the substitution serial loops, and the fp16
    tiles fp32 (the C backend has no half type), so everything but the GPU-only pieces and the fp16 roundings
    (grid decode, GVA heads, the gate and masks of L', the partner masks of every level, the tails) runs on a CPU
    against float64 (tests/kernels/test_kkt_v10_cpu.py).

    profile=True is a measuring build with one more argument, prof [num_chunks * h_v, len(PROFILE_STAMPS)] int64
    (clock64 per stamp, thread 0 of every CTA, after a barrier); its numbers go to NOTES.md, never into results."""
    assert not (profile and cpu_debug)
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"
    half = acc if cpu_debug else "float16"

    def alloc_acc(shape):
        return T.alloc_shared(shape, acc, scope="shared") if cpu_debug else T.alloc_fragment(shape, acc)

    def alloc_sh(shape, dt):
        # the C backend wants static shared memory (one dynamic allocation only)
        return T.alloc_shared(shape, dt, scope="shared") if cpu_debug else T.alloc_shared(shape, dt)

    @T.macro
    def gemm(a, b, out, clear, transpose_b=False):
        """out (+)= a b (a b^T): wgmma on the GPU, fp32 loops in cpu_debug builds."""
        if cpu_debug:
            for i, j in T.Parallel(out.shape[0], out.shape[1]):
                if clear:
                    out[i, j] = 0.0
                for r in T.serial(a.shape[1]):
                    bv = b[j, r] if transpose_b else b[r, j]
                    out[i, j] = out[i, j] + T.cast(a[i, r], acc) * T.cast(bv, acc)
        else:
            T.gemm(a, b, out, transpose_B=transpose_b, clear_accum=clear)

    @T.macro
    def stamp(prof, bid, point):
        """Profile builds: every thread reaches this point, then thread 0 reads the clock."""
        if profile:
            T.sync_threads()
            if T.get_thread_binding() == 0:
                prof[bid, point] = T.call_extern("int64", "clock64")

    diagonal, doubling = make_fp16_inverse(gemm, acc, half)

    @T.macro
    def body(k, g, beta, cu_seqlens, chunk_indices, g_cumsum, agb, prof):
        with T.Kernel(nc * h_v, threads=128) as (bid,):
            if min_blocks_per_sm > 0 and not cpu_debug:
                T.annotate_min_blocks_per_sm(min_blocks_per_sm)
            bh = T.alloc_var("int32", init=bid % h_v)
            bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
            start = T.alloc_var(
                "int32", init=cu_seqlens[chunk_indices[bid // h_v, 0]] + chunk_indices[bid // h_v, 1] * C
            )
            end = T.alloc_var("int32", init=cu_seqlens[chunk_indices[bid // h_v, 0] + 1])

            k_sh = alloc_sh((C, dk), dtype)
            b_sh = alloc_sh((C,), acc)
            gc_sh = alloc_sh((C,), acc)
            l_sh = alloc_sh((C, C), half)
            x_sh = alloc_sh((C, C), half)
            p_sh = alloc_sh((C, C), half)
            out_sh = alloc_sh((C, C), dtype)
            kk = alloc_acc((C, C))
            prod = alloc_acc((C, C))

            stamp(prof, bid, 0)
            # K by TMA (rows past the sequence end belong to the next sequence or are zero-filled: beta = 0 there
            # zeroes their rows of L', and their columns only meet rows past the end), g and beta meanwhile
            if cpu_debug:
                for i, d in T.Parallel(C, dk):
                    k_sh[i, d] = T.if_then_else(start + i < nt, k[0, T.min(start + i, nt - 1), bhg, d], 0.0)
            else:
                k_ready = T.alloc_barrier(arrive_count=32)
                if T.get_thread_binding() < 32:
                    T.tma_copy(k[0, start : start + C, bhg, 0:dk], k_sh, barrier=k_ready)
                    T.barrier_arrive(k_ready)
            for i in T.Parallel(C):
                b_sh[i] = T.if_then_else(start + i < end, beta[0, T.min(start + i, end - 1), bh], 0.0)
                gc_sh[i] = T.if_then_else(start + i < end, g[0, T.min(start + i, end - 1), bh], 0.0)
            if cpu_debug:
                for i in T.serial(C - 1):
                    gc_sh[i + 1] = gc_sh[i + 1] + gc_sh[i]
            else:
                T.barrier_wait(k_ready, 0)
                T.cumsum(src=gc_sh, dim=0)
            stamp(prof, bid, 1)
            gemm(k_sh, k_sh, kk, True, transpose_b=True)
            stamp(prof, bid, 2)

            # L' = StrictLower(diag(beta) (Gamma o K K^T)) in fp16, branch-free so the stores pair up (session 27's
            # profile: the select around exp2 compiled to a branch per element and 64 scalar 2-byte stores a thread
            # with X's zeros, the longest phase of the CTA; any select keeps TileLang from pairing the stores): the
            # strict-lower mask (i > j as 0 or 1) multiplies the exponent (0 on and above the diagonal: exp2 stays
            # finite) and the product; X = 0 as a fill of its own
            for i, j in T.Parallel(C, C):
                l_sh[i, j] = T.cast(
                    kk[i, j] * b_sh[i] * T.exp2((gc_sh[i] - gc_sh[j]) * T.cast(i > j, acc) * LOG2E)
                    * T.cast(i > j, acc),
                    half,
                )
            for i, j in T.Parallel(C, C):
                x_sh[i, j] = T.cast(0.0, half)

            stamp(prof, bid, 3)
            # the 8 x 8 diagonal blocks of (I + L')^-1: thread (block b, column c) substitutes down its column
            if cpu_debug:
                for blk, c in T.Parallel(C // BLK, BLK):
                    for i in T.serial(BLK):
                        x_sh[blk * BLK + i, blk * BLK + c] = T.if_then_else(c == i, 1.0, 0.0)
                        for j in T.serial(i):
                            x_sh[blk * BLK + i, blk * BLK + c] = (x_sh[blk * BLK + i, blk * BLK + c]
                                                                  - l_sh[blk * BLK + i, blk * BLK + j]
                                                                  * x_sh[blk * BLK + j, blk * BLK + c])  # fmt: skip
            else:
                col = T.alloc_local((BLK,), acc)
                diagonal(l_sh, x_sh, col, T.get_thread_binding())

            # doublings 8 -> 16 -> 32 -> 64 on whole tiles
            stamp(prof, bid, 4)
            doubling(x_sh, l_sh, p_sh, prod, BLK)
            stamp(prof, bid, 5)
            doubling(x_sh, l_sh, p_sh, prod, 2 * BLK)
            stamp(prof, bid, 6)
            doubling(x_sh, l_sh, p_sh, prod, 4 * BLK)
            stamp(prof, bid, 7)

            # Agb = X diag(beta) (beta is 0 past the end: those columns are 0); rows past the end are not stored
            for i, j in T.Parallel(C, C):
                out_sh[i, j] = T.cast(T.cast(x_sh[i, j], acc) * b_sh[j], dtype)
            if start + C <= end:
                T.copy(out_sh, agb[0, start : start + C, bh, 0:C])
            else:
                for i, j in T.Parallel(C, C):
                    if start + i < end:
                        agb[0, start + i, bh, j] = out_sh[i, j]
            for i in T.Parallel(C):
                if start + i < end:
                    g_cumsum[0, start + i, bh] = gc_sh[i]
            stamp(prof, bid, 8)

    if profile:

        @T.prim_func
        def kkt_solve_v10_profile(
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            g: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            cu_seqlens: T.Tensor((ns,), "int32"),
            chunk_indices: T.Tensor((nc, 2), "int32"),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
            agb: T.Tensor((1, nt, h_v, C), dtype),
            prof: T.Tensor((nc * h_v, len(PROFILE_STAMPS)), "int64"),
        ):
            body(k, g, beta, cu_seqlens, chunk_indices, g_cumsum, agb, prof)

        return kkt_solve_v10_profile

    @T.prim_func
    def kkt_solve_v10(
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        agb: T.Tensor((1, nt, h_v, C), dtype),
    ):
        body(k, g, beta, cu_seqlens, chunk_indices, g_cumsum, agb, None)

    return kkt_solve_v10


kkt_solve_v10_kernel = tilelang.jit(kkt_solve_v10_program, pass_configs=PASS_CONFIGS)
