"""FLA adapter: the Hopper/Triton backward gate, availability, and prepare/run/outputs against a fake fla."""

from __future__ import annotations

import sys

import pytest
import torch

from qla_bench.backends import fla as fla_backend
from qla_bench.backends.fla import FlaBackend, FlaBwdFacts, fla_bwd_blocker, fla_bwd_dqkwg_kernel
from qla_bench.workload import HeadConfig, Workload

CHUNK_MOD = "fla.ops.gated_delta_rule.chunk"
INDEX_MOD = "fla.ops.utils.index"


@pytest.mark.parametrize(
    ("hopper", "triton", "tilelang_off", "blocked"),
    [
        (True, "3.6.0", "FLA_TILELANG=0", True),
        (True, "3.4.0", "no nvcc", True),
        (True, "3.7.0", "no nvcc", True),
        (True, "3.6.0", None, False),  # TileLang replaces the refusing kernel
        (True, "3.7.1", "FLA_TILELANG=0", False),
        (True, "3.7.1+git123", "FLA_TILELANG=0", False),
        (True, "3.3.1", "FLA_TILELANG=0", False),
        (False, "3.6.0", "FLA_TILELANG=0", False),  # Ampere/Blackwell: no refusal
    ],
)
def test_bwd_blocker_mirrors_fla_060(hopper: bool, triton: str, tilelang_off: str | None, blocked: bool) -> None:
    reason = fla_bwd_blocker(FlaBwdFacts(hopper, triton, tilelang_off))
    assert (reason is not None) == blocked
    if reason:
        assert triton in reason and "#640" in reason and str(tilelang_off) in reason and "3.7.1" in reason


def test_dqkwg_kernel_follows_tilelang() -> None:
    assert fla_bwd_dqkwg_kernel(FlaBwdFacts(True, "3.6.0", None)) == "tilelang"
    assert fla_bwd_dqkwg_kernel(FlaBwdFacts(True, "3.7.1", "FLA_DISABLE_BACKEND_DISPATCH=1")) == "triton"


def test_available_reasons(monkeypatch: pytest.MonkeyPatch, install_module) -> None:
    monkeypatch.setitem(sys.modules, "fla", None)
    reason = FlaBackend().available()
    assert reason is not None and "fla-core is not installed" in reason
    install_module(CHUNK_MOD)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = FlaBackend().available()
    assert reason is not None and "CUDA" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert FlaBackend().available() is None


def _workload(k: int = 128, v: int = 128) -> Workload:
    return Workload(HeadConfig(16, 32), (4096,), k=k, v=v)


def test_supports(monkeypatch: pytest.MonkeyPatch, fake_cuda) -> None:
    b = FlaBackend()
    assert "CUDA" in (b.supports(_workload(), "fwd", torch.device("cpu")) or "")
    dev = fake_cuda((9, 0))
    assert b.supports(_workload(), "fwd", dev) is None
    assert "K <= 256" in (b.supports(_workload(k=512), "fwd", dev) or "")
    assert "no nope pass" in (b.supports(_workload(), "nope", dev) or "")
    monkeypatch.setattr(fla_backend, "gather_bwd_facts", lambda d: FlaBwdFacts(True, "3.6.0", "FLA_TILELANG=0"))
    for mode in ("bwd", "train"):
        assert "#640" in (b.supports(_workload(), mode, dev) or "")
    assert b.supports(_workload(), "fwd", dev) is None  # the forward is unaffected
    monkeypatch.setattr(fla_backend, "gather_bwd_facts", lambda d: FlaBwdFacts(True, "3.6.0", None))
    assert b.supports(_workload(), "bwd", dev) is None


def test_env_flags_record_dispatch_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLA_FLASH_QLA", "0")
    monkeypatch.setenv("FLA_DISABLE_BACKEND_DISPATCH", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    flags = FlaBackend().env_flags()
    assert flags["FLA_FLASH_QLA"] == "0"
    assert flags["FLA_DISABLE_BACKEND_DISPATCH"] == "1"
    assert flags["fla_entry"] == "chunk_gated_delta_rule_fwd/_bwd"


class FakeFla:
    """Stands in for FLA's low-level fwd/bwd: checks what the adapter passes, returns marked tensors."""

    def __init__(self, inputs) -> None:
        self.inputs = inputs
        self.fwd_calls = 0
        self.bwd_calls = 0
        self.chunk_indices = torch.tensor([[0, 0], [1, 0]])
        t, h_v, v_dim = inputs.v.shape[1:]
        n, _, k_dim, _ = inputs.h0.shape
        self.o = torch.full((1, t, h_v, v_dim), 1.0, dtype=inputs.v.dtype)
        self.ht = torch.full((n, h_v, k_dim, v_dim), 2.0)
        self.g_cumsum = torch.full((1, t, h_v), 3.0)
        self.A = torch.full((1, t, h_v, 64), 4.0)
        self.h0_used = torch.full((n, h_v, k_dim, v_dim), 5.0)
        self.grads = tuple(torch.full((1,), float(10 + i)) for i in range(8))

    def prepare_chunk_indices(self, cu, chunk_size):
        assert cu is self.inputs.cu_seqlens and chunk_size == 64
        return self.chunk_indices

    def fwd(self, **kw):
        x = self.inputs
        self.fwd_calls += 1
        assert kw["q"].shape == x.q.shape and kw["q"].dtype == torch.bfloat16 and kw["q"].is_contiguous()
        assert kw["v"].shape == x.v.shape
        assert kw["g"].dtype == torch.float32 and torch.equal(kw["g"], x.g)  # FLA takes the log gate
        assert kw["initial_state"].shape == x.h0.shape and torch.equal(kw["initial_state"], x.h0)
        assert kw["cu_seqlens"] is x.cu_seqlens  # identity: FLA caches by tensor object
        assert kw["chunk_indices"] is self.chunk_indices
        assert kw["output_final_state"] is True and kw["scale"] == x.scale and kw["chunk_size"] == 64
        assert "use_qk_l2norm_in_kernel" not in kw  # the low-level fwd never normalises
        return self.g_cumsum, self.o, self.A, self.ht, self.h0_used, None

    def bwd(self, **kw):
        x = self.inputs
        self.bwd_calls += 1
        assert kw["g"] is self.g_cumsum and kw["A"] is self.A  # FLA's own forward outputs
        assert kw["initial_state"] is self.h0_used
        assert torch.equal(kw["do"], x.do) and torch.equal(kw["dht"], x.dht)
        assert kw["cu_seqlens"] is x.cu_seqlens and kw["chunk_indices"] is self.chunk_indices
        assert kw["scale"] == x.scale
        return self.grads


@pytest.fixture
def fake_fla(install_module, make_inputs):
    inputs = make_inputs()
    fake = FakeFla(inputs)
    install_module(CHUNK_MOD, chunk_gated_delta_rule_fwd=fake.fwd, chunk_gated_delta_rule_bwd=fake.bwd)
    install_module(INDEX_MOD, prepare_chunk_indices=fake.prepare_chunk_indices)
    return fake


def test_fwd(fake_fla: FakeFla) -> None:
    p = FlaBackend().prepare(fake_fla.inputs, "fwd")
    assert fake_fla.fwd_calls == 0  # nothing runs before the timed call
    out = p.outputs(p.run())
    assert fake_fla.fwd_calls == 1
    assert out["o"] is fake_fla.o and out["final_state"] is fake_fla.ht
    assert p.graph_safe


def test_bwd_runs_fla_forward_once_untimed(fake_fla: FakeFla) -> None:
    p = FlaBackend().prepare(fake_fla.inputs, "bwd")
    assert fake_fla.fwd_calls == 1 and fake_fla.bwd_calls == 0
    res = p.run()
    p.run()
    assert fake_fla.fwd_calls == 1 and fake_fla.bwd_calls == 2
    out = p.outputs(res)
    order = ("dq", "dk", "dv", "dbeta", "dg", "dh0")  # FLA returns dbeta before dg
    assert set(out) == set(order)
    for name, expected in zip(order, fake_fla.grads, strict=False):
        assert out[name] is expected, name


def test_train_runs_forward_and_backward_each_call(fake_fla: FakeFla) -> None:
    p = FlaBackend().prepare(fake_fla.inputs, "train")
    assert fake_fla.fwd_calls == 0
    out = p.outputs(p.run())
    assert fake_fla.fwd_calls == 1 and fake_fla.bwd_calls == 1
    assert set(out) == {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"}
    assert out["dg"] is fake_fla.grads[4] and out["o"] is fake_fla.o


def test_bwd_needs_do(fake_fla: FakeFla) -> None:
    fake_fla.inputs.do = None
    with pytest.raises(ValueError, match="do"):
        FlaBackend().prepare(fake_fla.inputs, "bwd")
