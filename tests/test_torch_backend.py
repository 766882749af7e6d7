"""The PyTorch backend (a separate implementation) against the float64 reference, fwd and bwd."""

from __future__ import annotations

import pytest
import torch

from qla_bench.backends import get_backend
from qla_bench.inputs import make_inputs
from qla_bench.numerics import compare_outputs, get_tolerance
from qla_bench.session import reference_outputs
from qla_bench.workload import HeadConfig, InputRecipe, Workload


@pytest.mark.parametrize(
    "heads,lens,gate",
    [
        ((1, 4), (1,), "flashqla"),
        ((1, 3), (65, 1000 - 935), "strong"),
        ((2, 2), (64, 64), "zero"),
        ((2, 4), (130, 7, 64), "flashqla"),
    ],
)
@pytest.mark.parametrize("mode", ["fwd", "bwd", "train"])
def test_torch_backend_matches_reference(heads, lens, gate, mode):
    wl = Workload(HeadConfig(*heads), lens, k=32, v=16, recipe=InputRecipe(gate=gate))
    x = make_inputs(wl, with_grads=(mode != "fwd"))
    b = get_backend("torch")
    assert b.available() is None and b.supports(wl, mode, x.device) is None
    p = b.prepare(x, mode)
    out = p.outputs(p.run())
    tol = get_tolerance("bf16") if mode == "fwd" else get_tolerance("fp32")
    cmp = compare_outputs(out, reference_outputs(x, mode), tol)
    assert cmp.status.value == "PASSED", cmp.reason
    if mode == "fwd":
        assert out["o"].dtype == torch.bfloat16
