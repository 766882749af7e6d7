"""torch.autograd for the GDN forward: the TileLang forward, then the chunk-form backward
(bwd_chunked.py; the TileLang backward kernels will take its place behind the same Function).

The forward keeps what the backward needs: q, k, v, beta, the chunk-local g_cumsum, A0 and h0 (no
per-chunk states: the backward recomputes them).
"""

from __future__ import annotations

import torch

from . import api
from .bwd_chunked import chunk_gated_delta_rule_bwd


class ChunkGatedDeltaRule(torch.autograd.Function):
    """(q, k, v, g, beta, scale, initial_state, cu_seqlens) -> (o, final_state), differentiable in q, k,
    v, g (the log gate), beta and initial_state."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, cu_seqlens):
        out = api.chunk_gated_delta_rule_fwd(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens, output_final_state=True
        )
        ctx.save_for_backward(q, k, v, out.g_cumsum, beta, out.a0, initial_state, cu_seqlens)
        ctx.scale = scale
        ctx.g_dtype = g.dtype
        return out.o, out.final_state

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g_cumsum, beta, a0, h0, cu_seqlens = ctx.saved_tensors
        grads = chunk_gated_delta_rule_bwd(
            q, k, v, g_cumsum, beta, a0, do, dht, ctx.scale, h0, cu_seqlens
        )
        dh0 = grads.dh0.to(h0.dtype) if h0 is not None else None
        return (grads.dq, grads.dk, grads.dv, grads.dg.to(ctx.g_dtype), grads.dbeta.to(beta.dtype), None, dh0,
                None)
