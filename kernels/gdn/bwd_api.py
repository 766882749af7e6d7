"""Host entry points of the TileLang backward stages (issue 6), one per stage as they land.

Stage 1 (gdn/bwd/dstate_chain.py): the reverse chain of state gradients and dv. The per-chunk gradient
stage (dq, dk, dbeta, dg from S_c and dS'_c) and the autograd wiring come next; until then
gdn/autograd.py differentiates with the torch chunk-form backward (gdn/bwd_chunked.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .api import _TL_DTYPE, _dummy_state, _plan, pack_tokens
from .checks import HEAD_DIM, check_fwd_args
from .plan import BLOCK_V_CHOICES, CHUNK, choose_block_v


class DStateOutput(NamedTuple):
    """ds_next [num_chunks,H_v,K,V] fp32: the gradient of the state after each chunk, chunks of all
    sequences in order; dv [B,T,H_v,V] fp32; dh0 [N,H_v,K,V] fp32."""

    ds_next: torch.Tensor
    dv: torch.Tensor
    dh0: torch.Tensor


def chunk_bwd_dstate(
    q: torch.Tensor,
    k: torch.Tensor,
    g_cumsum: torch.Tensor,
    beta: torch.Tensor,
    A: torch.Tensor,
    do: torch.Tensor,
    dht: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    block_v: int | None = None,
) -> DStateOutput:
    """Stage 1 of the backward on the GPU. g_cumsum [B,T,H_v] (chunk-local) and A [B,T,H_v,64] (the
    gate-free A0) are the forward's outputs; do is like v; dht [N,H_v,K,V] fp32 optional."""
    shape = check_fwd_args(q, k, do, g_cumsum, beta, None, cu_seqlens)
    b, t, h_v = shape.batch, shape.seqlen, shape.h_v
    if A.shape != (b, t, h_v, CHUNK) or A.dtype != q.dtype:
        raise ValueError(f"A must be [B,T,H_v,{CHUNK}] in q's dtype (the forward's a0), got "
                         f"{tuple(A.shape)} {A.dtype}")
    if block_v is not None and block_v not in BLOCK_V_CHOICES:
        raise ValueError(f"block_v must be one of {BLOCK_V_CHOICES}, got {block_v!r}")
    if q.device.type != "cuda":
        raise ValueError(f"qla_kernels runs on CUDA (sm_90a) only; q is on {q.device}")
    plan = _plan(q, cu_seqlens)
    n = plan.num_seqs
    if dht is not None and (dht.shape != (n, h_v, HEAD_DIM, HEAD_DIM) or dht.dtype != torch.float32):
        raise ValueError(f"dht must be [N={n},H_v,K,V] float32, got {tuple(dht.shape)} {dht.dtype}")
    from .bwd.dstate_chain import bwd_dstate_kernel

    scale = HEAD_DIM**-0.5 if scale is None else float(scale)
    bv = block_v or choose_block_v(n, h_v)
    qf, kf, gf, bf, af, dof = (pack_tokens(x) for x in (q, k, g_cumsum, beta, A, do))
    dv = torch.empty(1, b * t, h_v, HEAD_DIM, dtype=torch.float32, device=q.device)
    ds_next = torch.empty(plan.num_chunks, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=q.device)
    dh0 = torch.empty(n, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=q.device)
    use_dht = dht is not None
    dht_ = dht.contiguous() if use_dht else _dummy_state(h_v, q.device)
    kernel = bwd_dstate_kernel(HEAD_DIM, HEAD_DIM, scale, _TL_DTYPE[q.dtype], use_dht, bv)
    kernel(qf, kf, gf.float(), bf.float(), af, dof, dht_, plan.cu_seqlens, plan.chunk_offsets, dv, ds_next, dh0)
    return DStateOutput(ds_next=ds_next, dv=dv.view(b, t, h_v, HEAD_DIM), dh0=dh0)
