"""--threshold parsing: '5%' and '0.05' mean the same; anything ambiguous or out of range is refused."""

import pytest

from qla_bench.errors import UsageError
from qla_bench.gate import parse_threshold


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.05", 0.05), (" 2.5 % ", 0.025), ("10%", 0.10)])
def test_accepts_percent_and_fraction(text, value):
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "", "5", "-1%", "0", "0%", "100%", "150%", "nan", "inf%", "5%%"])
def test_refuses_bad_thresholds(text):
    with pytest.raises(UsageError) as exc:
        parse_threshold(text)
    assert exc.value.exit_code == 3
    assert "--threshold" in str(exc.value)


def test_bare_five_suggests_percent():
    with pytest.raises(UsageError, match="did you mean 5%"):
        parse_threshold("5")
