"""The forward's one-token rounding study (gdn/rounding_study.py): the orders that chose ws6's and ws10's roundings."""

import statistics

from qla_kernels.gdn.rounding_study import one_token_errors


def test_rounding_orders_rank_as_measured():
    """Mean relative error over 100 draws: ws6 (one rounding of beta W) < ws10 (beta in fp32, U exact) < FLA <
    ws10-agb (beta rounded into stage 1's matrix). The H200 edge check agreed on the last: ws10-agb's T = 1 state
    was 1.16x FLA's on one config (session 12)."""
    runs = [one_token_errors(seed) for seed in range(100)]
    mean = {name: statistics.mean(r[name] for r in runs) for name in runs[0]}
    assert mean["ws6"] < mean["ws10"] < mean["fla"] < mean["ws10-agb"]
    assert mean["ws10"] < 0.95 * mean["fla"]  # emulated 0.86x: the margin issue 4's 1.1x bound needs at T = 1
    assert mean["ws5"] > mean["fla"]  # ws5's 1.19x, which ws6 replaced
