"""The inverse emulations of rounding_study_inverse: each is (I + L)^-1 to its precision, and the gated form equals
the ungated inverse gated afterwards (the identity FlashInfer's order rests on)."""

import torch

from qla_kernels.gdn.rounding_study_inverse import C, _inputs, agb_variants, inverse_fp16, inverse_v4t, walk_errors


def _strict_lower(seed: int, gated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _, k, _, g, beta = _inputs(seed, 1, "flashqla", correlated=True)
    gc = torch.cumsum(g, 0)
    gam = torch.tril(torch.exp(torch.tril(gc[:, None] - gc[None, :])))
    low = torch.tril(beta[:, None] * (k @ k.T), -1)
    return (gam * low if gated else low), gam


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_each_emulated_inverse_is_the_inverse_to_its_precision():
    low, _ = _strict_lower(3, gated=True)
    exact = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + low)
    assert _rel(inverse_v4t(low), exact) < 2e-3  # tf32 operands: ~1e-4 .. 1e-3
    assert _rel(inverse_fp16(low), exact) < 3e-3  # fp16 storage
    assert _rel(inverse_fp16(low), exact) > 1e-6  # it does round


def test_gating_before_the_inverse_equals_gating_after():
    low, gam = _strict_lower(5, gated=False)
    eye = torch.eye(C, dtype=torch.float64)
    after = gam * torch.linalg.inv(eye + low)
    before = torch.linalg.inv(eye + gam * low)
    assert _rel(before, after) < 1e-12


def test_every_method_is_close_to_exact_and_the_walk_reports_each():
    _, k, _, g, beta = _inputs(7, 1, "zero", correlated=True)
    agbs = agb_variants(k, g, beta)
    for name, agb in agbs.items():
        assert _rel(agb, agbs["exact"]) < 5e-3, name
    errs = walk_errors(7, chunks=1, gate="strong")
    assert set(errs) == set(agbs) - {"exact"}
    assert all(0 < e["o"] < 1e-2 and 0 < e["state"] < 1e-2 for e in errs.values())


def test_whole_tile_doublings_equal_the_blockwise_ones():
    from qla_kernels.gdn.rounding_study_inverse import inverse_fp16_full, partner_mask

    assert int(partner_mask(8).sum()) == 4 * 64 and int(partner_mask(32).sum()) == 32 * 32
    low, _ = _strict_lower(11, gated=True)
    exact = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + low)
    full = inverse_fp16_full(low)
    assert _rel(full, exact) < 3e-3
    assert _rel(full, inverse_fp16(low)) < 3e-3
    assert torch.equal(full, torch.tril(full))  # nothing above the diagonal
