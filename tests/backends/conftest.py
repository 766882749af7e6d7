"""Fixtures for adapter tests: small canonical inputs on CPU, fake library modules, a tiny recurrence.

The adapters import their libraries lazily by module name, so a fake module placed in sys.modules
stands in for fla / flash_qla / flashinfer and lets prepare(), run() and outputs() run without a GPU.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from qla_bench.backends.base import GDNInputs
from qla_bench.workload import HeadConfig, Workload


def _make_inputs(
    seqlens: tuple[int, ...] = (5, 3),
    h_qk: int = 1,
    h_v: int = 2,
    k_dim: int = 4,
    v_dim: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> GDNInputs:
    gen = torch.Generator().manual_seed(seed)
    t = sum(seqlens)
    n = len(seqlens)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    q = F.normalize(randn(1, t, h_qk, k_dim), dim=-1).to(dtype)
    k = F.normalize(randn(1, t, h_qk, k_dim), dim=-1).to(dtype)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int64)
    return GDNInputs(
        q=q,
        k=k,
        v=randn(1, t, h_v, v_dim).to(dtype),
        g=F.logsigmoid(randn(1, t, h_v)) / 4,
        beta=torch.sigmoid(randn(1, t, h_v)),
        h0=randn(n, h_v, k_dim, v_dim),
        cu_seqlens=cu,
        scale=k_dim**-0.5,
        do=randn(1, t, h_v, v_dim).to(dtype),
        dht=randn(n, h_v, k_dim, v_dim),
        workload=Workload(HeadConfig(h_qk, h_v), seqlens, k=k_dim, v=v_dim),
    )


@pytest.fixture(scope="session")
def make_inputs() -> Callable[..., GDNInputs]:
    """Factory of canonical GDNInputs on CPU (bf16 q/k/v/do, fp32 g/beta/h0/dht, int64 cu_seqlens)."""
    return _make_inputs


@pytest.fixture
def install_module(monkeypatch: pytest.MonkeyPatch) -> Callable[..., types.ModuleType]:
    """install_module('a.b.c', attr=value, ...) puts a fake module (and empty parents) in sys.modules."""

    def install(name: str, **attrs: object) -> types.ModuleType:
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if not isinstance(sys.modules.get(parent), types.ModuleType):
                monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
        mod = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(mod, key, value)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    return install


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Callable[[tuple[int, int]], torch.device]:
    """Pretend torch sees a CUDA GPU of the given compute capability; returns a cuda device object."""

    def pretend(capability: tuple[int, int] = (9, 0)) -> torch.device:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        return torch.device("cuda", 0)

    return pretend


def naive_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    h0: torch.Tensor,
    cu_seqlens: list[int],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token GDN in the inputs' dtype, canonical layout, differentiable.

    Returns (o [1,T,H_v,V], final state [N,H_v,K,V]). Written from design/gdn.md, not from any library.
    """
    q, k, v, g, beta = q[0], k[0], v[0], g[0], beta[0]
    r = v.shape[1] // q.shape[1]
    outs, finals = [], []
    for n in range(len(cu_seqlens) - 1):
        seq_o, seq_s = [], []
        for h in range(v.shape[1]):
            s = h0[n, h]  # [K, V]
            head_o = []
            for t in range(cu_seqlens[n], cu_seqlens[n + 1]):
                kt, qt = k[t, h // r], q[t, h // r]
                s = s * torch.exp(g[t, h])
                s = s + beta[t, h] * torch.outer(kt, v[t, h] - s.T @ kt)
                head_o.append(scale * (s.T @ qt))
            seq_o.append(torch.stack(head_o))  # [L, V]
            seq_s.append(s)
        outs.append(torch.stack(seq_o, dim=1))  # [L, H_v, V]
        finals.append(torch.stack(seq_s))
    return torch.cat(outs)[None], torch.stack(finals)


def _naive_gdn(inputs: GDNInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """naive_recurrence in float64 on CPU for canonical inputs."""
    x = {n: getattr(inputs, n).detach().double().cpu() for n in ("q", "k", "v", "g", "beta", "h0")}
    return naive_recurrence(**x, cu_seqlens=inputs.cu_seqlens.tolist(), scale=inputs.scale)


@pytest.fixture(scope="session")
def naive_gdn() -> Callable[[GDNInputs], tuple[torch.Tensor, torch.Tensor]]:
    return _naive_gdn


def _naive_gdn_grads(inputs: GDNInputs) -> dict[str, torch.Tensor]:
    """Float64 CPU outputs and gradients of sum(o * do) + sum(final * dht) for canonical inputs."""
    names = ("q", "k", "v", "g", "beta", "h0")
    x = {n: getattr(inputs, n).detach().double().cpu().requires_grad_(True) for n in names}
    o, ht = naive_recurrence(**x, cu_seqlens=inputs.cu_seqlens.tolist(), scale=inputs.scale)
    loss = (o * inputs.do.double().cpu()).sum()
    if inputs.dht is not None:
        loss = loss + (ht * inputs.dht.double().cpu()).sum()
    loss.backward()
    grads = {f"d{n}": x[n].grad for n in names}
    grads["dh0"] = grads.pop("dh0")
    return {"o": o.detach(), "final_state": ht.detach(), **grads}


@pytest.fixture(scope="session")
def naive_gdn_grads() -> Callable[[GDNInputs], dict[str, torch.Tensor]]:
    return _naive_gdn_grads
