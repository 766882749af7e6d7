"""Argument validation for the GDN forward: every unsupported input is a ValueError before any launch.

Kept free of CUDA so it runs (and is tested) on CPU. A silently wrong result for an unsupported shape
is the failure mode this module exists to prevent.
"""

from __future__ import annotations

from collections.abc import Callable
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


def _need(cond: bool, msg: str | Callable[[], str]) -> None:
    """Raise ValueError(msg) unless cond. The checks run on every call, so a message that formats
    shapes is passed as a lambda and only built on failure (eager f-strings were ~30 us of a ~170 us
    host-bound call on the H200 host)."""
    if not cond:
        raise ValueError(msg() if callable(msg) else msg)


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
    per cu_seqlens tensor when it builds the plan. Valid arguments take one fused test (_fwd_args_ok);
    only arguments that fail it go through the checks below, which name what is wrong.
    """
    shape = _fwd_args_ok(q, k, v, g, beta, initial_state, cu_seqlens)
    if shape is not None:
        return shape
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _need(
            isinstance(t, torch.Tensor), lambda name=name, t=t: f"{name} must be a torch.Tensor, got {type(t).__name__}"
        )
    _need(q.dim() == 4, lambda: f"q must be [B,T,H_qk,128], got shape {tuple(q.shape)}")
    _need(k.shape == q.shape, lambda: f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    _need(v.dim() == 4, lambda: f"v must be [B,T,H_v,128], got shape {tuple(v.shape)}")
    b, t, h_qk, dk = q.shape
    _need(dk == HEAD_DIM, lambda: f"q/k head dim must be {HEAD_DIM} (K = 128 only), got {dk}")
    _need(v.shape[:2] == (b, t), lambda: f"v must share q's B,T = {(b, t)}, got {tuple(v.shape[:2])}")
    h_v, dv = v.shape[2], v.shape[3]
    _need(dv == HEAD_DIM, lambda: f"v head dim must be {HEAD_DIM} (V = 128 only), got {dv}")
    _need(h_qk > 0 and h_v % h_qk == 0, lambda: f"H_v={h_v} must be a positive multiple of H_qk={h_qk}")
    _need(t >= 1 and b >= 1, lambda: f"need B >= 1 and T >= 1, got B={b}, T={t}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _need(x.dtype in QKV_DTYPES, lambda name=name, x=x: f"{name} dtype must be bfloat16 or float16, got {x.dtype}")
    _need(
        k.dtype == q.dtype and v.dtype == q.dtype,
        lambda: f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}",
    )
    for name, x in (("g", g), ("beta", beta)):
        _need(
            x.shape == (b, t, h_v),
            lambda name=name, x=x: f"{name} must be [B,T,H_v] = {(b, t, h_v)}, got {tuple(x.shape)}",
        )
        _need(x.dtype == torch.float32, lambda name=name, x=x: f"{name} dtype must be float32, got {x.dtype}")
    devs = {x.device for x in (q, k, v, g, beta)}
    _need(len(devs) == 1, lambda: f"q, k, v, g, beta must be on one device, got {sorted(map(str, devs))}")

    n = _check_cu_seqlens_tensor(cu_seqlens, b, q.device)

    if initial_state is not None:
        _need(isinstance(initial_state, torch.Tensor), "initial_state must be a torch.Tensor or None")
        want = (n, h_v, HEAD_DIM, HEAD_DIM)
        layout = "[N,H_v,V,K]" if state_v_first else "[N,H_v,K,V]"
        _need(
            tuple(initial_state.shape) == want,
            lambda: f"initial_state must be {layout} = {want}, got {tuple(initial_state.shape)}",
        )
        _need(
            initial_state.dtype == torch.float32,
            lambda: f"initial_state dtype must be float32, got {initial_state.dtype}",
        )
        _need(
            initial_state.device == q.device,
            lambda: f"initial_state must be on q's device {q.device}, got {initial_state.device}",
        )
    return FwdShape(batch=b, seqlen=t, h_qk=h_qk, h_v=h_v, num_seqs=n, varlen=cu_seqlens is not None)


def _fwd_args_ok(q, k, v, g, beta, initial_state, cu_seqlens) -> FwdShape | None:
    """The shape when every check of check_fwd_args passes, else None (then the detailed checks say
    why). One expression instead of ~25 checks: the checks run on every launch, and on the H200 host
    the forward of a small config is bound by its Python (tests/kernels/test_checks.py keeps the two
    in agreement on every bad input it tries)."""
    tensor = torch.Tensor
    if not (
        isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor)
        and isinstance(g, tensor) and isinstance(beta, tensor)
    ):  # fmt: skip
        return None
    qs, vs = q.shape, v.shape
    if len(qs) != 4 or len(vs) != 4 or k.shape != qs:
        return None
    b, t, h_qk, dk = qs
    bv, tv, h_v, dv = vs
    dt, dev = q.dtype, q.device
    ok = (
        dk == HEAD_DIM and dv == HEAD_DIM and bv == b and tv == t and h_qk > 0 and h_v % h_qk == 0
        and t >= 1 and b >= 1 and dt in QKV_DTYPES and k.dtype == dt and v.dtype == dt
        and g.shape == (b, t, h_v) and beta.shape == (b, t, h_v)
        and g.dtype == torch.float32 and beta.dtype == torch.float32
        and k.device == dev and v.device == dev and g.device == dev and beta.device == dev
    )  # fmt: skip
    if not ok:
        return None
    n = b
    if cu_seqlens is not None:
        if not (
            isinstance(cu_seqlens, tensor) and b == 1 and cu_seqlens.dtype in (torch.int32, torch.int64)
            and cu_seqlens.dim() == 1 and cu_seqlens.device == dev
        ):  # fmt: skip
            return None
        n = cu_seqlens.numel() - 1
        if n < 1:
            return None
    if initial_state is not None and not (
        isinstance(initial_state, tensor) and initial_state.shape == (n, h_v, HEAD_DIM, HEAD_DIM)
        and initial_state.dtype == torch.float32 and initial_state.device == dev
    ):  # fmt: skip
        return None
    return FwdShape(batch=b, seqlen=t, h_qk=h_qk, h_v=h_v, num_seqs=n, varlen=cu_seqlens is not None)


def _check_cu_seqlens_tensor(cu_seqlens: torch.Tensor | None, b: int, device: torch.device) -> int:
    """Type/shape/device of cu_seqlens (values are checked once per tensor in plan.py); returns N."""
    if cu_seqlens is None:
        return b
    _need(isinstance(cu_seqlens, torch.Tensor), "cu_seqlens must be a torch.Tensor or None")
    _need(b == 1, lambda: f"cu_seqlens needs B = 1 (varlen packs sequences along T), got B = {b}")
    _need(
        cu_seqlens.dtype in (torch.int32, torch.int64),
        lambda: f"cu_seqlens dtype must be int32 or int64, got {cu_seqlens.dtype}",
    )
    _need(
        cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2,
        lambda: f"cu_seqlens must be 1-D with N+1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}",
    )
    _need(cu_seqlens.device == device, lambda: f"cu_seqlens must be on q's device {device}, got {cu_seqlens.device}")
    return cu_seqlens.numel() - 1


def check_kkt_args(
    k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor | None = None
) -> FwdShape:
    """Checks for stage 1 alone (chunk_kkt_solve): k [B,T,H_qk,128] bf16/fp16, g and beta [B,T,H_v] fp32."""
    for name, t in (("k", k), ("g", g), ("beta", beta)):
        _need(
            isinstance(t, torch.Tensor), lambda name=name, t=t: f"{name} must be a torch.Tensor, got {type(t).__name__}"
        )
    _need(k.dim() == 4 and k.shape[-1] == HEAD_DIM, lambda: f"k must be [B,T,H_qk,128], got shape {tuple(k.shape)}")
    _need(k.dtype in QKV_DTYPES, lambda: f"k dtype must be bfloat16 or float16, got {k.dtype}")
    b, t, h_qk, _ = k.shape
    _need(t >= 1 and b >= 1, lambda: f"need B >= 1 and T >= 1, got B={b}, T={t}")
    _need(
        g.dim() == 3 and g.shape[:2] == (b, t), lambda: f"g must be [B,T,H_v] with B,T = {(b, t)}, got {tuple(g.shape)}"
    )
    h_v = g.shape[2]
    _need(h_qk > 0 and h_v % h_qk == 0, lambda: f"H_v={h_v} must be a positive multiple of H_qk={h_qk}")
    for name, x in (("g", g), ("beta", beta)):
        _need(
            x.shape == (b, t, h_v),
            lambda name=name, x=x: f"{name} must be [B,T,H_v] = {(b, t, h_v)}, got {tuple(x.shape)}",
        )
        _need(x.dtype == torch.float32, lambda name=name, x=x: f"{name} dtype must be float32, got {x.dtype}")
    devs = {x.device for x in (k, g, beta)}
    _need(len(devs) == 1, lambda: f"k, g, beta must be on one device, got {sorted(map(str, devs))}")
    n = _check_cu_seqlens_tensor(cu_seqlens, b, k.device)
    return FwdShape(batch=b, seqlen=t, h_qk=h_qk, h_v=h_v, num_seqs=n, varlen=cu_seqlens is not None)


def check_cu_seqlens_values(cu: list[int], total_tokens: int) -> None:
    """Values check, run once per cu_seqlens tensor (plan.py): starts at 0, rises strictly, ends at T."""
    _need(len(cu) >= 2, "cu_seqlens must have at least 2 entries")
    _need(cu[0] == 0, lambda: f"cu_seqlens must start at 0, got {cu[0]}")
    bad = [i for i in range(1, len(cu)) if cu[i] <= cu[i - 1]]
    _need(
        not bad,
        lambda: (
            f"cu_seqlens must be strictly increasing (no empty sequences); "
            f"cu_seqlens[{bad[0] if bad else 0}] >= cu_seqlens[{bad[0] + 1 if bad else 0}]"
        ),
    )
    _need(cu[-1] == total_tokens, lambda: f"cu_seqlens must end at T={total_tokens}, got {cu[-1]}")
