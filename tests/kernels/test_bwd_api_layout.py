"""bwd_api.chunk_gated_delta_rule_bwd's output assembly on the CPU: the stages work on packed [1, B*T, ...]
tensors, and every gradient must come back in its input's layout, also for fixed-length batches B > 1
(the H200 run of tests/gpu/test_qla_bwd.py caught dv returned packed [1, B*T, ...]). The three GPU stages
are replaced by stand-ins that return known packed tensors; the GVA sums and reshapes are the real code."""

import pytest
import torch

from qla_kernels.gdn import bwd_api
from qla_kernels.gdn.checks import check_fwd_args

D = 128


@pytest.mark.parametrize("grads_rev", ["rev8", "rev9"])  # rev9 sums the GVA group in stage 2 at r = 1, 2
@pytest.mark.parametrize("dv_from", ["stage1", "stage2"])  # stage 1 rev1/rev2 write dv; with rev3 stage 2 does
@pytest.mark.parametrize(
    ("b", "t", "h_qk", "h_v", "cu"), [(3, 70, 2, 4, None), (1, 200, 1, 3, [0, 70, 200]), (2, 65, 3, 3, None)]
)
def test_gradients_come_back_in_the_input_layout(monkeypatch, b, t, h_qk, h_v, cu, dv_from, grads_rev):
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b, t, h_qk, D, generator=gen).bfloat16() for _ in range(2))
    v, do = (torch.randn(b, t, h_v, D, generator=gen).bfloat16() for _ in range(2))
    g, beta = torch.randn(b, t, h_v, generator=gen), torch.rand(b, t, h_v, generator=gen)
    a0 = torch.randn(b, t, h_v, 64, generator=gen).bfloat16()
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    n = b if cu is None else len(cu) - 1
    h0 = torch.randn(n, h_v, D, D, generator=gen)
    packed_dv = torch.randn(1, b * t, h_v, D, generator=gen)
    packed_dq, packed_dk = (torch.randn(1, b * t, h_v, D, generator=gen) for _ in range(2))
    packed_dbeta, packed_dg = (torch.randn(1, b * t, h_v, generator=gen) for _ in range(2))
    dh0 = torch.randn(n, h_v, D, D, generator=gen)

    def checks_without_device(q, k, v, g_cumsum, beta, A, do, cu_seqlens):
        return check_fwd_args(q, k, v, g_cumsum, beta, None, cu_seqlens)

    monkeypatch.setattr(bwd_api, "_check_stage_inputs", checks_without_device)
    # the group sum's kernel (the default) runs on CUDA only (tests/gpu/test_qla_bwd.py compares it with this path)
    monkeypatch.setenv(bwd_api.GROUP_SUM_ENV, "torch")
    monkeypatch.setenv(bwd_api.GRADS_REV_ENV, grads_rev)
    r = h_v // h_qk
    summed = grads_rev == "rev9" and r <= 2
    # rev9 at r = 1, 2: stage 2 returns the group's sums, packed [1, B*T, H_qk, K] in q's dtype
    group_dq, group_dk = (x.view(b, t, h_qk, r, D).sum(3).bfloat16().view(1, b * t, h_qk, D)
                          for x in (packed_dq, packed_dk))  # fmt: skip
    monkeypatch.setattr(bwd_api, "chunk_states", lambda *a: None)
    stage1_dv = packed_dv if dv_from == "stage1" else None
    monkeypatch.setattr(
        bwd_api, "_dstate_packed", lambda *a: bwd_api.DStateOutput(ds_next=None, dv=stage1_dv, dh0=dh0)
    )

    def stage2(*args):
        dv, sum_groups = args[-2:]
        assert (dv is None) == (dv_from == "stage1")
        assert sum_groups == summed
        if dv is not None:  # rev3: stage 2 writes dv, packed, in v's dtype
            assert dv.shape == (1, b * t, h_v, D) and dv.dtype == v.dtype
            dv.copy_(packed_dv)
        if sum_groups:
            return group_dq, group_dk, packed_dbeta, packed_dg
        return packed_dq, packed_dk, packed_dbeta, packed_dg

    monkeypatch.setattr(bwd_api, "chunk_bwd_grads", stage2)
    out = bwd_api.chunk_gated_delta_rule_bwd(q, k, v, g, beta, a0, do, None, None, h0, cu_t, cp=False)

    assert out.dq.shape == q.shape and out.dk.shape == k.shape and out.dv.shape == v.shape
    assert out.dbeta.shape == beta.shape and out.dg.shape == g.shape and out.dh0.shape == h0.shape
    want_dq = packed_dq.view(b, t, h_qk, r, D).sum(3).bfloat16()  # summed in fp32, rounded once
    assert torch.equal(out.dq, want_dq) and torch.equal(out.dk, packed_dk.view(b, t, h_qk, r, D).sum(3).bfloat16())
    torch.testing.assert_close(out.dv, packed_dv.view(b, t, h_v, D).bfloat16())
    torch.testing.assert_close(out.dg, packed_dg.view(b, t, h_v))
