"""Round trips and element checks for the pure layout helpers the adapters use."""

from __future__ import annotations

import pytest
import torch

from qla_bench.backends.layouts import (
    add_batch,
    drop_batch,
    log_gate_to_linear,
    state_kv_to_vk,
    state_vk_to_kv,
)


def test_state_round_trip_is_exact_and_really_transposes() -> None:
    kv = torch.randn(3, 2, 4, 6)  # K != V so a missing or wrong transpose shows in the shape
    vk = state_kv_to_vk(kv)
    assert vk.shape == (3, 2, 6, 4)
    assert vk.is_contiguous()
    assert vk[1, 0, 5, 2] == kv[1, 0, 2, 5]
    back = state_vk_to_kv(vk)
    assert back.is_contiguous()
    assert torch.equal(back, kv)


def test_state_helpers_reject_non_4d() -> None:
    with pytest.raises(ValueError, match="state"):
        state_kv_to_vk(torch.zeros(2, 4, 4))


def test_log_gate_to_linear_is_exp_in_fp32() -> None:
    g = -torch.rand(1, 7, 3, dtype=torch.float32) * 5
    alpha = log_gate_to_linear(g)
    assert alpha.dtype == torch.float32
    assert torch.allclose(alpha, torch.exp(g))
    assert bool(((alpha > 0) & (alpha <= 1)).all())
    assert torch.allclose(torch.log(alpha), g, atol=1e-6)
    assert torch.equal(log_gate_to_linear(torch.zeros(2)), torch.ones(2))


def test_log_gate_to_linear_upcasts_half_and_rejects_ints() -> None:
    assert log_gate_to_linear(torch.zeros(2, dtype=torch.bfloat16)).dtype == torch.float32
    with pytest.raises(TypeError):
        log_gate_to_linear(torch.zeros(2, dtype=torch.int64))


def test_drop_batch_is_a_free_view_and_add_batch_inverts_it() -> None:
    x = torch.randn(1, 5, 2, 4)
    y = drop_batch(x)
    assert y.shape == (5, 2, 4)
    assert y.data_ptr() == x.data_ptr()
    assert y.is_contiguous()
    z = add_batch(y)
    assert z.shape == x.shape
    assert z.data_ptr() == x.data_ptr()
    assert torch.equal(z, x)


@pytest.mark.parametrize("shape", [(2, 5, 2, 4), (5,)])
def test_drop_batch_rejects_non_varlen(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"\[1, T"):
        drop_batch(torch.zeros(shape))
