"""The backward's CP decision (gdn/bwd_cp_plan.py) against what the H200 measured (session 9): the change of
the whole backward with CP at forced piece lengths (tests/gpu/test_qla_bwd_cp.py::test_time_bwd_cp,
results/H200/logs/2026-12-03-s9/call4-bwd_cp_timing.json) and two qwen35-bwd rows where session 9's first
model split and lost. Those ran stage 1 rev3 and CP's combine rev 1 (~10.5 us a link), so the model is checked
with rev3's step and that link cost."""

import dataclasses
import itertools

import pytest

from qla_kernels.gdn.bwd_cp_plan import STAGE0_HEURISTICS, choose_bwd_cp, predict_bwd_chains_us, stage1_chain_us
from qla_kernels.gdn.plan import build_plan_from_list

SMS = 132
SESSION9 = dataclasses.replace(STAGE0_HEURISTICS, combine_link_us=10.5)  # the combine those runs had (rev 1)
EIGHT_SEQ = [14107, 254, 2718, 4495, 4343, 818, 237, 5796]  # qwen35-bwd's 32k_8seq
MEASURED = {  # (h_v, sequence lengths, piece) -> ms of the whole backward, (without CP, with CP)
    (4, (32768,), 64): (2.8901, 1.4220),
    (4, (32768,), 16): (2.8901, 1.8249),
    (8, (32768,), 64): (3.4061, 2.3620),
    (8, (32768,), 8): (3.4061, 3.7246),
    (16, (32768,), 64): (4.5682, 4.3332),
    (32, (32768,), 64): (6.9393, 8.2788),
    (4, (8192,) * 4, 32): (1.2133, 1.2471),
    (8, (4096,) * 8, 16): (1.6966, 2.3383),
    (4, (8192,), 16): (0.7463, 0.5219),
    (8, tuple(EIGHT_SEQ), 32): (2.276, 2.480),  # qwen35-bwd rows, without (session 7) and with CP (session 9)
    (16, tuple(EIGHT_SEQ), 64): (3.801, 4.651),
}


def chunks(lens):
    return [-(-n // 64) for n in lens]


@pytest.mark.parametrize(("h_v", "lens", "piece"), list(MEASURED))
def test_predicted_change_follows_the_h200(h_v, lens, piece):
    """Stage 2 and the parallel parts do not change with CP, so the model is checked on the change it
    predicts: within 0.25 ms, or 25 % of the change, and the same sign wherever the change is above 0.1 ms."""
    plain, with_cp = MEASURED[(h_v, lens, piece)]
    measured = 1000 * (with_cp - plain)
    c = chunks(lens)
    predicted = predict_bwd_chains_us(c, h_v, SMS, piece, SESSION9, rev="rev3") - predict_bwd_chains_us(
        c, h_v, SMS, None, SESSION9, rev="rev3"
    )
    assert abs(predicted - measured) <= max(250.0, 0.25 * abs(measured)), (predicted, measured)
    if abs(measured) > 100:
        assert (predicted > 0) == (measured > 0), (predicted, measured)


def test_decisions():
    assert choose_bwd_cp(chunks([32768]), 4, SMS) == 64  # 2/4 x 32 K: measured 2.03x
    assert choose_bwd_cp(chunks([8192]), 4, SMS) in (16, 32)  # measured 1.43x at 16, 1.31x at 32
    assert choose_bwd_cp(chunks([32768]), 32, SMS) is None  # 16/32: CP measured 1.19x slower at best
    assert choose_bwd_cp(chunks(EIGHT_SEQ), 8, SMS) is None  # the two losers of session 9's first model
    assert choose_bwd_cp(chunks(EIGHT_SEQ), 16, SMS) is None
    assert choose_bwd_cp(chunks([8192] * 4), 4, SMS) is None


def test_stage1_estimate_prefers_more_ctas_per_chain_for_one_sequence():
    one = stage1_chain_us([512], 4, SMS)
    assert 512 * 2.88 <= one <= 512 * 5.07  # one chain: the longest chain at the chosen width
    assert stage1_chain_us([64] * 8, 4, SMS) < one / 4  # eight pieces run side by side


def test_bad_arguments():
    with pytest.raises(ValueError, match="h_v"):
        choose_bwd_cp([4], 0, SMS)
    with pytest.raises(ValueError, match="chunk"):
        choose_bwd_cp([], 4, SMS)


def test_cached_per_plan(monkeypatch):
    from qla_kernels.gdn import bwd_cp_plan

    plan = build_plan_from_list([0, *itertools.accumulate([32768])], "cpu")
    assert bwd_cp_plan.bwd_piece_chunks(plan, 4, SMS) == 64
    monkeypatch.setattr(bwd_cp_plan, "choose_bwd_cp", lambda *a, **k: pytest.fail("decided again"))
    assert bwd_cp_plan.bwd_piece_chunks(plan, 4, SMS) == 64  # a hit: not decided again
    with pytest.raises(pytest.fail.Exception):
        bwd_cp_plan.bwd_piece_chunks(plan, 8, SMS)  # the head count is part of the key
    with pytest.raises(pytest.fail.Exception):
        bwd_cp_plan.bwd_piece_chunks(plan, 4, SMS, "rev3")  # and stage 1's revision (its step time)


def test_rev4_steps_are_slower_and_named():
    """rev4's extra GEMM makes each chain step longer; the decision names an unknown revision."""
    assert stage1_chain_us([512], 4, SMS, "rev4") > stage1_chain_us([512], 4, SMS, "rev3")
    with pytest.raises(ValueError, match="rev must be one of"):
        choose_bwd_cp([512], 4, SMS, rev="rev2")


def test_env_switch(monkeypatch):
    from qla_kernels.gdn.bwd_api import resolve_bwd_cp

    monkeypatch.delenv("QLA_BWD_CP", raising=False)
    assert resolve_bwd_cp()
    monkeypatch.setenv("QLA_BWD_CP", "0")
    assert not resolve_bwd_cp()
    monkeypatch.setenv("QLA_BWD_CP", "yes")
    with pytest.raises(ValueError, match="QLA_BWD_CP"):
        resolve_bwd_cp()


def test_skipping_by_lower_bounds_changes_no_decision():
    """choose_bwd_cp skips piece lengths whose floor cannot win (session 14); its choice equals scheduling every
    piece length, over 120 random mixes."""
    import random

    from qla_kernels.gdn.bwd_cp_plan import MARGIN, STAGE0_HEURISTICS

    rng = random.Random(1)
    for _ in range(120):
        n = rng.choice((1, 1, 2, 2, 3, 4, 8))
        total = rng.choice((2048, 8192, 32768))
        cuts = sorted(rng.sample(range(1, total), n - 1))
        chunks = [-(-(b - a) // 64) for a, b in zip([0, *cuts], [*cuts, total])]
        h_v = rng.choice((4, 8, 16, 32))
        base = predict_bwd_chains_us(chunks, h_v, 132, None)
        times = {p: predict_bwd_chains_us(chunks, h_v, 132, p) for p in STAGE0_HEURISTICS.piece_candidates(max(chunks))}
        best = min(times, key=lambda p: (times[p], p), default=None)
        want = best if best is not None and times[best] < base and times[best] <= base * (1.0 - MARGIN) else None
        assert choose_bwd_cp(chunks, h_v, 132) == want, (chunks, h_v, times, base)
