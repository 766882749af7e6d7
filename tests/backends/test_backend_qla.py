"""qla adapter: modes, and bwd/train wiring against float64 stand-ins for the bundled kernels.

The stand-in forward returns what qla_kernels.chunk_gated_delta_rule_fwd does (o, final_state, the
chunk-local g_cumsum and the gate-free A0, here from the float64 reference and stage1_reference); the
stand-in backward is the torch chunk-form backward, which the TileLang backward implements. So the
adapter's argument order and output mapping are checked numerically against the naive recurrence.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest
import torch

from qla_bench.backends.qla import QlaBackend
from qla_bench.reference import chunk_gated_delta_rule_ref
from qla_kernels.gdn.bwd_chunked import chunk_gated_delta_rule_bwd, stage1_reference


class _Fwd(NamedTuple):
    o: torch.Tensor
    final_state: torch.Tensor
    g_cumsum: torch.Tensor
    a0: torch.Tensor


def _fake_fwd(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, output_final_state=True):
    o, ht = chunk_gated_delta_rule_ref(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True, cu_seqlens=cu_seqlens
    )
    gc, a0 = stage1_reference(k, g, beta, list(itertools.pairwise(cu_seqlens.tolist())))
    return _Fwd(o, ht, gc, a0)


def _install(install_module, calls):
    def fwd(*a, **kw):
        calls.append("fwd")
        return _fake_fwd(*a, **kw)

    def bwd(*a):
        calls.append("bwd")
        return chunk_gated_delta_rule_bwd(*a, compute_dtype=torch.float64)

    install_module("qla_kernels", KERNELS_READY=True, chunk_gated_delta_rule_fwd=fwd)
    install_module("qla_kernels.gdn.bwd_api", chunk_gated_delta_rule_bwd=bwd)


def test_modes_and_flags(monkeypatch):
    pytest.importorskip("qla_kernels.gdn.api")
    for var in ("QLA_FUSED_IMPL", "QLA_KKT_IMPL", "QLA_CP", "QLA_CP_COMBINE", "QLA_CP_COMBINE_REV", "QLA_CP_COMBINE_BV",
                "QLA_CP_COMBINE_THREADS", "QLA_BWD_CP", "QLA_BWD_GRADS", "QLA_BWD_GROUP_SUM",
                "QLA_BWD_OVERLAP", "QLA_BWD_FUSED", "QLA_CP_PIECE"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    b = QlaBackend()
    assert b.modes == ("fwd", "bwd", "train")
    flags = b.env_flags()
    assert "TileLang" in flags["qla_bwd"]
    assert flags["qla_fused"] == "auto (ws12, V-slice by config); ws6 where a backward follows"
    assert flags["qla_kkt"] == "v4; v4t where it writes Agb (forward only)"
    assert (flags["qla_bwd_grads"], flags["qla_bwd_group_sum"]) == ("rev8", "kernel")
    monkeypatch.setenv("QLA_BWD_GRADS", "rev9")  # stage 2 sums GVA groups of 1 or 2 itself
    rev9 = QlaBackend().env_flags()
    assert rev9["qla_bwd_group_sum"] == "kernel (only at h_v / h_qk not in 1, 2: stage 2 rev9 sums the group)"
    monkeypatch.delenv("QLA_BWD_GRADS")
    monkeypatch.setenv("QLA_FUSED_IMPL", "ws10")  # no A0: bwd and train rows say their forward ran ws6
    assert QlaBackend().env_flags()["qla_fused"] == "ws10; ws6 where a backward follows"
    assert flags["qla_cp"] == "on (combine: kernel rev 2, 32 columns, 128 threads)"
    monkeypatch.setenv("QLA_CP_COMBINE_REV", "1")
    monkeypatch.setenv("QLA_CP_COMBINE_BV", "64")
    assert b.env_flags()["qla_cp"] == "on (combine: kernel rev 1, 64 columns, 128 threads)"
    monkeypatch.setenv("QLA_CP_PIECE", "16")
    assert b.env_flags()["qla_cp"] == "on (combine: kernel rev 1, 64 columns, 128 threads, pieces of 16 chunks forced)"
    monkeypatch.delenv("QLA_CP_PIECE")
    monkeypatch.setenv("QLA_CP_COMBINE_BV", "48")
    with pytest.raises(ValueError, match=r"\$QLA_CP_COMBINE_BV must be one of \['32', '64'\]"):
        b.env_flags()
    monkeypatch.delenv("QLA_CP_COMBINE_BV")
    monkeypatch.setenv("QLA_KKT_IMPL", "v3")
    monkeypatch.setenv("QLA_FUSED_IMPL", "v2")
    monkeypatch.setenv("QLA_CP_COMBINE", "views")
    assert (b.env_flags()["qla_kkt"], b.env_flags()["qla_fused"], b.env_flags()["qla_cp"]) == (
        "v3", "v2", "on (combine: views)")
    monkeypatch.setenv("QLA_CP", "0")
    assert b.env_flags()["qla_cp"] == "off"
    assert b.env_flags()["qla_bwd_cp"].startswith("on")
    monkeypatch.setenv("QLA_BWD_CP", "0")
    assert b.env_flags()["qla_bwd_cp"] == "off"
    assert flags["qla_bwd_overlap"] == "off"
    monkeypatch.setenv("QLA_BWD_OVERLAP", "1")
    assert b.env_flags()["qla_bwd_overlap"] == "stage 0 beside stage 1"
    assert flags["qla_bwd_fused"] == "off"
    monkeypatch.setenv("QLA_BWD_FUSED", "1")
    assert b.env_flags()["qla_bwd_fused"] == "chain and gradients in one walk (rev12 math)"
    monkeypatch.setenv("QLA_BWD_FUSED", "2")
    assert b.env_flags()["qla_bwd_fused"].endswith("loads prefetched")


def test_bwd_and_train_map_the_six_gradients(make_inputs, naive_gdn_grads, install_module):
    calls: list[str] = []
    _install(install_module, calls)
    inputs = make_inputs(seqlens=(70, 3), h_qk=1, h_v=2)
    ref = naive_gdn_grads(inputs)

    p = QlaBackend().prepare(inputs, "bwd")
    assert calls == ["fwd"]  # its own forward, once, untimed
    out = p.outputs(p.run())
    assert calls == ["fwd", "bwd"]
    assert set(out) == {"dq", "dk", "dv", "dg", "dbeta", "dh0"}
    for name, got in out.items():
        err = ((got.double() - ref[name]).norm() / ref[name].norm()).item()
        assert err < 1e-2, (name, err)  # bf16 q/k/v/do rounding on the adapter's outputs

    p = QlaBackend().prepare(inputs, "train")
    out = p.outputs(p.run())
    assert len(out) == 8 and ((out["o"].double() - ref["o"]).norm() / ref["o"].norm()).item() < 1e-6
