"""The fused backward's switch ($QLA_BWD_FUSED) and its context-parallel choice (bwd_cp_plan.choose_fused_cp), on
the CPU. The walk itself is checked against float64 through TileLang's C backend
(test_bwd_chunk_grads_cpu.py::test_fused_walk_matches_float64) and on the GPU (tests/gpu/test_qla_bwd.py and
test_qla_bwd_cp.py with QLA_BWD_FUSED=1)."""

import pytest

from qla_kernels.gdn import bwd_api
from qla_kernels.gdn.bwd_cp_plan import FUSED_STEP_US, choose_fused_cp, fused_walk_us, predict_fused_us


def test_switch_defaults_off_until_measured_and_names_itself(monkeypatch):
    monkeypatch.delenv(bwd_api.BWD_FUSED_ENV, raising=False)
    assert bwd_api.DEFAULT_BWD_FUSED == "0" and bwd_api.resolve_bwd_fused_mode() == "0"
    for value, mode in (("1", "1"), ("2", "2"), (" 0 ", "0"), ("ws", "ws"), ("ws2", "ws2"), ("ws3", "ws3")):
        monkeypatch.setenv(bwd_api.BWD_FUSED_ENV, value)
        assert bwd_api.resolve_bwd_fused_mode() == mode
    monkeypatch.setenv(bwd_api.BWD_FUSED_ENV, "yes")
    with pytest.raises(ValueError, match=r"\$QLA_BWD_FUSED must be one of \['0', '1', '2', 'ws', 'ws2', 'ws3'\]"):
        bwd_api.resolve_bwd_fused_mode()


def test_walk_time_is_the_longest_chain_or_the_rounds_of_ctas():
    # 4 chains x 32 heads = 128 CTAs fit 132 SMs: the longest chain decides
    assert fused_walk_us([128, 128, 100, 64], 32, 132) == pytest.approx(128 * FUSED_STEP_US)
    # 8 x 32 = 256 CTAs: two rounds of the mean chain
    assert fused_walk_us([16] * 8, 32, 132) == pytest.approx(2 * 16 * FUSED_STEP_US)


def test_cp_splits_few_long_sequences_and_leaves_full_grids_alone():
    # one 32 K-token sequence on 4 value heads: 4 CTAs walking 512 chunks each without CP
    piece = choose_fused_cp([512], 4, 132)
    assert piece is not None and piece < 512
    assert predict_fused_us([512], 4, 132, piece) < 0.5 * predict_fused_us([512], 4, 132, None)
    # 8 sequences on 32 value heads already fill the SMs twice over: no split
    assert choose_fused_cp([64] * 8, 32, 132) is None


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="h_v >= 1"):
        choose_fused_cp([4], 0, 132)
    with pytest.raises(ValueError, match="sequences of >= 1 chunk"):
        choose_fused_cp([], 4, 132)


@pytest.mark.parametrize(("states", "split"), [("ws5", True), ("ws12", True), ("v2", False)])
def test_staged_cp_runs_with_either_ws_stage0(monkeypatch, states, split):
    """The staged backward's CP stores its states with a ws walk (ws5, or ws12 from Agb): both keep CP (a
    gate asking for ws5 alone once ran ws12 without it); the v2 store has no CP path."""
    import torch

    from qla_kernels.gdn.plan import build_plan_from_list

    monkeypatch.setattr(bwd_api, "_num_sms", lambda device: 132)
    monkeypatch.setenv(bwd_api.STATES_IMPL_ENV, states)
    monkeypatch.delenv(bwd_api.BWD_CP_ENV, raising=False)
    plan = build_plan_from_list([0, 64 * 64], "cpu")
    cpp = bwd_api._bwd_cp_plan(plan, 4, torch.device("cpu"), None, 16)
    assert (cpp is not None) == split
    if split:
        assert cpp.num_pieces == 4
