"""Stage 1, v8: the chunk-local cumsum of g and A0 = (I + L)^-1, L = StrictLower(diag(beta) K K^T), with the
whole inverse by forward substitution in fp32 registers: one thread per column of A0, no tensor-core
products after K K^T, no operand splits.

Why: v4 (3xTF32 mma.sync on the off-diagonal blocks) and v7 (bf16 wgmma over hi/lo splits) are both bound
by shared memory on the H200 (Nsight Compute, session 10: ~3490 wavefronts per CTA for each, L1 at 95 %),
and most of that traffic is operand movement of the split products, not arithmetic: the inverse of a
64x64 unit lower-triangular matrix is only ~44 K multiply-adds. Here every thread of the first two warps
keeps one column x of A0 in 64 registers and runs
    x_i = [i == j] - sum_{k<i} L_ik x_k,   i = 0 .. 63,
reading L_ik from shared memory: all 32 lanes of a warp read the same L_ik (a broadcast, one wavefront per
load), so the whole inverse costs ~630 wavefronts of vector loads instead of v4's ~3000. The second warp
(columns 32..63) starts at row 32, since x_k = 0 for k < j. The arithmetic is exact fp32 (v4's 3xTF32 is
~2^-21 relative, v7's splits ~2^-16); A0 is rounded once, to the input dtype, when stored.

One CTA per (chunk, value head), 128 threads (K K^T is one warpgroup's wgmma, M = 64); one thread of warp 2
sums the chunk's g while warps 0 and 1 solve.

Measured on the H200 (session 11; NOTES.md): A0 as accurate as v2's on every stage-1 case, but v8 0.657 and
v8r 0.670 ms against v4's 0.578 at 16/64 8192x4. The wavefront count fell as predicted; the time did not: the
kernel is bound by each CTA's serial load -> solve -> store life, and here by one warp's ~2000-FMA column
(v9 spreads that work over the four warps).
"""

import tilelang
import tilelang.language as T

CHUNK = 64
LPAD = 4  # L's row padding (floats): rows stay 16-byte aligned for vector loads
NPART = 4  # independent partial sums per row (the FMA chain's latency, not its count, bounds a column)

# one 16-byte shared load into four registers: LLVM's instcombine splits a plain float4 load whose lanes are
# only read one by one back into four scalar loads (2150 of them in this kernel's PTX, not 540)
LDS_F32X4_SOURCE = r"""
__device__ __forceinline__ void qla_lds_f32x4(float* dst, const float* src) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(src));
  asm("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
      : "=f"(dst[0]), "=f"(dst[1]), "=f"(dst[2]), "=f"(dst[3]) : "r"(addr));
}
"""

PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}


@T.macro
def load_chunk_kkt(k, g, beta, k_sh, b_sh, gc_sh, kk, k_ready, start, end, bh, bhg, dk):
    """The start every v8/v9 CTA shares: its chunk's K tile by TMA (one warp), beta and g of its tokens (zero past
    the sequence end), then kk = K K^T on wgmma. The K tile is loaded unmasked (v4's argument: beta = 0 past the
    end zeroes those rows of L, and a column j past the end only meets rows i > j, also past the end)."""
    if T.get_thread_binding() < 32:
        T.tma_copy(k[0, start : start + CHUNK, bhg, 0:dk], k_sh, barrier=k_ready)
        T.barrier_arrive(k_ready)
    for i in T.Parallel(CHUNK):
        if start + i < end:
            b_sh[i] = beta[0, start + i, bh]
            gc_sh[i] = g[0, start + i, bh]
        else:
            b_sh[i] = 0.0
            gc_sh[i] = 0.0
    T.barrier_wait(k_ready, 0)
    T.gemm(k_sh, k_sh, kk, transpose_B=True, clear_accum=True)


@T.macro
def solve_right_looking(lt, x, lrow, first, rows, off):
    """Column substitution, right-looking, over rows and columns [off, off + rows) of -L^T held in lt (negated,
    so each update is one FMA: nvcc left x - l * y as a multiply and a subtract); x[i] is row off + i of the
    thread's column, e_j on entry and zero above row first. After step k, x_k is final and every row below
    has its L_ik x_k term. Rows come in groups of four from the group holding k + 1: the group's rows i <= k
    meet L_ik = 0 and are left exactly as they are."""
    for kk in T.unroll(first, rows - 1):
        for i4 in T.unroll((kk + 1) // NPART, rows // NPART):
            T.call_extern(
                "handle", "qla_lds_f32x4", T.address_of(lrow[0]), T.address_of(lt[off + kk, off + i4 * NPART])
            )
            for p in T.unroll(NPART):
                x[i4 * NPART + p] = x[i4 * NPART + p] + lrow[p] * x[kk]


def kkt_solve_v8_program(dk: int, dtype: str, right_looking: bool = False):
    """TileLang program with kkt_solve_v3_program's signature: (k, g, beta, cu_seqlens, chunk_indices) ->
    (g_cumsum, A0). Varlen layout (B = 1); head counts are runtime values; dtype is the input's (bf16 or
    fp16), K K^T runs on its tensor cores with fp32 accumulation.

    right_looking=True (v8r) turns each column's substitution around: once x_k is final, every later row
    takes its term at once, x_i -= L_ik x_k for i > k, reading column k of L (stored transposed, so it
    is one broadcast row of 16-byte loads). The left-looking form (v8) ends every row in a dependent sum
    whose L loads ptxas issues just before their FMAs; on the H200 it was 14 % slower than v4 (session 11).
    Right-looking, a step's (63 - k) updates are independent and its loads depend on nothing, so the only
    chain is one FMA per step."""
    C = CHUNK
    half = C // 2
    h_v = T.dynamic("h_v")
    h_qk = T.dynamic("h_qk")
    nt = T.dynamic("num_tokens")
    ns = T.dynamic("num_seqs_p1")
    nc = T.dynamic("num_chunks")
    acc = "float32"

    @T.macro
    def solve_rows(ld_sh, x, part, lrow, j, row0):
        """x_i for i in [row0, C) of column j, with x zero on entry. Row i's sum runs over whole groups of
        four k (one 16-byte load of L each, partial sum k % 4): the group's extra terms have k >= i, where
        L_ik = 0 and x_k is still 0, so they add exact zeros."""
        for i in T.unroll(row0, C):
            for p in T.unroll(NPART):
                part[p] = 0.0
            for k4 in T.unroll(row0 // NPART, (i + NPART - 1) // NPART):
                T.call_extern("handle", "qla_lds_f32x4", T.address_of(lrow[0]), T.address_of(ld_sh[i, k4 * NPART]))
                for p in T.unroll(NPART):
                    part[p] = part[p] + lrow[p] * x[k4 * NPART + p]
            x[i] = T.if_then_else(i == j, 1.0, 0.0) - ((part[0] + part[1]) + (part[2] + part[3]))

    @T.prim_func
    def kkt_solve_v8(
        k: T.Tensor((1, nt, h_qk, dk), dtype),
        g: T.Tensor((1, nt, h_v), acc),
        beta: T.Tensor((1, nt, h_v), acc),
        cu_seqlens: T.Tensor((ns,), "int32"),
        chunk_indices: T.Tensor((nc, 2), "int32"),
        g_cumsum: T.Tensor((1, nt, h_v), acc),
        a0: T.Tensor((1, nt, h_v, C), dtype),
    ):
        with T.Kernel(nc * h_v, threads=128) as (bid,):
            T.import_source(LDS_F32X4_SOURCE)
            if right_looking:  # 130 registers uncapped: three CTAs per SM instead of four
                T.annotate_min_blocks_per_sm(4)
            bh = T.alloc_var("int32", init=bid % h_v)
            bhg = T.alloc_var("int32", init=(bid % h_v) // (h_v // h_qk))
            seq = T.alloc_var("int32", init=chunk_indices[bid // h_v, 0])
            start = T.alloc_var("int32", init=cu_seqlens[seq] + chunk_indices[bid // h_v, 1] * C)
            end = T.alloc_var("int32", init=cu_seqlens[seq + 1])

            k_sh = T.alloc_shared((C, dk), dtype)
            b_sh = T.alloc_shared((C,), acc)
            gc_sh = T.alloc_shared((C,), acc)
            ld_sh = T.alloc_shared((C, C + LPAD), acc)  # L, or L^T for the right-looking form
            kk = T.alloc_fragment((C, C), acc)  # K K^T
            x = T.alloc_local((C,), acc)
            part = T.alloc_local((NPART,), acc)
            lrow = T.alloc_local((NPART,), acc)

            k_ready = T.alloc_barrier(arrive_count=32)
            load_chunk_kkt(k, g, beta, k_sh, b_sh, gc_sh, kk, k_ready, start, end, bh, bhg, dk)
            for i, j in T.Parallel(C, C):
                if right_looking:
                    ld_sh[j, i] = T.if_then_else(i > j, -kk[i, j] * b_sh[i], 0.0)  # -L^T
                else:
                    ld_sh[i, j] = T.if_then_else(i > j, kk[i, j] * b_sh[i], 0.0)
            T.sync_threads()

            tx = T.get_thread_binding()
            for i in T.unroll(C):
                x[i] = T.if_then_else(right_looking and i == tx, 1.0, 0.0)
            if tx < half:
                if right_looking:
                    solve_right_looking(ld_sh, x, lrow, 0, C, 0)
                else:
                    solve_rows(ld_sh, x, part, lrow, tx, 0)
            elif tx < C:
                if right_looking:
                    solve_right_looking(ld_sh, x, lrow, half, C, 0)
                else:
                    solve_rows(ld_sh, x, part, lrow, tx, half)
            else:
                # the chunk-local cumsum, sequential per thread (64 adds): warps 2 and 3 are idle otherwise
                if tx == C:
                    for i in T.serial(1, C):
                        gc_sh[i] = gc_sh[i] + gc_sh[i - 1]
            if tx < C:
                if start + C <= end:
                    for i in T.unroll(C):
                        a0[0, start + i, bh, tx] = T.cast(x[i], dtype)
                else:
                    for i in T.unroll(C):
                        if start + i < end:
                            a0[0, start + i, bh, tx] = T.cast(x[i], dtype)
            T.sync_threads()
            for i in T.Parallel(C):
                if start + i < end:
                    g_cumsum[0, start + i, bh] = gc_sh[i]

    return kkt_solve_v8


kkt_solve_v8_kernel = tilelang.jit(kkt_solve_v8_program, pass_configs=PASS_CONFIGS)
