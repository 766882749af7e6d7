"""Stage 1 of the TileLang backward on the H200 (gdn/bwd/dstate_chain.py): the reverse dS chain, dv and
dh0, against the float64 chain of gdn/bwd_chunked.py on the forward suite's cases, fed the qla forward's
own g_cumsum and A0. dS' and dh0 are fp32 outputs; dv is checked at issue 6's 0.01 as is dh0 (rev3 leaves
dv to stage 2: test_qla_bwd.py checks it there)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu.test_qla_fwd import CASES, case_inputs, rel_l2  # noqa: E402

from qla_kernels import chunk_gated_delta_rule_fwd  # noqa: E402
from qla_kernels.gdn.bwd_api import chunk_bwd_dstate  # noqa: E402
from qla_kernels.gdn.bwd_chunked import dstate_chain  # noqa: E402

TOL = 0.01


@pytest.mark.parametrize(
    ("rev", "block_v"), [("rev1", None), ("rev1", 128), ("rev2", None), ("rev2", 64), ("rev3", None), ("rev3", 64)]
)
@pytest.mark.parametrize("name", list(CASES))
def test_dstate_chain_matches_float64(name, rev, block_v, monkeypatch):
    monkeypatch.setenv("QLA_BWD_DSTATE", rev)
    q, k, v, g, beta, s0, cu = case_inputs(name)
    b, t, h_v = v.shape[0], v.shape[1], v.shape[2]
    n = cu.numel() - 1 if cu is not None else b
    fwd = chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu)
    gen = torch.Generator(device="cuda").manual_seed(2)
    do = torch.randn(v.shape, generator=gen, device="cuda").to(v.dtype)
    dht = torch.randn(n, h_v, 128, 128, generator=gen, device="cuda")
    out = chunk_bwd_dstate(q, k, fwd.g_cumsum, beta, fwd.a0, do, dht, cu_seqlens=cu, block_v=block_v)
    torch.cuda.synchronize()
    cu_list = cu.tolist() if cu is not None else list(range(0, b * t + 1, t))

    def packed(x):
        return x.reshape(1, b * t, *x.shape[2:]).cpu()

    ref_ds, ref_dv, ref_dh0 = dstate_chain(
        packed(q), packed(k), packed(fwd.g_cumsum), packed(beta), packed(fwd.a0), packed(do), dht.cpu(),
        128**-0.5, cu_list,
    )  # fmt: skip
    assert (out.dv is None) == (rev == "rev3")
    e_ds, e_dh0 = rel_l2(out.ds_next, ref_ds), rel_l2(out.dh0, ref_dh0)
    e_dv = 0.0 if out.dv is None else rel_l2(out.dv.reshape(b * t, h_v, 128), ref_dv)
    print(f"\n[bwd-dstate] {name} {rev} bv={block_v}: ds_next={e_ds:.2e} dv={e_dv:.2e} dh0={e_dh0:.2e}")
    assert torch.isfinite(out.ds_next).all() and (out.dv is None or torch.isfinite(out.dv).all())
    assert e_ds <= TOL and e_dv <= TOL and e_dh0 <= TOL, (e_ds, e_dv, e_dh0)
