"""Acceptance of the gate on fake runs: no false alarms, planted regressions caught, bad pairings refused."""

from dataclasses import replace

import pytest
from gate_fakes import SLOW_ROW, FakeBackend

from qla_bench.errors import UsageError
from qla_bench.gate import GateParams, Verdict, gate_rows

TRIALS = 100


def test_run_gated_against_itself_passes_every_time():
    for seed in range(TRIALS):
        rows = FakeBackend(noise=0.05, outlier_rate=0.02).run(seed)
        result = gate_rows(rows, rows)
        assert result.exit_code == 0, (seed, result.reasons())
        assert {c.verdict for c in result.comparisons} == {Verdict.SAME}


@pytest.mark.parametrize("noise", [0.01, 0.05])
def test_two_draws_from_one_distribution_pass_every_time(noise):
    backend = FakeBackend(noise=noise, outlier_rate=0.02)
    for seed in range(TRIALS):
        result = gate_rows(backend.run(2 * seed), backend.run(2 * seed + 1))
        assert result.exit_code == 0, (seed, result.reasons())
        assert not result.of(Verdict.SLOWER) and not result.of(Verdict.FASTER)


def test_planted_ten_percent_slowdown_fails_and_names_the_row():
    for seed in range(20):
        base = FakeBackend(noise=0.01).run(2 * seed)
        head = FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(2 * seed + 1)
        result = gate_rows(base, head)
        assert result.exit_code == 1, (seed, result.counts())
        assert [c.name for c in result.of(Verdict.SLOWER)] == [SLOW_ROW]
        assert result.sorted()[0].name == SLOW_ROW  # regressions first
        assert SLOW_ROW in result.reasons()[0]
        assert not result.suite.failed  # one row of eight: the suite alone would not catch it


def test_planted_slowdown_in_baseline_reads_as_faster():
    base = FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(1)
    head = FakeBackend(noise=0.01).run(2)
    result = gate_rows(base, head)
    assert result.exit_code == 0
    assert [c.name for c in result.of(Verdict.FASTER)] == [SLOW_ROW]


def test_three_percent_slowdown_under_five_percent_noise_is_not_a_regression():
    for seed in range(20):
        base = FakeBackend(noise=0.05).run(2 * seed)
        head = FakeBackend(noise=0.05, slowdown={SLOW_ROW: 1.03}).run(2 * seed + 1)
        result = gate_rows(base, head)
        assert result.exit_code == 0, (seed, result.reasons())
        assert not result.of(Verdict.SLOWER)


def test_large_slowdown_under_noise_still_fails():
    base = FakeBackend(noise=0.05).run(1)
    head = FakeBackend(noise=0.05, slowdown={SLOW_ROW: 1.5}).run(2)
    assert [c.name for c in gate_rows(base, head).of(Verdict.SLOWER)] == [SLOW_ROW]


def test_small_slowdown_everywhere_fails_the_suite_check():
    names = [f"{b} fwd h{q}/{v} {lab}" for b, q, v, lab in _names()]
    base = FakeBackend(noise=0.002).run(1)
    head = FakeBackend(noise=0.002, slowdown=dict.fromkeys(names, 1.03)).run(2)
    result = gate_rows(base, head)
    assert not result.of(Verdict.SLOWER)  # 3 % is under the per-row threshold
    assert result.suite.failed and result.suite.geomean == pytest.approx(1.03, abs=0.005)
    assert result.exit_code == 1
    assert "suite geometric mean" in result.reasons()[0]
    assert gate_rows(base, head, GateParams(suite_limit=1.05)).exit_code == 0


def _names():
    from gate_fakes import CONFIGS

    from qla_bench.workload import seqlens_label

    return [(b, q, v, seqlens_label(s)) for b, q, v, s, _ in CONFIGS]


def test_numerics_regression_exits_2():
    base = FakeBackend().run(1)
    head = FakeBackend().run(2)
    head[3] = replace(head[3], status="INCORRECT", reason="rel L2 of o 0.31 > 0.02", samples_ms=[], median_ms=None)
    result = gate_rows(base, head)
    assert result.exit_code == 2
    assert [c.verdict for c in result.sorted()][:1] == [Verdict.NUMERICS]


def test_missing_row_exits_2_and_new_row_is_reported_only():
    base, head = FakeBackend().run(1), FakeBackend().run(2)
    result = gate_rows(base, head[:-1])
    assert result.exit_code == 2
    assert len(result.of(Verdict.MISSING)) == 1
    result = gate_rows(base[:-1], head)
    assert result.exit_code == 0
    assert len(result.of(Verdict.NEW)) == 1


def test_numerics_outranks_slowdown():
    base = FakeBackend(noise=0.01).run(1)
    head = FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.2}).run(2)
    head[0] = replace(head[0], status="ERROR", reason="CUDA error")
    assert gate_rows(base, head).exit_code == 2


def test_different_gpus_is_a_usage_error():
    with pytest.raises(UsageError, match=r"GB200.*H200|H200.*GB200") as exc:
        gate_rows(FakeBackend(gpu="H200").run(1), FakeBackend(gpu="GB200").run(2))
    assert exc.value.exit_code == 3
    assert "same GPU" in str(exc.value)


def test_baseline_rows_of_other_gpus_are_out_of_scope():
    base = FakeBackend(gpu="H200").run(1) + FakeBackend(gpu="GB200").run(1)
    result = gate_rows(base, FakeBackend(gpu="H200").run(2))
    assert result.exit_code == 0
    assert result.ignored_baseline_rows == 8


def test_no_common_rows_is_a_usage_error():
    base, head = FakeBackend().run(1), FakeBackend().run(2)
    head = [replace(r, mode="bwd") for r in head]
    with pytest.raises(UsageError, match=r"no rows in common.*the mode differs"):
        gate_rows(base, head)
    head = [replace(r, h_qk=r.h_qk * 2, h_v=r.h_v * 2) for r in base]
    with pytest.raises(UsageError, match=r"no rows in common.*same sweep"):
        gate_rows(base, head)


def test_empty_inputs_and_different_timers_are_usage_errors():
    rows = FakeBackend().run(1)
    with pytest.raises(UsageError, match="--baseline"):
        gate_rows([], rows)
    with pytest.raises(UsageError, match="--candidate"):
        gate_rows(rows, [])
    with pytest.raises(
        UsageError, match=r"the timer differs \(baseline \['cuda-events'\], candidate \['cuda-graph'\]\)"
    ):
        gate_rows(rows, [replace(r, timer="cuda-graph") for r in rows])
    with pytest.raises(UsageError, match="L2 'warm'"):
        gate_rows(rows, [replace(r, l2="warm") for r in rows])
