"""FLA's dg path emulated in float64 (gdn/rounding_study_dg_fla.py): unrounded, it is the specification that
rounding_study_dg's emulation of ours is measured against; every rounding switch changes it; its errors are
bf16-sized."""

import pytest
import torch

from qla_kernels.gdn import rounding_study_dg as ours
from qla_kernels.gdn import rounding_study_dg_fla as fla


@pytest.fixture(scope="module")
def x():
    return fla.make_inputs(200, h_v=2)  # three full chunks and a ragged one; head 0 at g = 0


def test_unrounded_path_is_the_specification(x):
    ref = ours.dg(x, exact=True)
    assert torch.allclose(fla.dg(x, exact=True), ref, rtol=1e-10, atol=1e-10)
    assert torch.allclose(fla.dg(x, fla.ROUNDINGS), ref, rtol=1e-10, atol=1e-10)


def test_gated_inverse_identity_needs_the_exact_a0(x):
    """FLA's dg reaches the gates through L with A = (I + L)^-1: with rounding_study_dg's bf16 A0 as the inverse
    its unrounded path leaves the specification (ours does not), hence make_inputs' exact A0."""
    xb = fla.ours_view(x)
    ref = ours.dg(xb, exact=True)
    assert fla.rel(fla.dg(xb, exact=True), ref) > 1e-6
    assert torch.allclose(ours.dg(xb, exact=True), ref)


def test_every_rounding_is_switchable_and_bf16_sized(x):
    ref = ours.dg(x, exact=True)
    every = fla.rel(fla.dg(x), ref)
    assert 1e-4 < every < 3e-2
    assert 1e-4 < fla.rel(fla.dg(x, fla.LIKE_FOR_LIKE), ref) < 3e-2
    for name in fla.ROUNDINGS:
        alone = fla.dg(x, tuple(r for r in fla.ROUNDINGS if r != name))
        err = fla.rel(alone, ref)
        assert 1e-7 < err < 1e-2, name
    with pytest.raises(ValueError, match="unknown roundings"):
        fla.dg(x, ("s",))


@pytest.mark.parametrize("stage0", fla.STAGE0_FORMS)
def test_chains_are_bf16_close(x, stage0):
    ours_states, ours_ds = fla.ours_chains(x, stage0)
    fla_states, fla_ds = fla.fla_chains(x)
    for states, ds_next in ((ours_states, ours_ds), (fla_states, fla_ds)):
        assert torch.equal(states[0], x["s0"]) and torch.equal(ds_next[-1], x["dht"])
        for got, want in ((states, x["states"]), (ds_next, x["ds_next"])):
            err = ((got - want).norm() / want.norm()).item()
            assert 1e-5 < err < 1e-2
    assert not torch.equal(ours_states, fla_states)
    with pytest.raises(ValueError, match="stage0 must be one of"):
        fla.ours_chains(x, "ws5")


def test_tf32_rounds_to_nearest_ties_away():
    t = torch.tensor([1 + 2**-10, 1 + 2**-11, 1 + 2**-12, -(1 + 2**-11), 3.0], dtype=torch.float64)
    want = torch.tensor([1 + 2**-10, 1 + 2**-10, 1.0, -(1 + 2**-10), 3.0], dtype=torch.float64)
    assert torch.equal(fla._tf32(t), want)
