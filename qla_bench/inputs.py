"""Canonical random inputs, one generator per (workload, seed). Never zeros, never constants.

q, k: L2-normalised once here (outside any timed region) and stored in the workload dtype; v and do
in that dtype; log gate g, beta, h0, dht in fp32. Gate recipes (workload.InputRecipe):
- 'flashqla': logsigmoid(randn) / 16 (FlashQLA's tests), with a fraction of heads at g = 0 exactly;
- 'strong': an A_log-style gate g = -exp(A_h) * softplus(randn) with exp(A_h) spread over [1, 8]
  across heads, so the strongest heads reach g ~ -20 per token; the same fraction of g = 0 heads;
- 'zero': every head g = 0 (no decay at all: the case context parallelism must keep exact).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backends.base import GDNInputs
from .workload import Workload, cu_seqlens_of

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def zero_gate_heads(h_v: int, frac: float, gen: torch.Generator) -> torch.Tensor:
    """Indices of the value heads whose gate is exactly 0 (chosen at random, count = round(frac*h_v))."""
    n = round(frac * h_v)
    return torch.randperm(h_v, generator=gen)[:n]


def make_gate(recipe: str, t: int, h_v: int, frac: float, gen: torch.Generator) -> torch.Tensor:
    """Log gate [1, T, H_v] in fp32 (on CPU; the caller moves it)."""
    if recipe == "zero":
        return torch.zeros(1, t, h_v)
    x = torch.randn(1, t, h_v, generator=gen)
    if recipe == "flashqla":
        g = F.logsigmoid(x) / 16
    elif recipe == "strong":
        a = torch.linspace(0.0, torch.log(torch.tensor(8.0)).item(), h_v)
        g = -torch.exp(a)[None, None, :] * F.softplus(x)
    else:
        raise ValueError(f"unknown gate recipe {recipe!r}")
    g[..., zero_gate_heads(h_v, frac, gen)] = 0.0
    return g


def make_inputs(
    workload: Workload, device: str | torch.device = "cpu", seed: int | None = None, with_grads: bool = False
) -> GDNInputs:
    """Draw the inputs of one workload. Same (workload, seed) -> same tensors on a given device type.

    Random draws happen on the CPU with a seeded generator for the small tensors and on the target
    device for the large ones (fast on a GPU); a config's seed comes from workload.seed().
    """
    seed = workload.seed() if seed is None else seed
    device = torch.device(device)
    dtype = _DTYPES[workload.recipe.dtype]
    t, h_qk, h_v, kd, vd = workload.total_tokens, workload.heads.h_qk, workload.heads.h_v, workload.k, workload.v
    n = workload.n_seqs
    cpu_gen = torch.Generator().manual_seed(seed)
    dev_gen = torch.Generator(device=device).manual_seed(seed + 1)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=dev_gen, device=device, dtype=torch.float32)

    q = F.normalize(randn(1, t, h_qk, kd), p=2, dim=-1).to(dtype)
    k = F.normalize(randn(1, t, h_qk, kd), p=2, dim=-1).to(dtype)
    v = randn(1, t, h_v, vd).to(dtype)
    g = make_gate(workload.recipe.gate, t, h_v, workload.recipe.zero_gate_frac, cpu_gen).to(device)
    beta = torch.sigmoid(torch.randn(1, t, h_v, generator=cpu_gen)).to(device)
    h0 = randn(n, h_v, kd, vd)
    cu = torch.tensor(cu_seqlens_of(workload.seqlens), dtype=torch.int64, device=device)
    do = randn(1, t, h_v, vd).to(dtype) if with_grads else None
    dht = randn(n, h_v, kd, vd) if with_grads else None
    return GDNInputs(
        q=q, k=k, v=v, g=g, beta=beta, h0=h0, cu_seqlens=cu, scale=kd**-0.5, do=do, dht=dht, workload=workload
    )
