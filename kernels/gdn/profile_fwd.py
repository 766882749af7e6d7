"""Where the warp-specialised fused kernel spends its time, measured on the GPU by the kernel itself.

Runs stage 1 and then the profile build of fused_fwd_ws (fused_fwd_ws_program(profile=True)), whose
consumer warpgroups add up clock64 cycles per phase. Returns, per warpgroup and phase, the mean cycles
per chunk over all CTAs, so waits (a warpgroup starved by another) and work (GEMMs, element-wise
passes) can be told apart without a profiler on the host. A development tool: its timings include
the clock reads and are never reported as kernel times.
"""

from __future__ import annotations

import torch

from .api import _TL_DTYPE, _launch_kkt, _plan, pack_tokens, resolve_kkt_impl
from .checks import HEAD_DIM, check_fwd_args


def profile_fused_ws(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    block_v: int,
    rev: int = 4,
) -> dict[str, dict[str, float]]:
    """{warpgroup: {phase: mean cycles per chunk}} for one launch of the ws kernel (revision rev) at
    V-slice block_v."""
    from .fwd.fused_fwd_ws import NUM_PHASES, fused_fwd_ws_kernel, phases

    h_v = check_fwd_args(q, k, v, g, beta, initial_state, cu_seqlens, False).h_v
    plan = _plan(q, cu_seqlens)
    qf, kf, vf, gf, bf = (pack_tokens(x) for x in (q, k, v, g, beta))
    g_cumsum, a0 = _launch_kkt(resolve_kkt_impl(None), kf, gf, bf, plan)
    use_h0 = initial_state is not None
    h0 = initial_state.contiguous() if use_h0 else torch.zeros(1, h_v, HEAD_DIM, HEAD_DIM, device=q.device)
    o = torch.empty_like(vf)
    ht = torch.empty(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=q.device)
    ctas = plan.num_seqs * h_v * (HEAD_DIM // block_v)
    prof = torch.zeros(ctas, 3, NUM_PHASES, dtype=torch.int64, device=q.device)
    kernel = fused_fwd_ws_kernel(HEAD_DIM, HEAD_DIM, HEAD_DIM**-0.5, _TL_DTYPE[q.dtype], use_h0, False, block_v,
                                 True, rev)
    kernel(qf, kf, vf, g_cumsum, bf, a0, h0, plan.cu_seqlens, o, ht, prof)
    torch.cuda.synchronize()
    total = prof.double().sum(0) / (plan.num_chunks * h_v * (HEAD_DIM // block_v))  # per chunk-step
    names = phases(rev)
    return {f"WG{w}": {name: round(total[w, i].item(), 1) for i, name in enumerate(names[w])} for w in range(3)}
