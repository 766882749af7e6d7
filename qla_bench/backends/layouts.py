"""Pure layout conversions between qla-bench's canonical tensors and each library's conventions.

Canonical (FLA layout): q, k [1,T,H_qk,K]; v [1,T,H_v,V]; g (natural-log gate) and beta [1,T,H_v];
state [N,H_v,K,V]. Adapters call these in prepare() (untimed) or outputs() (after timing), never in
run(). Every function here works on CPU so round trips are tested without a GPU.
"""

from __future__ import annotations

import torch


def state_kv_to_vk(state: torch.Tensor) -> torch.Tensor:
    """[N,H,K,V] -> [N,H,V,K], contiguous (FlashInfer reads its state V-first)."""
    _check_state(state)
    return state.transpose(-1, -2).contiguous()


def state_vk_to_kv(state: torch.Tensor) -> torch.Tensor:
    """[N,H,V,K] -> [N,H,K,V], contiguous (FlashInfer's final state back to canonical)."""
    _check_state(state)
    return state.transpose(-1, -2).contiguous()


def log_gate_to_linear(g: torch.Tensor) -> torch.Tensor:
    """alpha = exp(g) in fp32: FlashInfer's linear gate. A log gate passed as alpha runs silently wrong."""
    if not g.is_floating_point():
        raise TypeError(f"gate must be floating point, got {g.dtype}")
    return torch.exp(g.to(torch.float32)).contiguous()


def drop_batch(x: torch.Tensor) -> torch.Tensor:
    """[1,T,...] -> [T,...] as a view (varlen libraries that take packed tokens without a batch dim)."""
    if x.dim() < 2 or x.shape[0] != 1:
        raise ValueError(f"expected a [1, T, ...] varlen tensor, got shape {tuple(x.shape)}")
    return x[0]


def add_batch(x: torch.Tensor) -> torch.Tensor:
    """[T,...] -> [1,T,...] as a view (back to canonical)."""
    return x.unsqueeze(0)


def _check_state(state: torch.Tensor) -> None:
    if state.dim() != 4:
        raise ValueError(f"expected a state [N, H, D1, D2], got shape {tuple(state.shape)}")
