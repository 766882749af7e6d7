"""FlashInfer adapter: call shape per version, layouts (linear gate, V-first state), against fakes."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from qla_bench.backends import _REGISTRY
from qla_bench.backends import flashinfer as fi_backend
from qla_bench.backends.flashinfer import (
    CallShape,
    FlashInferBackend,
    FlashInferCPBackend,
    call_shape,
    extra_kwargs,
    signature_params,
    supported_archs,
)
from qla_bench.workload import HeadConfig, Workload

MOD = "flashinfer.gdn_prefill"
OLD = CallShape("0.6.9", False, False, False)
NEW = CallShape("0.7.4", True, True, True)


# Keyword sets of the two published signatures (read from the 0.6.9 and 0.7.4 wheels).
def sig_069(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
            cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
            state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0):  # fmt: skip
    raise NotImplementedError


def sig_074(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
            cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
            state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0,
            use_cp="auto", state_indices=None, _cp_chunk_len=None, backend="auto", max_seqlen=None,
            *, gate_domain="linear", use_gate_in_kernel=False, A_log=None, dt_bias=None,
            beta_is_logit=False, cu_seqlens_cpu=None):  # fmt: skip
    raise NotImplementedError


def test_call_shape_from_signature_and_version() -> None:
    assert call_shape("0.6.9", signature_params(sig_069)) == OLD
    assert call_shape("0.7.4", signature_params(sig_074)) == NEW
    assert call_shape("0.6.9", None) == OLD
    assert call_shape("0.7.4", None) == NEW
    # the signature wins over the number (e.g. a dev build)
    assert call_shape("0.7.0.dev1", signature_params(sig_069)).use_cp is False


def test_signature_params_follows_wraps_and_ignores_bare_wrappers() -> None:
    @functools.wraps(sig_074)
    def logged(*args, **kwargs):
        return sig_074(*args, **kwargs)

    params = signature_params(logged)
    assert params is not None and "use_cp" in params and "gate_domain" in params
    assert signature_params(lambda *a, **k: None) is None


def test_extra_kwargs() -> None:
    assert extra_kwargs(OLD, use_cp=False, gate_domain="linear", max_seqlen=99) == {}
    assert extra_kwargs(NEW, use_cp=False, gate_domain="linear", max_seqlen=99) == {"use_cp": False}
    assert extra_kwargs(NEW, use_cp="auto", gate_domain="log", max_seqlen=99) == {
        "use_cp": "auto",
        "gate_domain": "log",
        "max_seqlen": 99,
    }
    with pytest.raises(ValueError, match="use_cp"):
        extra_kwargs(OLD, use_cp="auto", gate_domain="linear", max_seqlen=None)
    with pytest.raises(ValueError, match="gate_domain"):
        extra_kwargs(OLD, use_cp=False, gate_domain="log", max_seqlen=None)


def test_supported_archs() -> None:
    assert 8 not in supported_archs("0.6.9") and 9 in supported_archs("0.6.9")
    assert {8, 9, 10, 12} <= set(supported_archs("0.7.4"))


def test_registered_names() -> None:
    assert _REGISTRY["flashinfer"] is FlashInferBackend
    assert _REGISTRY["flashinfer-cp"] is FlashInferCPBackend
    assert FlashInferBackend.modes == ("fwd",)


def test_available_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    assert "flashinfer-python is not installed" in (FlashInferBackend().available() or "")


def test_supports(monkeypatch: pytest.MonkeyPatch, fake_cuda, install_module) -> None:
    install_module(MOD, chunk_gated_delta_rule=sig_069)
    monkeypatch.setattr(fi_backend, "dist_version", lambda dist: "0.6.9")
    monkeypatch.setenv("QLA_FLASHINFER_ALLOW_BUILD", "1")  # the JIT-module check has its own test
    b, bcp = FlashInferBackend(), FlashInferCPBackend()
    wl = Workload(HeadConfig(16, 32), (8192,) * 4)
    dev = fake_cuda((9, 0))
    assert b.supports(wl, "fwd", dev) is None
    assert "no bwd pass" in (b.supports(wl, "bwd", dev) or "")
    assert "no train pass" in (b.supports(wl, "train", dev) or "")
    assert "K = V = 128" in (b.supports(Workload(HeadConfig(1, 1), (64,), k=64, v=64), "fwd", dev) or "")
    assert "use_cp" in (bcp.supports(wl, "fwd", dev) or "")  # 0.6.9 has no CP
    monkeypatch.setenv("QLA_FLASHINFER_GATE_DOMAIN", "log")
    assert "gate_domain" in (b.supports(wl, "fwd", dev) or "")
    monkeypatch.delenv("QLA_FLASHINFER_GATE_DOMAIN")
    assert "sm_80" in (b.supports(wl, "fwd", fake_cuda((8, 0))) or "")
    install_module(MOD, chunk_gated_delta_rule=sig_074)
    monkeypatch.setattr(fi_backend, "dist_version", lambda dist: "0.7.4")
    assert bcp.supports(wl, "fwd", fake_cuda((9, 0))) is None
    assert b.supports(wl, "fwd", fake_cuda((8, 0))) is None


def _flashinfer_naive(q, k, v, g, beta, scale, initial_state, cu_seqlens):
    """GDN written in FlashInfer's conventions: [T,H,D] tokens, linear alpha, state S[v, k] (V-first).

    Deliberately not a transpose of the canonical recurrence: S <- alpha S; S += beta (v - S k) k^T;
    o = scale S q. Fed a log gate or a K-first state it gives different numbers.
    """
    r = v.shape[1] // q.shape[1]
    o = torch.zeros(v.shape, dtype=torch.float64)
    final = torch.zeros(initial_state.shape, dtype=torch.float64)
    cu = cu_seqlens.tolist()
    for n in range(len(cu) - 1):
        for h in range(v.shape[1]):
            s = initial_state[n, h].double().clone()  # [V, K]
            for t in range(cu[n], cu[n + 1]):
                kt, qt, vt = k[t, h // r].double(), q[t, h // r].double(), v[t, h].double()
                s = g[t, h].double() * s
                s = s + beta[t, h].double() * torch.outer(vt - s @ kt, kt)
                o[t, h] = scale * (s @ qt)
            final[n, h] = s
    return o, final


def _fake_entry(version: str, seen: dict):
    """A fake chunk_gated_delta_rule with the given version's signature that computes real numbers."""

    def check_and_run(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, **kw):
        seen.update(kw, q=q, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens)
        assert q.dim() == 3 and k.dim() == 3 and v.dim() == 3  # [T, H, D], no batch dim
        assert g.dtype == torch.float32 and beta.dtype == torch.float32 and g.dim() == 2
        assert initial_state.dtype == torch.float32 and initial_state.is_contiguous()
        assert cu_seqlens.dtype == torch.int64 and output_final_state is True
        assert kw.get("use_qk_l2norm_in_kernel") is False
        gate = torch.exp(g) if kw.get("gate_domain") == "log" else g
        return _flashinfer_naive(q, k, v, gate, beta, scale, initial_state, cu_seqlens)

    if version == "0.6.9":

        def entry(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                  cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
                  state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0):  # fmt: skip
            return check_and_run(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)  # fmt: skip

    else:

        def entry(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                  cu_seqlens=None, use_qk_l2norm_in_kernel=False, use_cp="auto", max_seqlen=None, *,
                  gate_domain="linear"):  # fmt: skip
            return check_and_run(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_cp=use_cp,
                                 max_seqlen=max_seqlen, gate_domain=gate_domain)  # fmt: skip

    return entry


@pytest.mark.parametrize("version", ["0.6.9", "0.7.4"])
def test_fwd_layouts_give_the_canonical_answer(
    version: str, monkeypatch: pytest.MonkeyPatch, install_module, make_inputs, naive_gdn
) -> None:
    seen: dict = {}
    install_module(MOD, chunk_gated_delta_rule=_fake_entry(version, seen))
    monkeypatch.setattr(fi_backend, "dist_version", lambda dist: version)
    inputs = make_inputs(seqlens=(5, 3, 1), h_qk=1, h_v=2, k_dim=4, v_dim=4)
    p = FlashInferBackend().prepare(inputs, "fwd")
    assert seen == {}  # nothing runs in prepare
    out = p.outputs(p.run())
    o_ref, ht_ref = naive_gdn(inputs)
    assert out["o"].shape == inputs.v.shape
    assert out["final_state"].shape == inputs.h0.shape
    torch.testing.assert_close(out["o"], o_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["final_state"], ht_ref, rtol=1e-6, atol=1e-6)
    assert seen["q"].data_ptr() == inputs.q.data_ptr()  # a free view, no copy
    assert seen["cu_seqlens"] is inputs.cu_seqlens
    assert torch.allclose(seen["g"], torch.exp(inputs.g[0]))  # linear alpha
    assert torch.equal(seen["initial_state"], inputs.h0.transpose(-1, -2))  # V-first
    if version == "0.6.9":
        assert "use_cp" not in seen
    else:
        assert seen["use_cp"] is False and seen["gate_domain"] == "linear" and seen["max_seqlen"] is None


def test_fwd_cp_variant_and_log_domain_on_074(
    monkeypatch: pytest.MonkeyPatch, install_module, make_inputs, naive_gdn
) -> None:
    seen: dict = {}
    install_module(MOD, chunk_gated_delta_rule=_fake_entry("0.7.4", seen))
    monkeypatch.setattr(fi_backend, "dist_version", lambda dist: "0.7.4")
    monkeypatch.setenv("QLA_FLASHINFER_GATE_DOMAIN", "log")
    inputs = make_inputs(seqlens=(5, 7, 2))
    b = FlashInferCPBackend()
    p = b.prepare(inputs, "fwd")
    out = p.outputs(p.run())
    assert seen["use_cp"] == "auto" and seen["max_seqlen"] == 7 and seen["gate_domain"] == "log"
    assert torch.equal(seen["g"], inputs.g[0])  # the log gate itself
    torch.testing.assert_close(out["o"], naive_gdn(inputs)[0], rtol=1e-6, atol=1e-6)
    assert b.env_flags() == {
        "QLA_FLASHINFER_GATE_DOMAIN": "log",
        "flashinfer_use_cp": "auto",
        "flashinfer_gate_domain": "log",
    }


def test_log_domain_refused_on_069(monkeypatch: pytest.MonkeyPatch, install_module, make_inputs) -> None:
    install_module(MOD, chunk_gated_delta_rule=_fake_entry("0.6.9", {}))
    monkeypatch.setattr(fi_backend, "dist_version", lambda dist: "0.6.9")
    monkeypatch.setenv("QLA_FLASHINFER_GATE_DOMAIN", "log")
    with pytest.raises(ValueError, match="gate_domain"):
        FlashInferBackend().prepare(make_inputs(), "fwd")


def test_bad_gate_domain_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLA_FLASHINFER_GATE_DOMAIN", "ln")
    with pytest.raises(ValueError, match="QLA_FLASHINFER_GATE_DOMAIN"):
        FlashInferBackend().env_flags()


def test_unbuilt_jit_module_is_unsupported_until_prepare(tmp_path, monkeypatch):
    from qla_bench.backends.flashinfer import ALLOW_BUILD_ENV, jit_module_path, unbuilt_jit_reason

    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    monkeypatch.delenv(ALLOW_BUILD_ENV, raising=False)
    path = jit_module_path("0.6.9", (9, 0))
    assert path == tmp_path / ".cache/flashinfer/0.6.9/90a/cached_ops/gdn_prefill_sm90/gdn_prefill_sm90.so"
    reason = unbuilt_jit_reason("0.6.9", (9, 0), aot_present=False)
    assert reason and "qla-bench prepare --backends flashinfer" in reason
    assert unbuilt_jit_reason("0.6.9", (9, 0), aot_present=True) is None
    assert unbuilt_jit_reason("0.7.4", (9, 0), aot_present=False) is None
    monkeypatch.setenv(ALLOW_BUILD_ENV, "1")
    assert unbuilt_jit_reason("0.6.9", (9, 0), aot_present=False) is None
    monkeypatch.delenv(ALLOW_BUILD_ENV)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF")
    assert unbuilt_jit_reason("0.6.9", (9, 0), aot_present=False) is None
