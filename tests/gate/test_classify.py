"""Per-row classification rules, one rule per test, on hand-made samples."""

import numpy as np
import pytest
from gate_fakes import make_row

from qla_bench.gate import GateParams, Verdict, classify


def row(samples, **kw):
    return make_row("fla", 16, 64, (4096,), list(samples), **kw)


def spread(median, rel, n=30):
    """n evenly spread samples around `median` with relative half-width `rel` (no randomness)."""
    return list(median * (1 + np.linspace(-rel, rel, n)))


def test_identical_rows_are_same():
    r = row(spread(1.0, 0.02))
    c = classify(r, r)
    assert c.verdict is Verdict.SAME
    assert c.ratio == pytest.approx(1.0)


def test_clear_slowdown_is_slower_and_swapping_makes_it_faster():
    base, head = row(spread(1.0, 0.01)), row(spread(1.10, 0.01))
    slow = classify(base, head)
    assert slow.verdict is Verdict.SLOWER
    assert slow.p_value < 0.01
    assert slow.ratio_ci[0] < slow.ratio < slow.ratio_ci[1]
    fast = classify(head, base)
    assert fast.verdict is Verdict.FASTER
    assert fast.bound == pytest.approx(slow.bound)


def test_change_below_threshold_is_same():
    assert classify(row(spread(1.0, 0.001)), row(spread(1.04, 0.001))).verdict is Verdict.SAME


def test_noisy_row_is_ambiguous_not_slower():
    # 10 % slower, but the relative IQR is ~15 %, so the bound is ~45 %
    c = classify(row(spread(1.0, 0.3)), row(spread(1.10, 0.3)))
    assert c.verdict is Verdict.AMBIGUOUS
    assert c.bound > 0.3
    assert "within noise" in c.note


def test_rank_test_must_agree():
    # the medians differ by 10 % but the samples overlap so much that the rank test can't tell
    base = [0.5] * 7 + [1.0] + [1.5] * 7
    head = [0.5] * 7 + [1.1] + [1.5] * 7
    c = classify(row(base), row(head), GateParams(iqr_factor=0.0))
    assert c.verdict is Verdict.AMBIGUOUS
    assert c.p_value >= 0.01
    assert "rank test" in c.note


def test_too_few_samples_cannot_be_slower():
    c = classify(row([1.0, 1.0]), row([1.2, 1.2]))
    assert c.verdict is Verdict.AMBIGUOUS
    assert "too few samples" in c.note


def test_summary_only_rows_are_never_slower():
    base = row([], median_ms=1.0, q1_ms=1.0, q3_ms=1.0)
    head = row([], median_ms=1.5, q1_ms=1.5, q3_ms=1.5)
    assert classify(base, head).verdict is Verdict.AMBIGUOUS


def test_passed_to_anything_else_is_numerics():
    for status in ("INCORRECT", "ERROR", "OOM", "UNSUPPORTED"):
        c = classify(row(spread(1.0, 0.01)), row([], status=status, reason="rel L2 0.3 > 0.02"))
        assert c.verdict is Verdict.NUMERICS
        assert status in c.note and "rel L2" in c.note
        assert c.verdict.exit_code == 2


def test_missing_new_and_untimed():
    r = row(spread(1.0, 0.01))
    assert classify(r, None).verdict is Verdict.MISSING
    assert classify(None, r).verdict is Verdict.NEW
    unsupported = row([], status="UNSUPPORTED")
    assert classify(unsupported, unsupported).verdict is Verdict.UNTIMED
    assert classify(unsupported, r).verdict is Verdict.UNTIMED  # fixed: nothing to time against


def test_exit_codes_per_verdict():
    assert {v: v.exit_code for v in Verdict} == {
        Verdict.NUMERICS: 2,
        Verdict.MISSING: 2,
        Verdict.SLOWER: 1,
        Verdict.AMBIGUOUS: 0,
        Verdict.NEW: 0,
        Verdict.UNTIMED: 0,
        Verdict.FASTER: 0,
        Verdict.SAME: 0,
    }
