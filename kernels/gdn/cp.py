"""Intra-card context parallelism for the forward (off by default; kernels/NOTES.md, v5 and session 7): long
sequences are cut
into pieces of L chunks (cp_plan.py) that run side by side, each from the exact state at its start.

Three steps, all on the device and with no host sync (the plan is built once per cu_seqlens):
1. prep: one pass over every piece from S = 0 (its own end state h) and from S = I with V = 0 (its
   transition M, so that S_end = M S_start + h); the warp-specialised kernel's state_pass build;
2. combine: walk each sequence's pieces in order, S_{p+1} = M_p S_p + h_p, starting from the
   sequence's initial state (fp32 batched GEMMs: one per link on views for short chains, one per position
   over index tensors for long ones; or one kernel, fwd/cp_combine.py, with $QLA_CP_COMBINE=kernel);
3. the fused forward over the pieces as if they were sequences, each from its S_p; the final state of a
   sequence is that of its last piece.
Exact for every head (decaying or not): no gate-driven truncation of the history.

The launchers are arguments so the orchestration runs on a CPU against float64 stand-ins
(tests/kernels/test_cp.py); api.py passes the TileLang kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .cp_plan import CPPlan

StatePass = Callable[[torch.Tensor], torch.Tensor]
"""piece cu_seqlens [P+1] -> hm [P, H_v, K, 2V] fp32: [h | M] per piece."""

FusedOverPieces = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(piece cu_seqlens [P+1], piece initial states [P, H_v, K, V] fp32) -> (o, piece end states [P, H_v, K, V])."""

Combine = Callable[["CPPlan", torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""(plan, hm, h0 or None) -> the initial state of every piece [P, H_v, K, V] fp32."""


# Up to this many links the combine runs one batched GEMM per link on views of hm and init (two kernel
# launches a link); beyond it, one gather-GEMM-scatter per position over index tensors (about six launches
# a position, whatever the number of sequences).
MAX_VIEW_LINKS = 64


def combine(
    cp: CPPlan, hm: torch.Tensor, h0: torch.Tensor | None, max_view_links: int = MAX_VIEW_LINKS
) -> torch.Tensor:
    """Initial state of every piece [P, H_v, K, V] from the prep pass's [h | M] and the sequences' h0.

    Each link is S_{p+1} = M_p S_p + h_p. Launch-bound on the GPU (the GEMMs are 128 x 128 x 128 per head),
    so the short chains CP plans use are walked link by link on views (baddbmm into init[p + 1]), without
    the gathers and scatters of the index-tensor form. No autograd: hm comes from a kernel and init only
    feeds the fused kernel (which autograd does not see either), and `out=` refuses a graph when h0
    requires grad."""
    with torch.no_grad():
        return _combine(cp, hm, h0, max_view_links)


def _combine(cp: CPPlan, hm: torch.Tensor, h0: torch.Tensor | None, max_view_links: int) -> torch.Tensor:
    pieces, h_v, k, two_v = hm.shape
    v = two_v // 2
    if k != v:
        raise ValueError(f"context parallelism needs K == V (the transition is K x K), got K={k}, V={v}")
    h, m = hm[..., :v], hm[..., v:]
    init = torch.zeros(pieces, h_v, k, v, dtype=torch.float32, device=hm.device)
    if h0 is not None:
        init[cp.first_piece] = h0.float()
    if cp.host_links and len(cp.host_links) <= max_view_links:
        for piece in cp.host_links:
            torch.baddbmm(h[piece], m[piece], init[piece], out=init[piece + 1])
        return init
    for sel in cp.links:
        init[sel + 1] = torch.matmul(m[sel], init[sel]) + h[sel]
    return init


def run_cp(
    cp: CPPlan, h0: torch.Tensor | None, state_pass: StatePass, fused: FusedOverPieces,
    combine_fn: Combine | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, final_state [N, H_v, K, V]) of the whole batch, computed piece-parallel. combine_fn replaces the
    host walk (combine) with another implementation of it (api: the one-kernel combine)."""
    if not cp.enabled or cp.last_piece is None:
        raise ValueError("run_cp needs a CP plan with pieces (cp_plan.plan_cp decided against CP)")
    hm = state_pass(cp.cu_seqlens)
    init = (combine_fn or combine)(cp, hm, h0)
    o, piece_states = fused(cp.cu_seqlens, init)
    return o, cp.final_states(piece_states)
