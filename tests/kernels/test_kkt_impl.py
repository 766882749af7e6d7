"""Selecting the kkt_solve implementation (argument, $QLA_KKT_IMPL, default) and stage-1 argument checks."""

import pytest
import torch

from qla_kernels.gdn.api import (
    DEFAULT_FUSED_IMPL,
    DEFAULT_KKT_IMPL,
    KKT_IMPLS,
    chunk_kkt_solve,
    resolve_fused_impl,
    resolve_kkt_impl,
)
from qla_kernels.gdn.checks import check_kkt_args


def test_default_is_v4_verified_on_the_h200(monkeypatch):
    monkeypatch.delenv("QLA_KKT_IMPL", raising=False)
    assert DEFAULT_KKT_IMPL == "v4" and resolve_kkt_impl() == "v4"  # session 7: 0.82x v3h's time
    # where stage 1 writes Agb for a forward-only kernel: v4t (session 16's edge check; A0 for a backward stays v4)
    assert resolve_kkt_impl(emit_agb=True) == "v4t" and resolve_kkt_impl("v4", emit_agb=True) == "v4"
    assert {"v2", "v3"} <= set(KKT_IMPLS)


def test_env_and_argument(monkeypatch):
    monkeypatch.setenv("QLA_KKT_IMPL", "v2")
    assert resolve_kkt_impl() == "v2"
    assert resolve_kkt_impl("v3") == "v3"  # the explicit argument wins
    assert resolve_kkt_impl(emit_agb=True) == "v2"  # $QLA_KKT_IMPL names the kernel for every path
    monkeypatch.setenv("QLA_KKT_IMPL", " ")
    assert resolve_kkt_impl() == "v4"


def test_fused_impl_selection(monkeypatch):
    monkeypatch.delenv("QLA_FUSED_IMPL", raising=False)
    assert resolve_fused_impl() == DEFAULT_FUSED_IMPL
    monkeypatch.setenv("QLA_FUSED_IMPL", "ws")
    assert resolve_fused_impl() == "ws"
    assert resolve_fused_impl("v2") == "v2"
    monkeypatch.setenv("QLA_FUSED_IMPL", "v9")
    with pytest.raises(ValueError, match=r"\$QLA_FUSED_IMPL must be one of"):
        resolve_fused_impl()
    with pytest.raises(ValueError, match="fused_impl must be one of"):
        resolve_fused_impl("fast")


def test_unknown_names_are_errors(monkeypatch):
    monkeypatch.setenv("QLA_KKT_IMPL", "v99")
    with pytest.raises(ValueError, match=r"\$QLA_KKT_IMPL must be one of"):
        resolve_kkt_impl()
    with pytest.raises(ValueError, match="kkt_impl must be one of"):
        resolve_kkt_impl("fast")


def _stage1(b=1, t=70, h_qk=2, h_v=6):
    return (torch.randn(b, t, h_qk, 128).bfloat16(), -torch.rand(b, t, h_v), torch.rand(b, t, h_v))


def test_check_kkt_args():
    s = check_kkt_args(*_stage1())
    assert (s.h_qk, s.h_v, s.gva_ratio, s.num_seqs) == (2, 6, 3, 1)
    k, g, beta = _stage1()
    for bad, needle in [
        ((k.float(), g, beta), "k dtype"),
        ((k[..., :64], g, beta), r"k must be \[B,T,H_qk,128\]"),
        ((k, g[..., :5], beta), "multiple of H_qk"),
        ((k, g, beta[..., :3]), r"beta must be \[B,T,H_v\]"),
        ((k, g.double(), beta), "g dtype"),
    ]:
        with pytest.raises(ValueError, match=needle):
            check_kkt_args(*bad)
    with pytest.raises(ValueError, match="int32 or int64"):
        check_kkt_args(k, g, beta, torch.tensor([0.0, 70.0]))


def test_chunk_kkt_solve_rejects_cpu_before_any_launch():
    with pytest.raises(ValueError, match="CUDA"):
        chunk_kkt_solve(*_stage1(), kkt_impl="v3")


def test_emit_ab_needs_a_lean_scatter_v3_kkt():
    """ws10's stage 1 output (emit_agb) exists only in the v3 family with the lean scatter of L; any other
    kkt_impl is refused by name before a kernel is built or launched."""
    from qla_kernels.gdn.api import A0_FALLBACK_IMPL, AGB_IMPLS, AGB_KKT_IMPLS, FUSED_IMPLS, _kkt_kernel

    lean_v3 = {n for n, (version, extra) in KKT_IMPLS.items() if version == "v3" and len(extra) > 5 and extra[5]}
    assert set(AGB_KKT_IMPLS) == lean_v3 and "v4" in lean_v3
    for impl in set(KKT_IMPLS) - lean_v3:
        with pytest.raises(ValueError, match=r"kkt_impl must be one of .* with an emit_agb fused kernel"):
            _kkt_kernel(impl, "bfloat16", True)
    assert set(AGB_IMPLS) <= set(FUSED_IMPLS) and A0_FALLBACK_IMPL in FUSED_IMPLS
    assert A0_FALLBACK_IMPL not in AGB_IMPLS  # the autograd forward must get an A0


def test_agb_only_kkt_is_accepted_by_name_and_refused_where_a0_is_needed(monkeypatch):
    """kkt v10 writes Agb only: the switch accepts it, and a launch that needs A0 says why before building."""
    from qla_kernels.gdn.api import AGB_ONLY_KKT_IMPLS, _kkt_kernel

    assert "v10" in AGB_ONLY_KKT_IMPLS and not set(AGB_ONLY_KKT_IMPLS) & set(KKT_IMPLS)
    monkeypatch.setenv("QLA_KKT_IMPL", "v10")
    assert resolve_kkt_impl() == resolve_kkt_impl(emit_agb=True) == "v10"
    with pytest.raises(ValueError, match=r"'v10' writes only Agb.*needs A0"):
        _kkt_kernel("v10", "bfloat16", False)
    monkeypatch.setenv("QLA_KKT_IMPL", "v11")
    with pytest.raises(ValueError, match=r"QLA_KKT_IMPL must be one of .*'v10'"):
        resolve_kkt_impl()
