"""Argument validation: each bad input is a ValueError that names the argument, before any launch."""

import pytest
import torch

from qla_kernels.gdn.checks import _fwd_args_ok, check_cu_seqlens_values, check_fwd_args


def _args(b=1, t=10, h_qk=2, h_v=4, d=128, dtype=torch.bfloat16):
    q = torch.randn(b, t, h_qk, d).to(dtype)
    k = torch.randn(b, t, h_qk, d).to(dtype)
    v = torch.randn(b, t, h_v, d).to(dtype)
    g = -torch.rand(b, t, h_v)
    beta = torch.rand(b, t, h_v)
    return q, k, v, g, beta


def test_valid_shapes_pass():
    s = check_fwd_args(*_args(b=3, t=7, h_qk=2, h_v=6))
    assert (s.batch, s.seqlen, s.h_qk, s.h_v, s.num_seqs, s.gva_ratio, s.varlen) == (3, 7, 2, 6, 3, 3, False)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    s = check_fwd_args(*_args(), cu_seqlens=cu, initial_state=torch.randn(2, 4, 128, 128))
    assert s.num_seqs == 2 and s.varlen


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda a: (a[0].float(), a[1].float(), a[2].float(), a[3], a[4]), "q dtype"),
        (lambda a: (a[0], a[1], a[2].half(), a[3], a[4]), "share a dtype"),
        (lambda a: (a[0], a[1], a[2], a[3].double(), a[4]), "g dtype"),
        (lambda a: (a[0], a[1], a[2], a[3], a[4].bfloat16()), "beta dtype"),
        (lambda a: (a[0][..., :64], a[1][..., :64], a[2], a[3], a[4]), "head dim must be 128"),
        (lambda a: (a[0], a[1], a[2][..., :64], a[3], a[4]), "v head dim"),
        (lambda a: (a[0], a[1][:, :5], a[2], a[3], a[4]), "k must have q's shape"),
        (lambda a: (a[0], a[1], a[2], a[3][:, :, :3], a[4]), r"g must be \[B,T,H_v\]"),
        (lambda a: (a[0][0], a[1][0], a[2], a[3], a[4]), r"q must be \[B,T,H_qk,128\]"),
    ],
)
def test_bad_tensors(mutate, needle):
    with pytest.raises(ValueError, match=needle):
        check_fwd_args(*mutate(_args()))
    assert _fwd_args_ok(*mutate(_args()), None, None) is None  # the fast path lets none of them through


def test_fast_path_agrees_with_the_detailed_checks():
    a = _args()
    cu = torch.tensor([0, 3, 10])
    good = [(a, None, None), (a, torch.randn(2, 4, 128, 128), cu), (_args(b=3), torch.randn(3, 4, 128, 128), None)]
    for args, h0, c in good:
        assert _fwd_args_ok(*args, h0, c) == check_fwd_args(*args, h0, c)
    bad = [
        (a, None, torch.tensor([0.0, 10.0])),
        (_args(b=2), None, torch.tensor([0, 10])),
        (a, None, torch.tensor([0])),
        (a, None, torch.tensor([[0, 10]])),
        (a, torch.randn(2, 4, 128, 128), None),
        (a, torch.randn(1, 4, 128, 128).bfloat16(), None),
        (a, torch.randn(1, 4, 128, 64), None),
        (_args(h_qk=3, h_v=4), None, None),
        ((a[0], a[1], a[2], a[3], a[4].reshape(1, 10, 4, 1)), None, None),
        ((a[0], a[1], a[2], a[3], "beta"), None, None),
    ]
    for args, h0, c in bad:
        assert _fwd_args_ok(*args, h0, c) is None
        with pytest.raises(ValueError):
            check_fwd_args(*args, h0, c)


def test_head_ratio_must_divide():
    with pytest.raises(ValueError, match="multiple of H_qk"):
        check_fwd_args(*_args(h_qk=3, h_v=4))


def test_cu_seqlens_rules():
    a = _args()
    with pytest.raises(ValueError, match="int32 or int64"):
        check_fwd_args(*a, cu_seqlens=torch.tensor([0.0, 10.0]))
    with pytest.raises(ValueError, match="B = 1"):
        check_fwd_args(*_args(b=2), cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="1-D"):
        check_fwd_args(*a, cu_seqlens=torch.tensor([0]))


def test_initial_state_shape_and_dtype():
    a = _args()
    with pytest.raises(ValueError, match="initial_state must be"):
        check_fwd_args(*a, initial_state=torch.randn(2, 4, 128, 128))
    with pytest.raises(ValueError, match="initial_state dtype"):
        check_fwd_args(*a, initial_state=torch.randn(1, 4, 128, 128).bfloat16())


@pytest.mark.parametrize(
    ("cu", "needle"),
    [([1, 5, 10], "start at 0"), ([0, 5, 5, 10], "strictly increasing"), ([0, 6, 4, 10], "strictly"),
     ([0, 5, 9], "end at T=10")],
)
def test_cu_seqlens_values(cu, needle):
    with pytest.raises(ValueError, match=needle):
        check_cu_seqlens_values(cu, 10)
    check_cu_seqlens_values([0, 4, 10], 10)


def test_api_rejects_cpu_and_head_first():
    from qla_kernels import chunk_gated_delta_rule, chunk_gated_delta_rule_fwd

    with pytest.raises(ValueError, match="CUDA"):
        chunk_gated_delta_rule_fwd(*_args())
    with pytest.raises(ValueError, match="head_first"):
        chunk_gated_delta_rule(*_args(), head_first=True)
    with pytest.raises(ValueError, match="strictly increasing"):
        from qla_kernels.gdn.plan import plan_varlen

        plan_varlen(torch.tensor([0, 4, 4, 10]), 10)


def test_bwd_dstate_rejects_bad_input_before_launch():
    from qla_kernels.gdn.bwd_api import chunk_bwd_dstate

    q, k, v, g, beta = _args(t=70)
    a = torch.zeros(1, 70, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="A must be"):
        chunk_bwd_dstate(q, k, g, beta, a[..., :32], v)
    with pytest.raises(ValueError, match="block_v must be one of"):
        chunk_bwd_dstate(q, k, g, beta, a, v, block_v=48)
    with pytest.raises(ValueError, match="CUDA"):  # this machine's tensors are on the CPU
        chunk_bwd_dstate(q, k, g, beta, a, v)
    with pytest.raises(ValueError, match="v head dim"):  # do is checked like v
        chunk_bwd_dstate(q, k, g, beta, a, v[..., :64])


def test_tilelang_bwd_rejects_bad_input_before_launch(monkeypatch):
    from qla_kernels.gdn.autograd import resolve_bwd_impl
    from qla_kernels.gdn.bwd_api import chunk_gated_delta_rule_bwd

    q, k, v, g, beta = _args(t=70)
    a = torch.zeros(1, 70, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do must be like v"):
        chunk_gated_delta_rule_bwd(q, k, v, g, beta, a, v[:, :, :2])
    with pytest.raises(ValueError, match="A must be"):
        chunk_gated_delta_rule_bwd(q, k, v, g, beta, a.float(), v)
    with pytest.raises(ValueError, match="CUDA"):
        chunk_gated_delta_rule_bwd(q, k, v, g, beta, a, v)
    monkeypatch.setenv("QLA_BWD_IMPL", "triton")
    with pytest.raises(ValueError, match="QLA_BWD_IMPL must be one of"):
        resolve_bwd_impl()
    monkeypatch.setenv("QLA_BWD_IMPL", " ")  # blank is unset: the TileLang backward on CUDA, torch elsewhere
    assert resolve_bwd_impl(torch.device("cuda", 0)) == "tilelang"
    assert resolve_bwd_impl(torch.device("cpu")) == "torch" and resolve_bwd_impl() == "torch"
    monkeypatch.setenv("QLA_BWD_IMPL", "torch")
    assert resolve_bwd_impl(torch.device("cuda", 0)) == "torch"


def test_bwd_dstate_revision_from_the_environment(monkeypatch):
    from qla_kernels.gdn.bwd_api import resolve_dstate_rev

    monkeypatch.delenv("QLA_BWD_DSTATE", raising=False)
    assert resolve_dstate_rev() == "rev4"  # the dO-split chain: the default since the H200 checked it (session 10)
    monkeypatch.setenv("QLA_BWD_DSTATE", "rev1")
    assert resolve_dstate_rev() == "rev1"
    monkeypatch.setenv("QLA_BWD_DSTATE", "rev3")
    assert resolve_dstate_rev() == "rev3"
    monkeypatch.setenv("QLA_BWD_DSTATE", "rev5")
    assert resolve_dstate_rev() == "rev5"
    monkeypatch.setenv("QLA_BWD_DSTATE", "rev6")
    with pytest.raises(ValueError, match=r"QLA_BWD_DSTATE must be one of \['rev1', 'rev2', 'rev3', 'rev4', 'rev5'\]"):
        resolve_dstate_rev()


def test_bwd_grads_revision_from_the_environment(monkeypatch):
    from qla_kernels.gdn.bwd_api import resolve_grads_rev

    monkeypatch.delenv("QLA_BWD_GRADS", raising=False)
    assert resolve_grads_rev() == "rev8"  # rev6's errors, 1.10x its backward (session 19, H100)
    monkeypatch.setenv("QLA_BWD_GRADS", "rev3")
    assert resolve_grads_rev() == "rev3"
    monkeypatch.setenv("QLA_BWD_GRADS", "rev12")
    assert resolve_grads_rev() == "rev12"  # rev 8 with lean (session 22)
    monkeypatch.setenv("QLA_BWD_GRADS", "rev14")
    # sorted as text
    accepted = (r"\['rev1', 'rev10', 'rev11', 'rev12', 'rev13', 'rev2', 'rev3', 'rev4', 'rev5', 'rev6', 'rev7', "
                r"'rev8', 'rev9'\]")
    with pytest.raises(ValueError, match=r"QLA_BWD_GRADS must be one of " + accepted):
        resolve_grads_rev()


def test_bwd_group_sum_from_the_environment(monkeypatch):
    from qla_kernels.gdn.bwd_api import resolve_group_sum

    monkeypatch.delenv("QLA_BWD_GROUP_SUM", raising=False)
    assert resolve_group_sum() == "kernel"  # one launch, equal to torch's at r = 2 (session 19)
    monkeypatch.setenv("QLA_BWD_GROUP_SUM", "torch")
    assert resolve_group_sum() == "torch"
    monkeypatch.setenv("QLA_BWD_GROUP_SUM", "atomics")
    with pytest.raises(ValueError, match=r"QLA_BWD_GROUP_SUM must be one of \['kernel', 'torch'\]"):
        resolve_group_sum()


def test_bwd_states_impl_from_the_environment(monkeypatch):
    from qla_kernels.gdn.bwd_api import resolve_states_impl

    monkeypatch.delenv("QLA_BWD_STATES", raising=False)
    assert resolve_states_impl() == "ws12"  # the default since its dg errors on the H100 (session 25)
    monkeypatch.setenv("QLA_BWD_STATES", "v2")
    assert resolve_states_impl() == "v2"
    monkeypatch.setenv("QLA_BWD_STATES", "ws5")
    assert resolve_states_impl() == "ws5"
    monkeypatch.setenv("QLA_BWD_STATES", "ws4")
    with pytest.raises(ValueError, match=r"QLA_BWD_STATES must be one of \['v2', 'ws12', 'ws5'\]"):
        resolve_states_impl()
