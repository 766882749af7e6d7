"""Agb from the stored A0 (gdn/bwd/agb.py), run on the CPU through TileLang's C backend against float64.

Ragged sequences (partial last chunks, one of a single token), a head at g = 0 and one of strong decay: every
row is written (the output starts as NaN), columns past a sequence's end are zero, and the values are
Gamma o A0 diag(beta) with Gamma from the chunk-local log-gate cumsum.
"""

import importlib.util
import itertools
import shutil

import pytest
import torch

if importlib.util.find_spec("tilelang") is None:
    pytest.skip("tilelang is not installed", allow_module_level=True)
if shutil.which("g++") is None:
    pytest.skip("TileLang's C backend needs g++", allow_module_level=True)

import tilelang

from qla_kernels.gdn.bwd.agb import agb_from_a0_program
from qla_kernels.gdn.fwd.fused_fwd import PASS_CONFIGS
from qla_kernels.gdn.plan import CHUNK, build_plan_from_list


@pytest.fixture(scope="module")
def kernel():
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    return tilelang.compile(agb_from_a0_program("float32", cpu_debug=True), target="c", pass_configs=cfg)


def _reference(a0, gc, beta, cu):
    """Gamma o A0 diag(beta) chunk by chunk in float64; zero past each sequence's end."""
    out = torch.zeros_like(a0, dtype=torch.float64)
    for s, e in itertools.pairwise(cu):
        for t0 in range(s, e, CHUNK):
            n = min(CHUNK, e - t0)
            g = gc[0, t0 : t0 + n].double()  # [n, H]
            low = torch.tril(torch.ones(n, n, dtype=torch.float64))[..., None]
            gam = torch.exp(g[:, None, :] - g[None, :, :]) * low
            b = beta[0, t0 : t0 + n].double()  # [n, H]
            out[0, t0 : t0 + n, :, :n] = a0[0, t0 : t0 + n, :, :n].double() * gam.permute(0, 2, 1) * b.T[None]
    return out


def test_agb_matches_float64(kernel):
    cu = [0, 1, 70, 70 + 128, 70 + 128 + 37]
    t, h = cu[-1], 3
    gen = torch.Generator().manual_seed(5)
    a0 = torch.randn(1, t, h, CHUNK, generator=gen)
    g = -torch.rand(1, t, h, generator=gen) * 0.2
    g[..., 0] = 0.0  # no decay
    g[..., 2] = -torch.rand(1, t, generator=gen) * 5.0  # strong decay
    gc = torch.zeros_like(g)  # the chunk-local cumsum, as stage 1 writes it
    for s, e in itertools.pairwise(cu):
        for t0 in range(s, e, CHUNK):
            gc[0, t0 : min(e, t0 + CHUNK)] = g[0, t0 : min(e, t0 + CHUNK)].cumsum(0)
    beta = torch.rand(1, t, h, generator=gen)
    plan = build_plan_from_list(cu, "cpu")
    out = torch.full_like(a0, float("nan"))
    kernel(a0, gc, beta, plan.cu_seqlens, plan.chunk_indices, out)
    want = _reference(a0, gc, beta, cu)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-6)
    assert (out[0, 69, :, 5:] == 0).all()  # token 69: row 4 of its sequence's second chunk (5 tokens long)
    assert (out[0, 0, :, 1:] == 0).all()  # the one-token sequence
