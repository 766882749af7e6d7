"""Stage 1, v3 and its revisions (v3h, v4 the default, v5; all checked on the H200): chunk-local cumsum of g and

    A0 = (I + StrictLower(diag(beta) K K^T))^-1

with the off-diagonal block products on tensor cores. Same outputs as kkt_solve.py (v2). One CTA per
(chunk, value head), 128 threads, value head fastest in the grid so the GVA siblings that read the same
K tile run next to each other (L2 hits).

Block algorithm (the recursion v2 uses, 16 -> 32 -> 64; blocks are 16x16, L_ij = block (i, j) of L):
    X_b  = (I + L_bb)^-1 for b = 0..3              forward substitution, fp32, one thread per column
    X10  = -X1 L10 X0,  X32 = -X3 L32 X2           level 1, both pairs in one 32-row product each:
           T1 = blockdiag(L10, L32) [X0; X2],  U1 = blockdiag(X1, X3) T1
    X21  = -X22 L21 X11 (32x32 blocks)             level 2: T2 = L21 X11, U2 = X22 T2
TileLang lowers fp32 T.gemm to mma.sync m16n8k8 tf32. A plain tf32 product loses ~13 mantissa bits of
each operand (measured in emulation: +15 % A0 error on correlated keys), so with precise=True every
product is split 3xTF32: x = hi + lo, hi = x rounded to tf32, lo = x - hi, and
    A B ~ A_lo B_hi + A_hi B_lo + A_hi B_hi    (fp32 accumulate)
which matches the fp32 CUDA-core products of v2 (tests/kernels/test_kkt_v3_algorithm.py emulates the
buffers stage by stage in torch and checks the error against float64).

Versus v2: no single-thread serial cumsum (64 dependent global loads), 1-D grid, 16-wide staging
buffers instead of full 64x64 fp32 copies, the 82 K fp32 multiply-adds of the block products (two
shared-memory loads each) moved to ~400 tf32 mma instructions, full chunks stored with one tile copy.
"""

import tilelang
import tilelang.language as T

CHUNK = 64
BLK = 16
HALF = 32
LPAD = 8  # lean_scatter's L row padding (floats): a half-warp's 8-byte fragment stores cover 32 banks
LOG2E = 1.4426950408889634
PAD = BLK + 1  # row stride of the 16-wide fp32 staging buffers: the 4 diagonal blocks hit different banks

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}

# Profile build (profile=True): thread 0 of every CTA stamps clock64 after a barrier at these points;
# consecutive differences are the phases.
PROFILE_STAMPS = (
    "start", "K, g, beta loaded", "cumsum, K K^T", "scatter L", "diagonal solves", "level-1 operands",
    "T1 = L10 X0", "split T1", "U1 = X1 T1", "level-2 operands", "T2 = L21 X11", "split T2", "U2 = X22 T2",
    "assemble A0", "stored",
)  # fmt: skip


def _tf32_hi(x):
    """x rounded to the nearest tf32 value (10 explicit mantissa bits), still an fp32 number."""
    bits = T.reinterpret(x, "uint32")
    return T.reinterpret(T.bitwise_and(bits + T.uint32(0x1000), T.uint32(0xFFFFE000)), "float32")


def _tf32_operand(x):
    """What mma.sync .tf32 reads from an fp32 register (the low 13 mantissa bits ignored)."""
    return T.reinterpret(T.bitwise_and(T.reinterpret(x, "uint32"), T.uint32(0xFFFFE000)), "float32")


@T.macro
def tf32_loop_gemm(a, b, out, clear):
    """CPU stand-in for T.gemm(a, b, out) on fp32 operands in cpu_debug builds: tf32 operand truncation as
    mma.sync does it, fp32 sums."""
    for i, j in T.Parallel(a.shape[0], b.shape[1]):
        if clear:
            out[i, j] = 0.0
        for r in T.serial(a.shape[1]):
            out[i, j] = out[i, j] + _tf32_operand(a[i, r]) * _tf32_operand(b[r, j])


def kkt_solve_v3_program(
    dk: int,
    dtype: str,
    precise: bool = True,
    min_blocks_per_sm: int = 6,
    cpu_debug: bool = False,
    hoist_index: bool = False,
    profile: bool = False,
    lean_scatter: bool = False,
    tma_k: bool = False,
    fold_l00: bool = False,
    emit_agb: bool = False,
):
    """TileLang program with kkt_solve_program's signature: (k, g, beta, cu_seqlens, chunk_indices) ->
    (g_cumsum, A0). Varlen layout (B = 1); head counts are runtime values.

    precise=False uses one tf32 product per block product (operands truncated by the hardware): for
    timing the 3xTF32 cost only, not for use. min_blocks_per_sm > 0 asks ptxas to fit that many CTAs
    per SM (register cap 65536 / (128 * n)): 6 gives 80 registers and no spills, and 6 x 33.8 KiB of
    shared memory fit too (8 would spill); 0 leaves ptxas free (93 registers, 5 CTAs/SM).

    cpu_debug=True builds the same program for TileLang's C backend, so its index logic (grid decode,
    scatter of L, operand stacking, assembly of A0, ragged-tail masking) runs on a CPU: the GEMMs become
    loops that read their operands through the same tf32 truncation as mma.sync, the register fragments
    shared buffers, the per-thread forward substitution and the warp scan serial loops (run with fp32
    in/out: the C backend has no bf16). tests/kernels/test_kkt_v3_cpu.py runs it against float64.

    hoist_index=True computes the CTA's head, chunk and token offsets once into registers. Without it
    TileLang re-derives them (64-bit signed floor division and modulo by h_v and h_v // h_qk) inside
    every unrolled load and store, some thousands of integer instructions per CTA (NOTES.md, v5).

    profile=True is a measuring build: one more argument, prof [num_chunks * h_v, len(PROFILE_STAMPS)]
    int64, where thread 0 of every CTA writes clock64 after a barrier at each of PROFILE_STAMPS
    (profile_fwd.profile_kkt turns them into mean cycles per phase). The extra barriers change the
    timing a little; its numbers go to NOTES.md, never into results.

    lean_scatter=True replaces the scatter of L, which the profile build measured at 11 K of a CTA's 27 K
    cycles on the H200 (NOTES.md, session 7): the three-way branchy scatter of the K K^T accumulator into
    the diagonal, A1 and L21 operand buffers (beta re-read from shared memory per element, every swizzled
    address re-derived) becomes one in-register pass (beta, strict-lower mask), one fragment-to-shared
    copy into a padded fp32 L, and the operand splits read from L in their own layouts; the diagonal
    solves read L directly. tma_k=True (GPU only) loads the K tile with bulk copies on an mbarrier while
    the threads load g and beta, instead of bounds-checked vector loads.

    fold_l00=True (with lean_scatter) keeps L's rows 16..63 only and parks the first diagonal block L00 in
    rows 16..31, columns 48..63 of that buffer (zeros of L there, read by nothing else): 4.6 KiB less
    shared memory, so six CTAs fit an SM instead of five (v4 ran 3.6 CTAs in flight per SM on the H200).
    Measured there (session 7): v4's time and v4's CTAs in flight, so shared memory was not the limit.

    emit_agb=True writes Agb = Gamma o A0 diag(beta) (the gated inverse with beta, FLA's A diag(beta)) in A0's
    place, rounded once from the fp32 A0 (Gamma_ij = exp(g_i - g_j) for i >= j, 0 above; beta is 0 past the
    sequence end, so those columns are 0): the ws10 forward (fused_fwd_ws rev 7) multiplies by it. No
    backward reads it: the autograd forward keeps A0. (Session 12 first wrote A0 diag(beta) beside it as
    well; the second 64x64 tile per chunk-head cost what the shorter chain saved, NOTES.md.)

    (Session 8 also had several items per CTA, to ask whether v4 is bound by how fast its CTAs start and
    finish: on the H200 those builds hung. The parser turns the items' Python loop into a device loop,
    and the TMA barrier was waited on with parity 0 in every iteration. They were removed in session 9;
    the one-item build with MERGED_PASS_CONFIGS, kkt v4m, runs at v4's speed.)
    """
    assert not (profile and cpu_debug)
    assert not (tma_k and cpu_debug)
    assert not fold_l00 or lean_scatter
    C = CHUNK
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"

    @T.macro
    def split_store(x, dst_hi, dst_lo, r, c):
        """dst_hi[r, c], dst_lo[r, c] = the 3xTF32 split of x (dst_lo unused when not precise)."""
        if isinstance(x, float):  # a constant (the zero blocks): exact in tf32, nothing to split
            dst_hi[r, c] = x
            if precise:
                dst_lo[r, c] = 0.0
        elif precise:
            dst_hi[r, c] = _tf32_hi(x)
            dst_lo[r, c] = x - _tf32_hi(x)
        else:
            dst_hi[r, c] = x

    @T.macro
    def mm(a_hi, a_lo, b_hi, b_lo, out):
        """out = A B (fp32 accumulate), 3xTF32 when precise; small terms first."""
        if cpu_debug:
            if precise:
                tf32_loop_gemm(a_lo, b_hi, out, True)
                tf32_loop_gemm(a_hi, b_lo, out, False)
                tf32_loop_gemm(a_hi, b_hi, out, False)
            else:
                tf32_loop_gemm(a_hi, b_hi, out, True)
        elif precise:
            T.gemm(a_lo, b_hi, out, clear_accum=True)
            T.gemm(a_hi, b_lo, out)
            T.gemm(a_hi, b_hi, out)
        else:
            T.gemm(a_hi, b_hi, out, clear_accum=True)

    def alloc_sh(shape, dt):
        # the C backend wants static shared memory (one dynamic allocation only, and it does not merge)
        return T.alloc_shared(shape, dt, scope="shared") if cpu_debug else T.alloc_shared(shape, dt)

    alloc_acc = alloc_sh if cpu_debug else T.alloc_fragment

    def lblk(ld_sh, blk, i, j):
        """L_bb[i, j] from ld_sh: all of L with lean_scatter (rows 16.. and L00 parked, with fold_l00), else
        the diagonal blocks stacked 16 wide."""
        if fold_l00:
            return ld_sh[T.max(blk - 1, 0) * BLK + i, T.if_then_else(blk == 0, 3 * BLK, blk * BLK) + j]
        return ld_sh[blk * BLK + i, blk * BLK + j] if lean_scatter else ld_sh[blk * BLK + i, j]

    def lrow(i):
        """Row of L's row i in ld_sh (fold_l00 drops the first 16 rows)."""
        return i - BLK if fold_l00 else i

    @T.macro
    def stamp(prof, bid, point):
        """Profile builds: every thread reaches this point, then thread 0 reads the clock."""
        if profile:
            T.sync_threads()
            if T.get_thread_binding() == 0:
                prof[bid, point] = T.call_extern("int64", "clock64")

    @T.macro
    def assemble_a0(u2, x11_hi, x11_lo, x22_hi, x22_lo, a_out):
        """a_out = A0 = [X11 0; X21 X22] in the output dtype."""
        for r, c in T.Parallel(HALF, HALF):
            a_out[HALF + r, c] = T.cast(-u2[r, c], dtype)
        for r, c in T.Parallel(HALF, HALF):
            if precise:
                a_out[r, c] = T.cast(x11_hi[r, c] + x11_lo[r, c], dtype)
                a_out[HALF + r, HALF + c] = T.cast(x22_hi[r, c] + x22_lo[r, c], dtype)
            else:
                a_out[r, c] = T.cast(x11_hi[r, c], dtype)
                a_out[HALF + r, HALF + c] = T.cast(x22_hi[r, c], dtype)
            a_out[r, HALF + c] = T.cast(0.0, dtype)

    def gate(gc_sh, i, j):
        """Gamma_ij = exp(g_i - g_j) below and on the diagonal, 0 above (where exp could overflow)."""
        return T.if_then_else(i >= j, T.exp2((gc_sh[i] - gc_sh[j]) * LOG2E), 0.0)

    @T.macro
    def assemble_agb(u2, x11_hi, x11_lo, x22_hi, x22_lo, b_sh, gc_sh, agb):
        """agb = Gamma o A0 diag(beta), rounded once from fp32."""
        for r, c in T.Parallel(HALF, HALF):
            agb[HALF + r, c] = T.cast(-u2[r, c] * b_sh[c] * T.exp2((gc_sh[HALF + r] - gc_sh[c]) * LOG2E), dtype)
        for r, c in T.Parallel(HALF, HALF):
            x = (x11_hi[r, c] + x11_lo[r, c] if precise else x11_hi[r, c]) * b_sh[c]
            agb[r, c] = T.cast(x * gate(gc_sh, r, c), dtype)
            y = (x22_hi[r, c] + x22_lo[r, c] if precise else x22_hi[r, c]) * b_sh[HALF + c]
            agb[HALF + r, HALF + c] = T.cast(y * gate(gc_sh, HALF + r, HALF + c), dtype)
            agb[r, HALF + c] = T.cast(0.0, dtype)

    # One (chunk, value head) item, w = chunk * h_v + head, with its own buffers.
    @T.macro
    def solve_item(k, g, beta, cu_seqlens, chunk_indices, g_cumsum, a0, prof, w):
        if hoist_index:
            bh = T.alloc_var("int32", init=w % h_v)
            bc = T.alloc_var("int32", init=w // h_v)
            bhg = T.alloc_var("int32", init=(w % h_v) // (h_v // h_qk))
            seq = T.alloc_var("int32", init=chunk_indices[w // h_v, 0])
            start = T.alloc_var(
                "int32", init=cu_seqlens[chunk_indices[w // h_v, 0]] + chunk_indices[w // h_v, 1] * C
            )
            end = T.alloc_var("int32", init=cu_seqlens[chunk_indices[w // h_v, 0] + 1])
        else:
            bh = w % h_v
            bc = w // h_v
            bhg = bh // (h_v // h_qk)
            seq = chunk_indices[bc, 0]
            start = cu_seqlens[seq] + chunk_indices[bc, 1] * C
            end = cu_seqlens[seq + 1]

        k_sh = alloc_sh((C, dk), dtype)
        b_sh = alloc_sh((C,), acc)
        gc_sh = alloc_sh((C,), acc)
        kk = alloc_acc((C, C), acc)
        # lean_scatter: all of L, rows padded (the fragment's pair stores hit 32 banks); else the diagonal
        # blocks of L, row i holds L[i, 16*(i//16) + c]
        ld_sh = alloc_sh((C - BLK if fold_l00 else C, C + LPAD), acc) if lean_scatter else alloc_sh((C, PAD), acc)
        dx_sh = alloc_sh((C, PAD), acc)  # their inverses X_b in the same stacking
        if not cpu_debug:
            col = T.alloc_local((BLK,), acc)
        # level 1: A1 = blockdiag(L10, L32), B1 = [X0; X2], A2 = blockdiag(X1, X3)
        a1_hi = alloc_sh((HALF, HALF), acc)
        b1_hi = alloc_sh((HALF, BLK), acc)
        a2_hi = alloc_sh((HALF, HALF), acc)
        t1_hi = alloc_sh((HALF, BLK), acc)
        t1 = alloc_acc((HALF, BLK), acc)
        u1 = alloc_acc((HALF, BLK), acc)
        # level 2: L21 = L[32:, :32], X11 = A0[:32, :32], X22 = A0[32:, 32:]
        l21_hi = alloc_sh((HALF, HALF), acc)
        x11_hi = alloc_sh((HALF, HALF), acc)
        x22_hi = alloc_sh((HALF, HALF), acc)
        t2_hi = alloc_sh((HALF, HALF), acc)
        t2 = alloc_acc((HALF, HALF), acc)
        u2 = alloc_acc((HALF, HALF), acc)
        a_out = alloc_sh((C, C), dtype)
        if precise:
            a1_lo = alloc_sh((HALF, HALF), acc)
            b1_lo = alloc_sh((HALF, BLK), acc)
            a2_lo = alloc_sh((HALF, HALF), acc)
            t1_lo = alloc_sh((HALF, BLK), acc)
            l21_lo = alloc_sh((HALF, HALF), acc)
            x11_lo = alloc_sh((HALF, HALF), acc)
            x22_lo = alloc_sh((HALF, HALF), acc)
            t2_lo = alloc_sh((HALF, HALF), acc)
        else:
            a1_lo = a1_hi
            b1_lo = b1_hi
            a2_lo = a2_hi
            t1_lo = t1_hi
            l21_lo = l21_hi
            x11_lo = x11_hi
            x22_lo = x22_hi
            t2_lo = t2_hi

        # K tile unmasked: rows past the sequence end belong to the next sequence (finite) or are
        # zero-filled past the tensor end; beta = 0 there zeroes their rows of L, and a column j past
        # the end only meets rows i > j, also past the end.
        stamp(prof, w, 0)
        if tma_k:
            k_ready = T.alloc_barrier(arrive_count=32)
            if T.get_thread_binding() < 32:
                T.tma_copy(k[0, start : start + C, bhg, 0:dk], k_sh, barrier=k_ready)
                T.barrier_arrive(k_ready)
        else:
            T.copy(k[0, start : start + C, bhg, 0:dk], k_sh)
        for i in T.Parallel(C):
            if start + i < end:
                b_sh[i] = beta[0, start + i, bh]
                gc_sh[i] = g[0, start + i, bh]
            else:
                b_sh[i] = 0.0
                gc_sh[i] = 0.0
        if tma_k:
            T.barrier_wait(k_ready, 0)
        stamp(prof, w, 1)
        if cpu_debug:
            for i in T.serial(C - 1):
                gc_sh[i + 1] = gc_sh[i + 1] + gc_sh[i]
            for i, j in T.Parallel(C, C):
                kk[i, j] = 0.0
                for d in T.serial(dk):
                    kk[i, j] = kk[i, j] + T.cast(k_sh[i, d], acc) * T.cast(k_sh[j, d], acc)
        else:
            T.cumsum(src=gc_sh, dim=0)
            T.gemm(k_sh, k_sh, kk, transpose_B=True, clear_accum=True)

        stamp(prof, w, 2)
        # scatter L = StrictLower(diag(beta) K K^T) into the pieces the algorithm reads
        if lean_scatter:
            for i, j in T.Parallel(C, C):
                kk[i, j] = T.if_then_else(i > j, kk[i, j] * b_sh[i], 0.0)
            if fold_l00:  # two loops: an if/elif pair in one loop lowers wrongly (TileLang 0.1.15, seen
                # in the C backend: the elif's column test also guarded the first branch's stores)
                for i, j in T.Parallel(C, C):
                    if i >= BLK and (i >= HALF or j < 3 * BLK):  # rows 16..31 leave columns 48.. to L00
                        ld_sh[i - BLK, j] = kk[i, j]
                for i, j in T.Parallel(C, C):
                    if i < BLK and j < BLK:
                        ld_sh[i, 3 * BLK + j] = kk[i, j]
            else:
                T.copy(kk, ld_sh[0:C, 0:C])
            # A1 = blockdiag(L10, L32) and L21, every element of each written by its own loop
            for r, c in T.Parallel(HALF, HALF):
                split_store(
                    T.if_then_else(
                        r // BLK == c // BLK,
                        ld_sh[lrow(r // BLK * HALF + BLK + r % BLK), r // BLK * HALF + c % BLK],
                        0.0,
                    ),
                    a1_hi, a1_lo, r, c,
                )  # fmt: skip
            for r, c in T.Parallel(HALF, HALF):
                split_store(ld_sh[lrow(HALF + r), c], l21_hi, l21_lo, r, c)
        else:
            for i, j in T.Parallel(C, C):
                if i // BLK == j // BLK:
                    ld_sh[i, j % BLK] = T.if_then_else(i > j, kk[i, j] * b_sh[i], 0.0)
                if i >= HALF and j < HALF:
                    split_store(kk[i, j] * b_sh[i], l21_hi, l21_lo, i - HALF, j)
                if i // BLK % 2 == 1 and j // BLK == i // BLK - 1:
                    split_store(kk[i, j] * b_sh[i], a1_hi, a1_lo, i // HALF * BLK + i % BLK,
                                i // HALF * BLK + j % BLK)
            for r, c in T.Parallel(HALF, HALF):
                if r // BLK != c // BLK:
                    split_store(0.0, a1_hi, a1_lo, r, c)

        stamp(prof, w, 3)
        # diagonal blocks: thread (block b, column c) solves (I + L_bb) x = e_c in fp32 registers
        if cpu_debug:
            for blk, c in T.Parallel(4, BLK):
                for i in T.serial(BLK):
                    dx_sh[blk * BLK + i, c] = T.if_then_else(c == i, 1.0, 0.0)
                    for j in T.serial(i):
                        dx_sh[blk * BLK + i, c] = dx_sh[blk * BLK + i, c] - lblk(ld_sh, blk, i, j) * dx_sh[
                            blk * BLK + j, c]
        else:
            tx = T.get_thread_binding()
            if tx < 4 * BLK:
                blk = tx // BLK
                c = tx % BLK
                for i in T.unroll(BLK):
                    col[i] = T.if_then_else(c == i, 1.0, 0.0)
                    for j in T.unroll(i):
                        col[i] = col[i] - lblk(ld_sh, blk, i, j) * col[j]
                for i in T.unroll(BLK):
                    dx_sh[blk * BLK + i, c] = col[i]

        stamp(prof, w, 4)
        # level 1 operands from the diagonal inverses
        for r, c in T.Parallel(HALF, BLK):
            split_store(dx_sh[r // BLK * HALF + r % BLK, c], b1_hi, b1_lo, r, c)
        for r, c in T.Parallel(HALF, HALF):
            split_store(
                T.if_then_else(r // BLK == c // BLK, dx_sh[r // BLK * HALF + BLK + r % BLK, c % BLK], 0.0),
                a2_hi, a2_lo, r, c,
            )
        stamp(prof, w, 5)
        mm(a1_hi, a1_lo, b1_hi, b1_lo, t1)  # [L10 X0; L32 X2]
        stamp(prof, w, 6)
        for r, c in T.Parallel(HALF, BLK):
            split_store(t1[r, c], t1_hi, t1_lo, r, c)
        stamp(prof, w, 7)
        mm(a2_hi, a2_lo, t1_hi, t1_lo, u1)  # [X1 L10 X0; X3 L32 X2] = -[X10; X32]

        stamp(prof, w, 8)
        # level 2 operands: X11 = [X0 0; X10 X1], X22 = [X2 0; X32 X3]
        for r, c in T.Parallel(HALF, BLK):
            if r < BLK:
                split_store(-u1[r, c], x11_hi, x11_lo, BLK + r, c)
            else:
                split_store(-u1[r, c], x22_hi, x22_lo, r, c)
        # (every element written unconditionally: TileLang vectorises a conditionally skipped write
        # of a T.Parallel loop into an unconditional store of an uninitialised local, seen in v3's
        # generated CUDA; so each loop below covers its region completely)
        for r, c in T.Parallel(BLK, BLK):
            split_store(dx_sh[r, c], x11_hi, x11_lo, r, c)
            split_store(0.0, x11_hi, x11_lo, r, BLK + c)
            split_store(dx_sh[BLK + r, c], x11_hi, x11_lo, BLK + r, BLK + c)
            split_store(dx_sh[HALF + r, c], x22_hi, x22_lo, r, c)
            split_store(0.0, x22_hi, x22_lo, r, BLK + c)
            split_store(dx_sh[HALF + BLK + r, c], x22_hi, x22_lo, BLK + r, BLK + c)
        stamp(prof, w, 9)
        mm(l21_hi, l21_lo, x11_hi, x11_lo, t2)  # L21 X11
        stamp(prof, w, 10)
        for r, c in T.Parallel(HALF, HALF):
            split_store(t2[r, c], t2_hi, t2_lo, r, c)
        stamp(prof, w, 11)
        mm(x22_hi, x22_lo, t2_hi, t2_lo, u2)  # X22 L21 X11 = -X21

        stamp(prof, w, 12)
        # assemble A0 = [X11 0; X21 X22] (hi + lo is the exact fp32 value)
        if emit_agb:
            assemble_agb(u2, x11_hi, x11_lo, x22_hi, x22_lo, b_sh, gc_sh, a_out)
        else:
            assemble_a0(u2, x11_hi, x11_lo, x22_hi, x22_lo, a_out)

        stamp(prof, w, 13)
        if start + C <= end:
            T.copy(a_out, a0[0, start : start + C, bh, 0:C])
        else:
            for i, j in T.Parallel(C, C):
                if start + i < end:
                    a0[0, start + i, bh, j] = a_out[i, j]
        for i in T.Parallel(C):
            if start + i < end:
                g_cumsum[0, start + i, bh] = gc_sh[i]
        stamp(prof, w, 14)

    @T.macro
    def body(k, g, beta, cu_seqlens, chunk_indices, g_cumsum, a0, prof):
        with T.Kernel(nc * h_v, threads=128) as (bid,):
            if min_blocks_per_sm > 0 and not cpu_debug:
                T.annotate_min_blocks_per_sm(min_blocks_per_sm)
            solve_item(k, g, beta, cu_seqlens, chunk_indices, g_cumsum, a0, prof, bid)

    if profile:

        @T.prim_func
        def kkt_solve_v3_profile(
            k: T.Tensor((1, nt, h_qk, dk), dtype),
            g: T.Tensor((1, nt, h_v), acc),
            beta: T.Tensor((1, nt, h_v), acc),
            cu_seqlens: T.Tensor((ns,), "int32"),
            chunk_indices: T.Tensor((nc, 2), "int32"),
            g_cumsum: T.Tensor((1, nt, h_v), acc),
            a0: T.Tensor((1, nt, h_v, C), dtype),
            prof: T.Tensor((nc * h_v, len(PROFILE_STAMPS)), "int64"),
        ):
            body(k, g, beta, cu_seqlens, chunk_indices, g_cumsum, a0, prof)

        return kkt_solve_v3_profile

    @T.prim_func
    def kkt_solve_v3(
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
    ):
        body(k, g, beta, cu_seqlens, chunk_indices, g_cumsum, a0, None)

    return kkt_solve_v3


kkt_solve_v3_kernel = tilelang.jit(kkt_solve_v3_program, pass_configs=PASS_CONFIGS)
# TileLang's aggressive shared-memory merge (kkt v4m): v4's buffers in 34.5 KiB instead of 38.8
MERGED_PASS_CONFIGS = {**PASS_CONFIGS, tilelang.PassConfigKey.TL_ENABLE_AGGRESSIVE_SHARED_MEMORY_MERGE: True}
kkt_solve_v3_merged_kernel = tilelang.jit(kkt_solve_v3_program, pass_configs=MERGED_PASS_CONFIGS)
