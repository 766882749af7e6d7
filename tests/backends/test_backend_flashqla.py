"""FlashQLA adapter: arch/dims gating, availability, and prepare/run/outputs against a fake flash_qla."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from qla_bench.backends.flashqla import FlashQLABackend, flashqla_arch_reason
from qla_bench.workload import HeadConfig, Workload


@pytest.mark.parametrize(
    ("cap", "mode", "ok"),
    [
        ((9, 0), "fwd", True),
        ((9, 0), "bwd", True),
        ((10, 3), "train", True),
        ((12, 0), "fwd", True),
        ((12, 0), "bwd", False),
        ((8, 0), "fwd", False),
        ((8, 9), "fwd", False),
    ],
)
def test_arch_reason(cap: tuple[int, int], mode: str, ok: bool) -> None:
    reason = flashqla_arch_reason(cap, mode)
    assert (reason is None) == ok
    if reason:
        assert f"sm_{cap[0]}{cap[1]}" in reason


def test_supports(fake_cuda) -> None:
    b = FlashQLABackend()
    wl = Workload(HeadConfig(2, 8), (32768,))
    assert "CUDA" in (b.supports(wl, "fwd", torch.device("cpu")) or "")
    dev = fake_cuda((9, 0))
    assert b.supports(wl, "bwd", dev) is None
    for k, v in ((64, 128), (128, 64), (256, 256)):
        reason = b.supports(Workload(HeadConfig(2, 8), (64,), k=k, v=v), "fwd", dev)
        assert reason is not None and "K = V = 128" in reason
    dev = fake_cuda((8, 0))
    assert "sm_80" in (b.supports(wl, "fwd", dev) or "")


def test_available_when_import_raises_value_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "flash_qla", None)
    assert "flash-qla is not installed" in (FlashQLABackend().available() or "")
    monkeypatch.delitem(sys.modules, "flash_qla")
    # the real flash_qla raises ValueError from TileLang at import when it sees no GPU
    pkg = tmp_path / "flash_qla"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ValueError('No CUDA architecture was specified or GPU detected')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    reason = FlashQLABackend().available()
    assert reason is not None and "ValueError" in reason and "cannot import flash_qla" in reason


class FakeFlashQLA:
    """Stands in for flash_qla's fwd/bwd: checks what the adapter passes, returns marked tensors."""

    def __init__(self, inputs) -> None:
        self.inputs = inputs
        self.fwd_calls: list[bool] = []
        self.bwd_calls = 0
        self.cp_cache = object()
        # (g_cumsum, A0, o, h, final_state, cp_cache), marked so the tests can tell them apart
        self.train_out = (*(torch.full((1,), float(i)) for i in range(5)), self.cp_cache)
        self.infer_out = (*(torch.full((1,), float(20 + i)) for i in range(5)), None)
        self.grads = tuple(torch.full((1,), float(10 + i)) for i in range(6))

    def fwd(self, **kw):
        x = self.inputs
        train = kw["is_train"]
        self.fwd_calls.append(train)
        assert kw["enable_fwd_cp_cache"] is train  # the cache exists only for a following backward
        assert kw["auto_cp"] is True and kw["output_final_state"] is True and kw["output_h"] is False
        assert kw["cu_seqlens"] is x.cu_seqlens  # identity: FlashQLA caches its CP plan by tensor object
        assert kw["g"].dtype == torch.float32 and torch.equal(kw["g"], x.g)
        assert torch.equal(kw["initial_state"], x.h0) and kw["initial_state"].shape == x.h0.shape
        assert kw["q"].shape == x.q.shape and kw["scale"] == x.scale
        assert "use_qk_l2norm_in_kernel" not in kw
        return self.train_out if train else self.infer_out

    def bwd(self, **kw):
        x = self.inputs
        self.bwd_calls += 1
        assert kw["g"] is self.train_out[0] and kw["A"] is self.train_out[1]  # its own g_cumsum and A0
        assert kw["cp_cache"] is self.cp_cache
        assert torch.equal(kw["initial_state"], x.h0)  # the raw h0, as its autograd saves it
        assert torch.equal(kw["do"], x.do) and torch.equal(kw["dht"], x.dht)
        assert kw["cu_seqlens"] is x.cu_seqlens and kw["auto_cp"] is True and kw["scale"] == x.scale
        return self.grads


@pytest.fixture
def fake_fq(install_module, make_inputs):
    fake = FakeFlashQLA(make_inputs(h_qk=2, h_v=4))
    install_module("flash_qla", chunk_gated_delta_rule_fwd=fake.fwd, chunk_gated_delta_rule_bwd=fake.bwd)
    return fake


def test_fwd_is_inference_mode(fake_fq: FakeFlashQLA) -> None:
    p = FlashQLABackend().prepare(fake_fq.inputs, "fwd")
    assert fake_fq.fwd_calls == []
    out = p.outputs(p.run())
    assert fake_fq.fwd_calls == [False]
    assert out["o"] is fake_fq.infer_out[2] and out["final_state"] is fake_fq.infer_out[4]


def test_bwd_uses_its_own_training_forward(fake_fq: FakeFlashQLA) -> None:
    p = FlashQLABackend().prepare(fake_fq.inputs, "bwd")
    assert fake_fq.fwd_calls == [True] and fake_fq.bwd_calls == 0
    res = p.run()
    assert fake_fq.fwd_calls == [True] and fake_fq.bwd_calls == 1
    out = p.outputs(res)
    order = ("dq", "dk", "dv", "dbeta", "dg", "dh0")  # FlashQLA returns dbeta before dg
    assert set(out) == set(order)
    for name, expected in zip(order, fake_fq.grads, strict=True):
        assert out[name] is expected, name


def test_train(fake_fq: FakeFlashQLA) -> None:
    p = FlashQLABackend().prepare(fake_fq.inputs, "train")
    out = p.outputs(p.run())
    assert fake_fq.fwd_calls == [True] and fake_fq.bwd_calls == 1
    assert out["o"] is fake_fq.train_out[2] and out["dg"] is fake_fq.grads[4]
    assert len(out) == 8
