"""Argument validation for the GDN forward: every unsupported input is a ValueError before any launch.

Kept free of CUDA so it runs (and is tested) on CPU. A silently wrong result for an unsupported shape
is the failure mode this module exists to prevent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEAD_DIM = 128
QKV_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class FwdShape:
    """Validated problem shape. ``batch`` is B of the inputs; ``num_seqs`` is N of the states."""

    batch: int
    seqlen: int
    h_qk: int
    h_v: int
    num_seqs: int
    varlen: bool

    @property
    def gva_ratio(self) -> int:
        return self.h_v // self.h_qk


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_fwd_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    state_v_first: bool = False,
) -> FwdShape:
    """Check dtypes, shapes, devices and cu_seqlens; return the validated shape.

    cu_seqlens values are not read here (that would be a host sync per call); plan.py checks them once
    per cu_seqlens tensor when it builds the plan.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
    _need(q.dim() == 4, f"q must be [B,T,H_qk,128], got shape {tuple(q.shape)}")
    _need(k.shape == q.shape, f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    _need(v.dim() == 4, f"v must be [B,T,H_v,128], got shape {tuple(v.shape)}")
    b, t, h_qk, dk = q.shape
    _need(dk == HEAD_DIM, f"q/k head dim must be {HEAD_DIM} (K = 128 only), got {dk}")
    _need(v.shape[:2] == (b, t), f"v must share q's B,T = {(b, t)}, got {tuple(v.shape[:2])}")
    h_v, dv = v.shape[2], v.shape[3]
    _need(dv == HEAD_DIM, f"v head dim must be {HEAD_DIM} (V = 128 only), got {dv}")
    _need(h_qk > 0 and h_v % h_qk == 0, f"H_v={h_v} must be a positive multiple of H_qk={h_qk}")
    _need(t >= 1 and b >= 1, f"need B >= 1 and T >= 1, got B={b}, T={t}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _need(x.dtype in QKV_DTYPES, f"{name} dtype must be bfloat16 or float16, got {x.dtype}")
    _need(k.dtype == q.dtype and v.dtype == q.dtype, f"q, k, v must share a dtype, got {q.dtype}, "
          f"{k.dtype}, {v.dtype}")
    for name, x in (("g", g), ("beta", beta)):
        _need(x.shape == (b, t, h_v), f"{name} must be [B,T,H_v] = {(b, t, h_v)}, got {tuple(x.shape)}")
        _need(x.dtype == torch.float32, f"{name} dtype must be float32, got {x.dtype}")
    devs = {x.device for x in (q, k, v, g, beta)}
    _need(len(devs) == 1, f"q, k, v, g, beta must be on one device, got {sorted(map(str, devs))}")

    n = _check_cu_seqlens_tensor(cu_seqlens, b, q.device)

    if initial_state is not None:
        _need(isinstance(initial_state, torch.Tensor), "initial_state must be a torch.Tensor or None")
        want = (n, h_v, HEAD_DIM, HEAD_DIM)
        layout = "[N,H_v,V,K]" if state_v_first else "[N,H_v,K,V]"
        _need(tuple(initial_state.shape) == want,
              f"initial_state must be {layout} = {want}, got {tuple(initial_state.shape)}")
        _need(initial_state.dtype == torch.float32,
              f"initial_state dtype must be float32, got {initial_state.dtype}")
        _need(initial_state.device == q.device,
              f"initial_state must be on q's device {q.device}, got {initial_state.device}")
    return FwdShape(batch=b, seqlen=t, h_qk=h_qk, h_v=h_v, num_seqs=n, varlen=cu_seqlens is not None)


def _check_cu_seqlens_tensor(cu_seqlens: torch.Tensor | None, b: int, device: torch.device) -> int:
    """Type/shape/device of cu_seqlens (values are checked once per tensor in plan.py); returns N."""
    if cu_seqlens is None:
        return b
    _need(isinstance(cu_seqlens, torch.Tensor), "cu_seqlens must be a torch.Tensor or None")
    _need(b == 1, f"cu_seqlens needs B = 1 (varlen packs sequences along T), got B = {b}")
    _need(cu_seqlens.dtype in (torch.int32, torch.int64),
          f"cu_seqlens dtype must be int32 or int64, got {cu_seqlens.dtype}")
    _need(cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2,
          f"cu_seqlens must be 1-D with N+1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}")
    _need(cu_seqlens.device == device, f"cu_seqlens must be on q's device {device}, got {cu_seqlens.device}")
    return cu_seqlens.numel() - 1


def check_kkt_args(
    k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor | None = None
) -> FwdShape:
    """Checks for stage 1 alone (chunk_kkt_solve): k [B,T,H_qk,128] bf16/fp16, g and beta [B,T,H_v] fp32."""
    for name, t in (("k", k), ("g", g), ("beta", beta)):
        _need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
    _need(k.dim() == 4 and k.shape[-1] == HEAD_DIM, f"k must be [B,T,H_qk,128], got shape {tuple(k.shape)}")
    _need(k.dtype in QKV_DTYPES, f"k dtype must be bfloat16 or float16, got {k.dtype}")
    b, t, h_qk, _ = k.shape
    _need(t >= 1 and b >= 1, f"need B >= 1 and T >= 1, got B={b}, T={t}")
    _need(g.dim() == 3 and g.shape[:2] == (b, t), f"g must be [B,T,H_v] with B,T = {(b, t)}, got {tuple(g.shape)}")
    h_v = g.shape[2]
    _need(h_qk > 0 and h_v % h_qk == 0, f"H_v={h_v} must be a positive multiple of H_qk={h_qk}")
    for name, x in (("g", g), ("beta", beta)):
        _need(x.shape == (b, t, h_v), f"{name} must be [B,T,H_v] = {(b, t, h_v)}, got {tuple(x.shape)}")
        _need(x.dtype == torch.float32, f"{name} dtype must be float32, got {x.dtype}")
    devs = {x.device for x in (k, g, beta)}
    _need(len(devs) == 1, f"k, g, beta must be on one device, got {sorted(map(str, devs))}")
    n = _check_cu_seqlens_tensor(cu_seqlens, b, k.device)
    return FwdShape(batch=b, seqlen=t, h_qk=h_qk, h_v=h_v, num_seqs=n, varlen=cu_seqlens is not None)


def check_cu_seqlens_values(cu: list[int], total_tokens: int) -> None:
    """Values check, run once per cu_seqlens tensor (plan.py): starts at 0, rises strictly, ends at T."""
    _need(len(cu) >= 2, "cu_seqlens must have at least 2 entries")
    _need(cu[0] == 0, f"cu_seqlens must start at 0, got {cu[0]}")
    bad = [i for i in range(1, len(cu)) if cu[i] <= cu[i - 1]]
    _need(not bad, f"cu_seqlens must be strictly increasing (no empty sequences); "
          f"cu_seqlens[{bad[0] if bad else 0}] >= cu_seqlens[{bad[0] + 1 if bad else 0}]")
    _need(cu[-1] == total_tokens, f"cu_seqlens must end at T={total_tokens}, got {cu[-1]}")
