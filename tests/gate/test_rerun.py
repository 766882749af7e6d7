"""--rerun: who can be re-measured here, and how a re-measurement changes the verdict."""

from dataclasses import replace

import pytest
from gate_fakes import SLOW_ROW, FakeBackend

from qla_bench.gate import Verdict, gate_rows, rerun_if_possible, rerun_slower, rerun_unavailable


@pytest.fixture
def suspected():
    base = FakeBackend(noise=0.01).run(1)
    head = FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(2)
    return gate_rows(base, head)


def test_rerun_needs_a_gpu_and_qla_bench_rows():
    rows = FakeBackend().run(1)
    assert rerun_unavailable(rows, device="") == "no CUDA GPU here"
    assert rerun_unavailable(rows, device="NVIDIA H200") is None
    assert "GB200" in rerun_unavailable(rows, device="NVIDIA GB200")
    cpu_rows = [replace(r, timer="cpu-wall") for r in rows]
    assert "not timed by qla-bench on a GPU" in rerun_unavailable(cpu_rows, device="NVIDIA H200")


def test_no_gpu_detected(monkeypatch):
    monkeypatch.setattr("qla_bench.gate.rerun.cuda_device_name", lambda: None)
    assert rerun_unavailable(FakeBackend().run(1)) == "no CUDA GPU here"


def test_rerun_that_does_not_reproduce_clears_the_row(suspected):
    seen = []

    def remeasure(rows):
        seen.extend(r.config_key() for r in rows)
        fresh = {r.config_key(): r for r in FakeBackend(noise=0.01).run(3)}
        return [fresh[k] for k in seen]

    result = rerun_slower(suspected, remeasure)
    assert len(seen) == 1
    assert result.exit_code == 0
    row = next(c for c in result.comparisons if c.name == SLOW_ROW)
    assert row.verdict is Verdict.SAME and row.note.startswith("rerun (first 1.10")
    assert result.notes == ["re-measured 1 suspected row(s) once before deciding"]


def test_rerun_that_reproduces_keeps_the_failure(suspected):
    def remeasure(rows):
        fresh = {r.config_key(): r for r in FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.12}).run(3)}
        return [fresh[r.config_key()] for r in rows]

    result = rerun_slower(suspected, remeasure)
    assert result.exit_code == 1
    assert [c.name for c in result.of(Verdict.SLOWER)] == [SLOW_ROW]


def test_rerun_is_not_called_without_suspects():
    rows = FakeBackend().run(1)
    result = gate_rows(rows, rows)

    def boom(rows):
        raise AssertionError("must not re-measure")

    assert rerun_slower(result, boom) is result


def test_rerun_if_possible_hints_or_remeasures(suspected):
    result, hint = rerun_if_possible(suspected, device="")
    assert result.exit_code == 1 and hint == "--rerun skipped (no CUDA GPU here); gating on the given data"

    def remeasure(rows):
        fresh = {r.config_key(): r for r in FakeBackend(noise=0.01).run(3)}
        return [fresh[r.config_key()] for r in rows]

    result, hint = rerun_if_possible(suspected, remeasure, device="NVIDIA H200")
    assert hint is None and result.exit_code == 0
