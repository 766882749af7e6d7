"""Gate parameters and the parsing of user-given fractions ('5%' or '0.05')."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UsageError

_ACCEPTED = "a percentage like 5% or a fraction like 0.05, between 0 and 100%"


@dataclass(frozen=True)
class GateParams:
    """How strict the gate is. Defaults follow design/measurement.md ("Regression gate").

    threshold: smallest median change that can count (5 %); iqr_factor x relative IQR raises that bar
    for noisy rows; alpha: one-sided Mann-Whitney level; suite_limit: largest allowed geometric mean
    of candidate/baseline ratios over rows PASSED on both sides.
    """

    threshold: float = 0.05
    iqr_factor: float = 3.0
    alpha: float = 0.01
    suite_limit: float = 1.02
    min_samples: int = 3


def parse_threshold(text: str | float, argument: str = "--threshold") -> float:
    """'5%' -> 0.05 and '0.05' -> 0.05. A bare number >= 1 is refused: '5' is ambiguous (5 % or 500 %)."""
    if isinstance(text, (int, float)):
        raw, percent = str(text), False
    else:
        raw = text.strip()
        percent = raw.endswith("%")
        if percent:
            raw = raw[:-1].strip()
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(argument, f"cannot parse {text!r}", _ACCEPTED) from None
    if percent:
        value /= 100.0
    elif value >= 1:
        raise UsageError(argument, f"{text!r} is ambiguous (did you mean {text}%?)", _ACCEPTED)
    if not math.isfinite(value) or not 0 < value < 1:
        raise UsageError(argument, f"{text!r} is out of range", _ACCEPTED)
    return value
