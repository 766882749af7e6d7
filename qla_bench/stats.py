"""Pure statistics on latency samples (no torch): summaries, bootstrap CIs, rank tests, geomeans."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    minimum: float
    mean: float
    q1: float
    q3: float
    ci_low: float
    ci_high: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_iqr(self) -> float:
        """IQR over the median: the noise scale the gate compares a ratio against."""
        return self.iqr / self.median if self.median > 0 else math.inf


def bootstrap_median_ci(
    samples: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the median (seeded, so reports are reproducible)."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("no samples")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    meds = np.median(x[idx], axis=1)
    alpha = (1.0 - confidence) / 2.0
    return float(np.quantile(meds, alpha)), float(np.quantile(meds, 1.0 - alpha))


def summarize(samples: Sequence[float]) -> Summary:
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("no samples to summarize")
    lo, hi = bootstrap_median_ci(x)
    q1, med, q3 = np.quantile(x, [0.25, 0.5, 0.75])
    return Summary(
        n=int(x.size),
        median=float(med),
        minimum=float(x.min()),
        mean=float(x.mean()),
        q1=float(q1),
        q3=float(q3),
        ci_low=lo,
        ci_high=hi,
    )


def geomean(values: Sequence[float]) -> float:
    v = [float(x) for x in values if x is not None and x > 0 and math.isfinite(x)]
    if not v:
        return math.nan
    return float(math.exp(sum(math.log(x) for x in v) / len(v)))
