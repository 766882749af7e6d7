"""The float64 reference: chunked vs recurrent forms and their autograd gradients agree to ~1e-12."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qla_bench.reference import (
    chunk_gated_delta_rule_ref,
    chunk_gated_delta_rule_ref_grads,
    recurrent_gated_delta_rule_ref,
)


def _inputs(seqlens, h_qk, h_v, kd=32, vd=16, b=1, seed=0, strong=False, h0=True):
    gen = torch.Generator().manual_seed(seed)
    t = sum(seqlens) if b == 1 else seqlens[0]
    q = F.normalize(torch.randn(b, t, h_qk, kd, generator=gen), dim=-1)
    k = F.normalize(torch.randn(b, t, h_qk, kd, generator=gen), dim=-1)
    v = torch.randn(b, t, h_v, vd, generator=gen)
    g = F.logsigmoid(torch.randn(b, t, h_v, generator=gen)) / 4
    g[..., 0] = 0.0  # a g = 0 head
    if strong:
        g[..., -1] = -20.0 * torch.rand(b, t, generator=gen)
    beta = torch.rand(b, t, h_v, generator=gen)
    n = len(seqlens) if b == 1 else b
    state = torch.randn(n, h_v, kd, vd, generator=gen) if h0 else None
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()]) if b == 1 else None
    return q, k, v, g, beta, state, cu


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


CASES = [
    pytest.param((130,), 2, 2, False, id="T130-sym"),
    pytest.param((1,), 1, 4, False, id="T1-gva4"),
    pytest.param((65, 1, 100), 1, 3, True, id="ragged-gva3-strong"),
    pytest.param((64, 128), 2, 4, True, id="aligned-gva2-strong"),
]


@pytest.mark.parametrize("seqlens,h_qk,h_v,strong", CASES)
def test_chunked_matches_recurrent(seqlens, h_qk, h_v, strong):
    q, k, v, g, beta, h0, cu = _inputs(seqlens, h_qk, h_v, strong=strong)
    o1, s1 = chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)
    o2, s2 = recurrent_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)
    assert o1.dtype == torch.float64 and o1.shape == v.shape
    assert _rel(o1, o2) < 1e-10 and _rel(s1, s2) < 1e-10


def test_fixed_length_batch_equals_varlen():
    q, k, v, g, beta, h0, _ = _inputs((70,), 1, 2, b=3)
    o_b, s_b = chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0)
    flat = [x.reshape(1, -1, *x.shape[2:]) for x in (q, k, v, g, beta)]
    cu = torch.tensor([0, 70, 140, 210])
    o_v, s_v = chunk_gated_delta_rule_ref(*flat, initial_state=h0, cu_seqlens=cu)
    assert _rel(o_b.reshape(o_v.shape), o_v) < 1e-12 and _rel(s_b, s_v) < 1e-12


def test_recurrence_definition_by_hand():
    """One sequence, one head, two tokens, checked against the formulas of design/gdn.md directly."""
    q, k, v, g, beta, h0, cu = _inputs((2,), 1, 1, kd=3, vd=2)
    qd, kd_, vd, gd, bd = (x.double()[0, :, 0] for x in (q, k, v, g, beta))
    s = h0.double()[0, 0]
    outs = []
    for t in range(2):
        s = torch.exp(gd[t]) * s
        s = s + bd[t] * torch.outer(kd_[t], vd[t] - s.T @ kd_[t])
        outs.append(3**-0.5 * s.T @ qd[t])
    o, ht = chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)
    assert torch.allclose(o[0, :, 0], torch.stack(outs), atol=1e-12)
    assert torch.allclose(ht[0, 0], s, atol=1e-12)


def test_no_initial_state_and_no_final_state():
    q, k, v, g, beta, _, cu = _inputs((40, 30), 1, 2, h0=False)
    o, ht = chunk_gated_delta_rule_ref(q, k, v, g, beta, cu_seqlens=cu, output_final_state=False)
    assert ht is None and torch.isfinite(o).all()


@pytest.mark.parametrize("seqlens,h_qk,h_v,strong", CASES[1:])
def test_grads_chunked_match_recurrent(seqlens, h_qk, h_v, strong):
    q, k, v, g, beta, h0, cu = _inputs(seqlens, h_qk, h_v, strong=strong)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(v.shape, generator=gen)
    dht = torch.randn(h0.shape, generator=gen)
    a = chunk_gated_delta_rule_ref_grads(q, k, v, g, beta, do, dht, initial_state=h0, cu_seqlens=cu)
    b = chunk_gated_delta_rule_ref_grads(q, k, v, g, beta, do, dht, initial_state=h0, cu_seqlens=cu, form="recurrent")
    assert set(a) == {"dq", "dk", "dv", "dg", "dbeta", "dh0"}
    assert a["dq"].shape == q.shape and a["dg"].shape == g.shape
    for name in a:
        assert _rel(a[name], b[name]) < 1e-10, name


def test_grad_matches_finite_difference():
    """dg from autograd against a central finite difference of the float64 loss."""
    q, k, v, g, beta, h0, cu = _inputs((5, 3), 1, 2, kd=4, vd=3)
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(3))
    grads = chunk_gated_delta_rule_ref_grads(q, k, v, g, beta, do, None, initial_state=h0, cu_seqlens=cu)

    def loss(gg):
        o, _ = chunk_gated_delta_rule_ref(q, k, v, gg, beta, initial_state=h0, cu_seqlens=cu)
        return (o * do.double()).sum().item()

    eps = 1e-6
    for idx in [(0, 0, 1), (0, 6, 0)]:
        gp, gm = g.double().clone(), g.double().clone()
        gp[idx] += eps
        gm[idx] -= eps
        fd = (loss(gp) - loss(gm)) / (2 * eps)
        assert abs(fd - grads["dg"][idx].item()) < 1e-6 * max(1.0, abs(fd))


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a: a.update(cu=torch.tensor([0, 5, 5, 8])), "strictly"),
        (lambda a: a.update(cu=torch.tensor([0, 5])), "strictly"),
        (lambda a: a.update(v=a["v"][:, :, :3]), "multiple"),
        (lambda a: a.update(h0=a["h0"][:1]), "initial_state"),
    ],
)
def test_bad_input_is_a_clear_error(mutate, match):
    q, k, v, g, beta, h0, cu = _inputs((5, 3), 2, 4)
    a = {"v": v, "cu": cu, "h0": h0}
    mutate(a)
    v2 = a["v"]
    g2, b2 = g[..., : v2.shape[2]], beta[..., : v2.shape[2]]
    with pytest.raises(ValueError, match=match):
        chunk_gated_delta_rule_ref(q, k, v2, g2, b2, initial_state=a["h0"], cu_seqlens=a["cu"])
