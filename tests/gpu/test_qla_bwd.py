"""The differentiable qla forward on the H200: TileLang forward + chunk-form backward (gdn/autograd.py)
against float64 autograd through the reference, on the forward suite's inputs.

Issue 6 tolerances: relative L2 <= 0.01 on dq, dk, dv, dh0 and <= 0.02 on dg, dbeta. Both backwards
behind $QLA_BWD_IMPL run: "torch" (the chunk-form specification) and "tilelang" (bwd_api.py: state
store, reverse dS chain, per-chunk gradients). Only numerics are checked here, never speed.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu.test_qla_fwd import CASES, case_inputs, rel_l2  # noqa: E402

from qla_bench.reference import chunk_gated_delta_rule_ref_grads  # noqa: E402
from qla_kernels import chunk_gated_delta_rule  # noqa: E402

TOL = {"dq": 0.01, "dk": 0.01, "dv": 0.01, "dh0": 0.01, "dg": 0.02, "dbeta": 0.02}


@pytest.mark.parametrize("impl", ["torch", "tilelang"])
@pytest.mark.parametrize("name", list(CASES))
def test_autograd_matches_float64(name, impl, monkeypatch):
    monkeypatch.setenv("QLA_BWD_IMPL", impl)
    q, k, v, g, beta, s0, cu = case_inputs(name)
    n, h_v, dtype = (cu.numel() - 1 if cu is not None else q.shape[0]), v.shape[2], v.dtype
    gen = torch.Generator(device="cuda").manual_seed(1)
    do = torch.randn(v.shape, generator=gen, device="cuda").to(dtype)
    dht = torch.randn(n, h_v, 128, 128, generator=gen, device="cuda")
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta)]
    h0_leaf = s0.detach().clone().requires_grad_(True) if s0 is not None else None
    o, ht = chunk_gated_delta_rule(*leaves, initial_state=h0_leaf, output_final_state=True, cu_seqlens=cu)
    ((o.float() * do.float()).sum() + (ht * dht).sum()).backward()
    ref = chunk_gated_delta_rule_ref_grads(
        q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), do.cpu(), dht.cpu(), None,
        None if s0 is None else s0.cpu(), None if cu is None else cu.cpu(),
    )
    got = dict(zip(("dq", "dk", "dv", "dg", "dbeta"), (x.grad for x in leaves)))
    if h0_leaf is not None:
        got["dh0"] = h0_leaf.grad
    errs = {n_: rel_l2(got[n_], ref[n_]) for n_ in got}
    print(f"\n[qla-bwd {impl}] {name}: " + " ".join(f"{n_}={e:.2e}" for n_, e in errs.items()))
    for n_, e in errs.items():
        assert e <= TOL[n_], (n_, e)
