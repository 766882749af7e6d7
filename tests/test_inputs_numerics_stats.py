"""Canonical inputs, numerics verdicts, statistics and the roofline arithmetic."""

from __future__ import annotations

import math

import pytest
import torch

from qla_bench.inputs import make_inputs
from qla_bench.numerics import compare_outputs, get_tolerance, poison_
from qla_bench.roofline import Ceilings, bytes_moved, derived, floor_ms, flops
from qla_bench.rows import Status
from qla_bench.stats import bootstrap_median_ci, geomean, summarize
from qla_bench.workload import HeadConfig, InputRecipe, Workload


def _wl(gate="flashqla", frac=0.25, lens=(100, 29)):
    return Workload(HeadConfig(2, 8), lens, recipe=InputRecipe(gate=gate, zero_gate_frac=frac))


def test_inputs_deterministic_never_zero():
    a, b = make_inputs(_wl(), with_grads=True), make_inputs(_wl(), with_grads=True)
    for name, t in a.tensors().items():
        assert torch.equal(t, b.tensors()[name]), name
        if name not in ("cu_seqlens", "g"):
            assert t.abs().max() > 0 and t.float().std() > 0, name
    assert a.q.dtype == torch.bfloat16 and a.g.dtype == torch.float32 and a.h0.shape == (2, 8, 128, 128)
    norms = a.q.float().norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
    assert a.cu_seqlens.tolist() == [0, 100, 129] and a.cu_seqlens.dtype == torch.int64
    c = make_inputs(_wl(), seed=a.workload.seed() + 1)
    assert not torch.equal(a.v, c.v)


def test_gate_recipes():
    x = make_inputs(_wl(frac=0.25))
    zero_heads = (x.g == 0).all(dim=1).flatten()
    assert int(zero_heads.sum()) == 2  # 25 % of 8 heads
    assert (x.g <= 0).all() and x.g.min() > -1
    strong = make_inputs(_wl("strong", 0.0))
    assert strong.g.min() < -10
    assert (make_inputs(_wl("zero")).g == 0).all()


def test_compare_outputs_statuses():
    ref = {"o": torch.randn(4, 5, dtype=torch.float64), "final_state": torch.randn(2, 3, dtype=torch.float64)}
    tol = get_tolerance("bf16")
    good = {k: v.float() for k, v in ref.items()}
    assert compare_outputs(good, ref, tol).status == Status.PASSED
    off = dict(good, o=good["o"] * 1.1)
    c = compare_outputs(off, ref, tol)
    assert c.status == Status.INCORRECT and "o rel-L2" in c.reason and c.rel_l2["o"] == pytest.approx(0.1, rel=1e-3)
    nan = dict(good, final_state=poison_(good["final_state"].clone()))
    c = compare_outputs(nan, ref, tol)
    assert c.status == Status.INCORRECT and c.nonfinite["final_state"] == 6
    assert compare_outputs({"o": good["o"]}, ref, tol).reason == "final_state missing"
    assert "shape" in compare_outputs(dict(good, o=good["o"].T), ref, tol).reason


def test_tolerance_profiles():
    assert get_tolerance("strict").limit("o") == 0.005 and get_tolerance("strict").limit("dg") == 0.02
    with pytest.raises(Exception, match="--tolerance"):
        get_tolerance("loose")


def test_summarize_and_ci():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.minimum == 1.0 and s.q1 == 2.0 and s.q3 == 4.0
    lo, hi = bootstrap_median_ci([5.0] * 10)
    assert lo == hi == 5.0
    lo, hi = bootstrap_median_ci(list(range(100)))
    assert lo < 49.5 < hi
    assert geomean([1, 4]) == pytest.approx(2.0) and math.isnan(geomean([]))


def test_roofline_matches_design_example():
    """design/gdn.md: 16/64, 1x32768 forward = 341 GFLOP and 1.34 GB; floor 0.43 ms at 790 TFLOP/s, 4.3 TB/s."""
    wl = Workload(HeadConfig(16, 64), (32768,))
    assert flops(wl, "fwd") == pytest.approx(344e9, rel=0.01)
    # q, k, v, o = 1.342 GB as gdn.md counts; plus g, beta, h0 and the final state = 1.367 GB
    assert bytes_moved(wl, "fwd") == 1_367_343_104
    c = Ceilings(matmul_tflops=790, copy_gbps=4300)
    assert floor_ms(wl, "fwd", c) == pytest.approx(0.435, rel=0.02)
    d = derived(wl, "fwd", 0.87, c)
    assert d["pct_roofline"] == pytest.approx(50, rel=0.02)
    assert derived(wl, "fwd", 1.0, None)["pct_roofline"] is None
    assert flops(wl, "train") > flops(wl, "bwd") > flops(wl, "fwd")


def test_ceilings_round_trip(tmp_path):
    c = Ceilings(790.0, 4300.0, "H200", "now")
    assert Ceilings.load(c.save(tmp_path / "p.json")) == c
    assert Ceilings.load(tmp_path / "missing.json") is None
