"""Pure per-row classification: is the candidate slower, faster, the same, or can't we tell?

SLOWER needs two independent pieces of evidence: a median change larger than the noise of the row
(max(threshold, iqr_factor x relative IQR)) AND a one-sided Mann-Whitney test on the raw samples. A
row that moved more than the threshold without both is AMBIGUOUS, not a failure. FASTER is the mirror
image (in log space, so swapping baseline and candidate swaps SLOWER and FASTER exactly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np
from scipy.stats import mannwhitneyu

from ..rows import Row
from .labels import row_name
from .params import GateParams


class Verdict(str, Enum):
    """Outcome of one row. Listed from most to least severe (outputs sort by this order)."""

    NUMERICS = "NUMERICS"  # PASSED in the baseline, anything else in the candidate
    MISSING = "MISSING"  # in the baseline, absent from the candidate
    SLOWER = "SLOWER"
    AMBIGUOUS = "AMBIGUOUS"  # moved beyond the threshold, but within noise or not significant
    NEW = "NEW"  # only in the candidate
    UNTIMED = "UNTIMED"  # no timing on one side to compare (e.g. UNSUPPORTED on both)
    FASTER = "FASTER"
    SAME = "SAME"

    @property
    def severity(self) -> int:
        return list(Verdict).index(self)

    @property
    def exit_code(self) -> int:
        """0 pass, 1 performance regression, 2 numerics failure or missing row."""
        if self in (Verdict.NUMERICS, Verdict.MISSING):
            return 2
        return 1 if self is Verdict.SLOWER else 0


@dataclass(frozen=True)
class Timing:
    """The numbers of one side of a comparison."""

    median: float
    rel_iqr: float
    samples: tuple[float, ...]


@dataclass
class Comparison:
    """One config, baseline vs candidate: the verdict and the evidence behind it."""

    key: tuple
    name: str
    base: Row | None
    head: Row | None
    verdict: Verdict
    ratio: float | None = None  # candidate median / baseline median
    ratio_ci: tuple[float, float] | None = None  # bootstrap 95 % CI of that ratio
    p_value: float | None = None  # one-sided Mann-Whitney, in the direction of the change
    bound: float | None = None  # the relative change the row had to exceed
    noise: float | None = None  # max relative IQR of the two sides
    note: str = ""

    @property
    def row(self) -> Row | None:
        """The row that describes this config (candidate when present)."""
        return self.head or self.base

    @property
    def base_ms(self) -> float | None:
        return _median_of(self.base)

    @property
    def head_ms(self) -> float | None:
        return _median_of(self.head)


def timing_of(row: Row | None) -> Timing | None:
    """Median and relative IQR from the raw samples when present, else from the stored summary."""
    if row is None or not row.passed:
        return None
    samples = tuple(float(x) for x in row.samples_ms if x is not None and math.isfinite(x))
    if samples:
        q1, med, q3 = np.quantile(samples, [0.25, 0.5, 0.75])
        med, q1, q3 = float(med), float(q1), float(q3)
    elif row.median_ms is not None:
        med = float(row.median_ms)
        q1 = float(row.q1_ms) if row.q1_ms is not None else med
        q3 = float(row.q3_ms) if row.q3_ms is not None else med
    else:
        return None
    if not med > 0:
        return None
    return Timing(median=med, rel_iqr=(q3 - q1) / med, samples=samples)


def _median_of(row: Row | None) -> float | None:
    t = timing_of(row)
    return t.median if t else None


def ratio_ci(
    base: tuple[float, ...],
    head: tuple[float, ...],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap CI of median(head) / median(base), resampling both sides (seeded)."""
    if len(base) < 2 or len(head) < 2:
        return None
    rng = np.random.default_rng(seed)
    b, h = np.asarray(base), np.asarray(head)
    mb = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    mh = np.median(h[rng.integers(0, h.size, size=(resamples, h.size))], axis=1)
    ratios = mh / mb
    alpha = (1.0 - confidence) / 2.0
    return float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1.0 - alpha))


def rank_p_value(base: tuple[float, ...], head: tuple[float, ...], alternative: str) -> float:
    """One-sided Mann-Whitney p: 'greater' asks whether candidate samples tend to be larger."""
    res = mannwhitneyu(head, base, alternative=alternative)
    p = float(res.pvalue)
    return p if math.isfinite(p) else 1.0


def classify(base: Row | None, head: Row | None, params: GateParams | None = None) -> Comparison:
    """Classify one config. Either side may be None (MISSING / NEW)."""
    params = params or GateParams()
    row = head or base
    if row is None:
        raise ValueError("classify() needs at least one row")
    made = Comparison(key=row.config_key(), name=row_name(row), base=base, head=head, verdict=Verdict.SAME)
    if head is None:
        made.verdict, made.note = Verdict.MISSING, "in the baseline but not in the candidate"
        return made
    if base is None:
        made.verdict, made.note = Verdict.NEW, "not in the baseline"
        return made
    if base.passed and not head.passed:
        made.verdict = Verdict.NUMERICS
        made.note = f"{base.status} -> {head.status}" + (f": {head.reason}" if head.reason else "")
        return made
    tb, th = timing_of(base), timing_of(head)
    if tb is None or th is None:
        made.verdict = Verdict.UNTIMED
        made.note = f"nothing to compare: baseline {base.status}, candidate {head.status}"
        if base.passed and head.passed:
            made.note = "PASSED without timing on one side"
        return made
    return _classify_timing(made, tb, th, params)


def _classify_timing(made: Comparison, tb: Timing, th: Timing, params: GateParams) -> Comparison:
    ratio = th.median / tb.median
    noise = max(tb.rel_iqr, th.rel_iqr)
    bound = max(params.threshold, params.iqr_factor * noise)
    slower = ratio >= 1.0
    change = ratio - 1.0 if slower else 1.0 / ratio - 1.0  # symmetric magnitude in log space
    made.ratio, made.noise, made.bound = ratio, noise, bound
    made.ratio_ci = ratio_ci(tb.samples, th.samples)
    testable = min(len(tb.samples), len(th.samples)) >= params.min_samples
    if testable:
        made.p_value = rank_p_value(tb.samples, th.samples, "greater" if slower else "less")
    if change <= params.threshold:
        made.verdict = Verdict.SAME
        return made
    if change > bound and made.p_value is not None and made.p_value < params.alpha:
        made.verdict = Verdict.SLOWER if slower else Verdict.FASTER
        made.note = f"{_signed(ratio)} beyond the {bound:.1%} bound"
        return made
    made.verdict = Verdict.AMBIGUOUS
    if change <= bound:
        made.note = (
            f"{_signed(ratio)} within noise: bound {bound:.1%} = {params.iqr_factor:g} x relative IQR {noise:.1%}"
        )
    elif made.p_value is None:
        made.note = f"{_signed(ratio)} but too few samples for the rank test (need {params.min_samples})"
    else:
        made.note = f"{_signed(ratio)} but the rank test disagrees (p={made.p_value:.2g} >= {params.alpha:g})"
    return made


def _signed(ratio: float) -> str:
    return f"{ratio - 1.0:+.1%}"
