"""The chunk-form backward (gdn/bwd_chunked.py) against float64 autograd through the reference.

With float64 inputs and an exact A0, the chunk formulas must agree with autograd to rounding (every
term of the derivation is checked: states, gates, the A0 inverse, GVA sums, ragged tails, dh0, dht)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from qla_bench.reference import chunk_gated_delta_rule_ref_grads
from qla_kernels.gdn.bwd_chunked import chunk_gated_delta_rule_bwd, stage1_reference

D = 16


def make(b, t, h_qk, h_v, seed, strong=True):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(b, t, h_qk, D, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(b, t, h_qk, D, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(b, t, h_v, D, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(b, t, h_v, generator=gen, dtype=torch.float64)) / 8
    g[..., 0] = 0.0
    if strong and h_v > 2:
        g[..., 1] = -20.0 + torch.rand(b, t, generator=gen, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(b, t, h_v, generator=gen, dtype=torch.float64))
    do = torch.randn(b, t, h_v, D, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta, do, gen


CASES = [
    # (B, T, h_qk, h_v, cu_seqlens or None, h0, dht)
    (1, 200, 1, 4, [0, 200], True, True),
    (1, 300, 2, 6, [0, 1, 64, 65, 130, 300], True, False),  # ragged, T = 1, GVA 3
    (2, 130, 2, 4, None, False, True),  # fixed-length batch, no h0
    (1, 1, 1, 2, [0, 1], True, True),  # T = 1
    (1, 256, 1, 1, [0, 256], False, False),  # one head that never decays
]


@pytest.mark.parametrize(("b", "t", "h_qk", "h_v", "cu", "with_h0", "with_dht"), CASES)
def test_chunk_bwd_matches_float64_autograd(b, t, h_qk, h_v, cu, with_h0, with_dht):
    q, k, v, g, beta, do, gen = make(b, t, h_qk, h_v, seed=t + h_v)
    n = b if cu is None else len(cu) - 1
    h0 = torch.randn(n, h_v, D, D, generator=gen, dtype=torch.float64) if with_h0 else None
    dht = torch.randn(n, h_v, D, D, generator=gen, dtype=torch.float64) if with_dht else None
    cu_t = None if cu is None else torch.tensor(cu)
    spans = list(itertools.pairwise(cu)) if cu is not None else [(i * t, (i + 1) * t) for i in range(b)]
    gc, a0 = stage1_reference(k, g, beta, spans)
    ref = chunk_gated_delta_rule_ref_grads(q, k, v, g, beta, do, dht, None, h0, cu_t)
    got = chunk_gated_delta_rule_bwd(q, k, v, gc, beta, a0, do, dht, None, h0, cu_t, compute_dtype=torch.float64)
    for name in ("dq", "dk", "dv", "dg", "dbeta") + (("dh0",) if with_h0 else ()):
        want, have = ref[name], getattr(got, name)
        err = ((have - want).norm() / want.norm().clamp_min(1e-300)).item()
        assert err < 1e-9, (name, err)
    if not with_h0:
        assert got.dh0 is None


def test_fp32_compute_is_close():
    q, k, v, g, beta, do, _ = make(1, 192, 2, 4, seed=1)
    cu = torch.tensor([0, 100, 192])
    gc, a0 = stage1_reference(k, g, beta, [(0, 100), (100, 192)])
    ref = chunk_gated_delta_rule_ref_grads(q, k, v, g, beta, do, None, None, None, cu)
    got = chunk_gated_delta_rule_bwd(q.float(), k.float(), v.float(), gc.float(), beta.float(), a0.float(), do.float(),
                                     cu_seqlens=cu)
    assert got.dq.dtype == torch.float32 and got.dg.dtype == torch.float32
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        want, have = ref[name], getattr(got, name).double()
        assert ((have - want).norm() / want.norm()).item() < 1e-4, name


def test_bad_shapes_are_named():
    q, k, v, g, beta, do, _ = make(1, 64, 1, 2, seed=0)
    a0 = torch.zeros(1, 64, 2, 64, dtype=torch.float64)
    with pytest.raises(ValueError, match="g_cumsum and beta"):
        chunk_gated_delta_rule_bwd(q, k, v, g, beta, a0[..., :32], do)
    with pytest.raises(ValueError, match="dht must be"):
        chunk_gated_delta_rule_bwd(q, k, v, g, beta, a0, do, dht=torch.zeros(2, 2, D, D))
    with pytest.raises(ValueError, match="cu_seqlens needs B = 1"):
        chunk_gated_delta_rule_bwd(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1),
                                   g.expand(2, -1, -1), beta.expand(2, -1, -1), a0.expand(2, -1, -1, -1),
                                   do.expand(2, -1, -1, -1), cu_seqlens=torch.tensor([0, 64]))


def test_autograd_function_wires_the_backward(monkeypatch):
    """chunk_gated_delta_rule under autograd: the forward kernel is replaced by a float64 stand-in with
    the same outputs (the TileLang forward needs a GPU), so this checks the Function's plumbing: what it
    saves, the gradient order, dh0, dht and the dtypes."""
    from qla_bench.reference import chunk_gated_delta_rule_ref
    from qla_kernels.gdn import api
    from qla_kernels.gdn.api import FwdOutput, chunk_gated_delta_rule

    q, k, v, g, beta, do, gen = make(1, 150, 1, 3, seed=4)
    h0 = torch.randn(2, 3, D, D, generator=gen, dtype=torch.float64)
    dht = torch.randn(2, 3, D, D, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, 70, 150])

    need_a0_seen = []

    def fake_fwd(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, output_final_state=True,
                 need_a0=True):
        need_a0_seen.append(need_a0)
        o, ht = chunk_gated_delta_rule_ref(q, k, v, g, beta, scale, initial_state, True, cu_seqlens)
        gc, a0 = stage1_reference(k, g, beta, [(0, 70), (70, 150)])
        return FwdOutput(o, ht if output_final_state else None, gc, a0)

    monkeypatch.setattr(api, "chunk_gated_delta_rule_fwd", fake_fwd)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    o, ht = chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu)
    ((o * do).sum() + (ht * dht).sum()).backward()
    ref = chunk_gated_delta_rule_ref_grads(q, k, v, g, beta, do, dht, None, h0, cu)
    for name, leaf in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), leaves):
        err = ((leaf.grad - ref[name]).norm() / ref[name].norm()).item()
        assert err < 1e-4, (name, err)  # the Function's backward computes in fp32
    # no grad needed: the plain forward, no Function
    with torch.no_grad():
        o2, st2 = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)
    assert st2 is None and torch.allclose(o2, o.detach())
    assert need_a0_seen == [True, False]  # the Function's forward keeps A0 for its backward; inference need not
