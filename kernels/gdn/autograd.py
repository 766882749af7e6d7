"""torch.autograd for the GDN forward: the TileLang forward, then a backward chosen by $QLA_BWD_IMPL:
"tilelang" (the default on CUDA: the TileLang backward of bwd_api.py, at issue 6's tolerances on the H200
since session 4) or "torch" (the chunk-form backward of bwd_chunked.py, its specification: a Python loop
over chunks, the default on any other device, where the tests run the Function with a stand-in forward).

The forward keeps what the backward needs: q, k, v, beta, the chunk-local g_cumsum, A0 and h0 (no
per-chunk states: the backward recomputes them).
"""

from __future__ import annotations

import torch

from . import api
from .bwd_chunked import chunk_gated_delta_rule_bwd as torch_bwd
from .envvars import env_text

BWD_IMPL_ENV = "QLA_BWD_IMPL"
BWD_IMPLS = ("torch", "tilelang")


def resolve_bwd_impl(device: torch.device | None = None) -> str:
    """$QLA_BWD_IMPL (blank: unset), else "tilelang" for CUDA tensors and "torch" otherwise; anything else
    is a ValueError naming the choices."""
    default = "tilelang" if device is not None and device.type == "cuda" else "torch"
    name = env_text(BWD_IMPL_ENV) or default
    if name not in BWD_IMPLS:
        raise ValueError(f"${BWD_IMPL_ENV} must be one of {list(BWD_IMPLS)}, got {name!r}")
    return name


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
        if resolve_bwd_impl(q.device) == "tilelang":
            from .bwd_api import chunk_gated_delta_rule_bwd as bwd
        else:
            bwd = torch_bwd
        do = do.contiguous()
        dht = dht.contiguous() if dht is not None else None
        grads = bwd(q, k, v, g_cumsum, beta, a0, do, dht, ctx.scale, h0, cu_seqlens)
        dh0 = grads.dh0.to(h0.dtype) if h0 is not None else None
        return (grads.dq, grads.dk, grads.dv, grads.dg.to(ctx.g_dtype), grads.dbeta.to(beta.dtype), None, dh0,
                None)
