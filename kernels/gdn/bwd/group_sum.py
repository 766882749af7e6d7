"""The backward's last step for dq and dk: sum the per-value-head fp32 gradients over each GVA group and
round once to the input dtype, both tensors in one launch.

Stage 2 (bwd/chunk_grads.py) writes dq and dk per value head in fp32 ([1, T, H_v, K]); the key and query
heads are shared by r = H_v / H_qk value heads, so dq[t, j] = sum over the group of dq_v[t, j r + i].
Torch did that as `.sum(dim)` (an fp32 [1, T, H_qk, K] written and read back) then `.to(dtype)`: two
passes per tensor over the intermediate. Here each CTA reads BLOCK_ROWS (token, query head) rows of both
tensors, sums the r rows in registers (in the group's order, as torch did for r = 2) and stores the
rounded result. Rows are the flattened (token, query head) pairs: [T, H_v, K] is [T * H_qk, r, K].

cpu_debug=True builds the same program for TileLang's C backend (tests/kernels/test_bwd_group_sum_cpu.py).
"""

import tilelang
import tilelang.language as T

from ..fwd.fused_fwd import PASS_CONFIGS

BLOCK_ROWS = 32  # (token, query head) rows per CTA: 16 KiB of each fp32 input per group member
THREADS = 128


def gva_group_sum_program(dk: int, dtype: str, block_rows: int = BLOCK_ROWS, cpu_debug: bool = False):
    """TileLang program: (dq_v, dk_v [rows, r, dk] fp32) -> (dq, dk [rows, dk] in dtype), rows = T * H_qk."""
    rows = T.dynamic("rows")
    group = T.dynamic("group")
    acc = "float32"

    @T.prim_func
    def gva_group_sum(
        dq_v: T.Tensor((rows, group, dk), acc),
        dk_v: T.Tensor((rows, group, dk), acc),
        dq: T.Tensor((rows, dk), dtype),
        dk_out: T.Tensor((rows, dk), dtype),
    ):
        with T.Kernel(T.ceildiv(rows, block_rows), threads=THREADS) as (bx,):
            if cpu_debug:
                sum_q = T.alloc_shared((block_rows, dk), acc, scope="shared")
                sum_k = T.alloc_shared((block_rows, dk), acc, scope="shared")
            else:
                sum_q = T.alloc_fragment((block_rows, dk), acc)
                sum_k = T.alloc_fragment((block_rows, dk), acc)
            r0 = bx * block_rows
            for i, j in T.Parallel(block_rows, dk):
                sum_q[i, j] = 0.0
                sum_k[i, j] = 0.0
            for m in T.serial(group):
                for i, j in T.Parallel(block_rows, dk):
                    if r0 + i < rows:
                        sum_q[i, j] = sum_q[i, j] + dq_v[r0 + i, m, j]
                        sum_k[i, j] = sum_k[i, j] + dk_v[r0 + i, m, j]
            for i, j in T.Parallel(block_rows, dk):
                if r0 + i < rows:
                    dq[r0 + i, j] = T.cast(sum_q[i, j], dtype)
                    dk_out[r0 + i, j] = T.cast(sum_k[i, j], dtype)

    return gva_group_sum


gva_group_sum_kernel = tilelang.jit(gva_group_sum_program, pass_configs=PASS_CONFIGS)
