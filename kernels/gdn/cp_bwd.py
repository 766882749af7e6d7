"""Intra-card context parallelism for the backward's two serial chains (stages 0 and 1 of bwd_api).

Few long sequences leave the backward's chains with a handful of CTAs: at 2/4 x 32768 tokens stage 0 (the
states S_c at every chunk start) and stage 1 (the reverse chain of state gradients dS') were ~2.3 of the
2.9 ms (NOTES.md, session 9). Both chains are affine in their carried state, so the forward's pieces
(cp_plan.py) and its transition products carry over:

- stage 0 is the forward over the pieces: the state pass gives every piece's [h | M] (S_end = M S_start +
  h), the combine every piece's S_start, and the state-storing forward then walks the pieces side by side;
- stage 1 runs backwards through the same transitions, transposed: with local_p the gradient at piece p's
  start when the gradient at its end is zero, dS_start(p) = local_p + M_p^T dS_end(p), and
  dS_end(p) = dS_start(p + 1) (dht for a sequence's last piece). So: the chain over every piece from zero
  (pass A, its per-piece start values are local_p), the combine run over each sequence's pieces last to
  first with [local | M^T], then the chain again from every piece's exact dS_end (pass B), which writes
  dS' of every chunk and, for a sequence's first piece, dh0.

Exact like the forward's CP: M is computed for every piece that does not decay; the state pass writes M = 0
only where the piece's summed log gate is at most fused_fwd_ws.SKIP_M_LOG_DECAY (its norm is then below
exp(-30) for unit-norm keys). No new kernels: the launchers are arguments, so this orchestration runs on a
CPU against float64 stand-ins (tests/kernels/test_cp_bwd.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .cp import Combine, StatePass, combine
from .cp_plan import CPPlan

StateStoringWalk = Callable[[torch.Tensor, torch.Tensor], None]
"""(piece cu_seqlens [P+1], piece initial states [P, H_v, K, V] fp32) -> None: writes every chunk's start
state (the launcher owns the states tensor)."""

ChainOverPieces = Callable[["torch.Tensor | None"], tuple[torch.Tensor, torch.Tensor]]
"""(the gradient at every piece's end [P, H_v, K, V] fp32, or None for zero) -> (dS' of every chunk
[num_chunks, H_v, K, V], the gradient at every piece's start [P, H_v, K, V])."""


def states_cp(
    cp: CPPlan,
    h0: torch.Tensor | None,
    state_pass: StatePass,
    walk: StateStoringWalk,
    combine_fn: Combine | None = None,
) -> torch.Tensor:
    """Stage 0 over the pieces; returns the state pass's [h | M] [P, H_v, K, 2V] for stage 1."""
    _require_pieces(cp)
    hm = state_pass(cp.cu_seqlens)
    walk(cp.cu_seqlens, (combine_fn or combine)(cp, hm, h0))
    return hm


def dstate_cp(
    cp: CPPlan,
    hm: torch.Tensor,
    dht: torch.Tensor | None,
    chain: ChainOverPieces,
    combine_fn: Combine | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 over the pieces: (dS' of every chunk, dh0 [N, H_v, K, V]) from stage 0's [h | M]."""
    _require_pieces(cp)
    v = hm.shape[-1] // 2
    _, local = chain(None)
    rev = cp.reverse_order
    # position r of a sequence's block holds its (last - r)-th piece: the forward combine's recurrence
    # init[r + 1] = M'_r init[r] + h'_r from init[first] = dht is then dS_end of that piece
    hm_rev = torch.cat([local[rev], hm[rev][..., v:].transpose(-1, -2)], dim=-1)
    ends = (combine_fn or combine)(cp, hm_rev, dht)[rev]
    ds_next, starts = chain(ends)
    return ds_next, starts[cp.first_piece]


def _require_pieces(cp: CPPlan) -> None:
    if not cp.enabled or cp.reverse_order is None or cp.first_piece is None:
        raise ValueError("the backward's CP needs a CP plan with pieces (cp_plan.plan_cp decided against CP)")
