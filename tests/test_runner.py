"""The runner: numerics gate timing, failures become rows, resume skips, isolation survives crashes."""

from __future__ import annotations

import statistics
import time

import pytest

from qla_bench.rows import Row, iter_rows
from qla_bench.runner import RunOptions, points_from_rows, remeasure, run_sweep
from qla_bench.sweeps import Sweep, parse_sweep

TINY = {"mode": "fwd", "k": 32, "v": 16, "seqlens": ["1x70", "1+33"], "heads": [{"model": "t", "h_qk": 1, "h_v": 2}]}


def _sweep(**over) -> Sweep:
    return parse_sweep({**TINY, **over}, "tiny")


def _opts(backends, **kw) -> RunOptions:
    return RunOptions(
        mode="fwd", backends=backends, timers=("cpu-wall",), reps=4, rounds=2, device="cpu", sweep="tiny", **kw
    )


def test_statuses_and_only_passing_rows_are_timed(tmp_path, fake_backends):
    out = tmp_path / "rows.jsonl"
    rows = run_sweep(
        _sweep(), _opts(["torch", "fake-wrong", "fake-nan", "fake-raise", "fake-oom", "fake-missing"]), out
    )
    by = {(r.backend, r.label): r for r in rows}
    assert len(rows) == 12 and [r.to_dict() for r in iter_rows(out)] == [r.to_dict() for r in rows]
    for label in ("1x70", "1+33"):
        ok = by[("torch", label)]
        assert ok.status == "PASSED" and len(ok.samples_ms) == 4 and ok.median_ms > 0 and ok.first_call_ms > 0
        assert ok.rel_l2["o"] < 0.02 and ok.versions.get("torch") and ok.timer == "cpu-wall"
        assert by[("fake-wrong", label)].status == "INCORRECT"
        assert by[("fake-nan", label)].status == "INCORRECT" and by[("fake-nan", label)].nonfinite["o"] == 1
        assert by[("fake-raise", label)].status == "ERROR" and "illegal memory" in by[("fake-raise", label)].reason
        assert by[("fake-oom", label)].status == "OOM"
        assert by[("fake-missing", label)].status == "UNSUPPORTED"
        for b in ("fake-wrong", "fake-nan", "fake-raise", "fake-oom", "fake-missing"):
            assert by[(b, label)].median_ms is None and by[(b, label)].samples_ms == []


@pytest.mark.parametrize("isolate", [False, True])
def test_rows_record_the_host_time_of_the_call(tmp_path, isolate):
    """host_median_ms is the median of the host's own time per timed call (through a worker too); for the
    cpu-wall timer that is the sample itself; a row written before the field existed loads with None."""
    rows = run_sweep(_sweep(seqlens=["1x70"]), _opts(["torch"], isolate=isolate, timeout_s=60), tmp_path / "r.jsonl")
    (row,) = rows
    assert row.status == "PASSED" and row.host_median_ms is not None
    assert row.host_median_ms == pytest.approx(statistics.median(row.samples_ms), rel=1e-4, abs=1e-6)
    (back,) = iter_rows(tmp_path / "r.jsonl")
    assert back.host_median_ms == row.host_median_ms
    old = {k: v for k, v in row.to_dict().items() if k != "host_median_ms"}
    assert Row.from_dict(old).host_median_ms is None


def test_impossible_points_become_unsupported_rows(tmp_path):
    s = parse_sweep({**TINY, "heads": [{"model": "m", "h_qk": 3, "h_v": 6, "tp": [2]}]}, "tiny")
    rows = run_sweep(s, _opts(["torch"]), None)
    assert {r.status for r in rows} == {"UNSUPPORTED"} and "TP2" in rows[0].reason


def test_resume_skips_written_rows(tmp_path):
    out = tmp_path / "rows.jsonl"
    first = run_sweep(_sweep(seqlens=["1x70"]), _opts(["torch"]), out)
    assert len(first) == 1
    second = run_sweep(_sweep(), _opts(["torch"]), out)  # one old point, one new
    assert [r.label for r in second] == ["1+33"]
    assert len(list(iter_rows(out))) == 2
    with out.open("a") as fh:  # a torn line from a crash must not stop a resume
        fh.write('{"backend": "torch", "mo')
    assert run_sweep(_sweep(), _opts(["torch"]), out) == []


def test_interleaved_rounds(tmp_path, fake_backends, monkeypatch):
    from qla_bench import session as session_mod

    calls = []
    real = session_mod.BackendSession.sample

    def spy(self, timer, reps):
        calls.append(self.backend.name)
        return real(self, timer, reps)

    monkeypatch.setattr(session_mod.BackendSession, "sample", spy)
    opts = _opts(["torch", "fake-wrong"])
    opts.rounds = 4
    run_sweep(_sweep(seqlens=["1x70"]), opts, None)
    assert calls == ["torch"] * 4  # the INCORRECT backend is never timed
    calls.clear()
    from qla_bench.backends import register
    from qla_bench.backends.torch_chunked import TorchChunkedBackend

    @register
    class Twin(TorchChunkedBackend):
        name = "torch-twin"

    opts = _opts(["torch", "torch-twin"])
    opts.rounds = 4
    run_sweep(_sweep(seqlens=["1x70"]), opts, None)
    assert calls == ["torch", "torch-twin", "torch-twin", "torch", "torch", "torch-twin", "torch-twin", "torch"]


def test_remeasure_rebuilds_points(tmp_path):
    rows = run_sweep(_sweep(), _opts(["torch"]), None)
    pts = points_from_rows(rows)
    assert [p.seqlens for p in pts] == [(70,), (1, 33)]
    again = remeasure(rows[:1], reps=3)
    assert len(again) == 1 and again[0].config_key() == rows[0].config_key() and len(again[0].samples_ms) == 3


def test_isolation_survives_segfault_hang_and_exception(tmp_path, fake_backends):
    # 20 s per step: a fresh worker importing torch on a loaded two-core CI machine took over 8 s (session 16's CI
    # read fake-raise's or fake-segv's first step as TIMEOUT)
    opts = _opts(["fake-segv", "fake-hang", "torch", "fake-raise"], isolate=True, timeout_s=20)
    t0 = time.time()
    rows = run_sweep(_sweep(), opts, tmp_path / "rows.jsonl")
    by = {(r.backend, r.label): r for r in rows}
    for label in ("1x70", "1+33"):  # the second config needs fresh workers for the dead ones
        assert by[("fake-segv", label)].status == "ERROR" and "SIGSEGV" in by[("fake-segv", label)].reason
        assert by[("fake-hang", label)].status == "TIMEOUT"
        assert by[("torch", label)].status == "PASSED" and by[("torch", label)].median_ms > 0
        assert by[("fake-raise", label)].status == "ERROR"
    assert time.time() - t0 < 170


def test_isolated_workers_load_their_libraries_in_parallel(tmp_path, fake_backends, monkeypatch):
    # each fake "import" takes 4 s; started one after another they would begin >= 4 s apart
    monkeypatch.setenv("QLA_TEST_STAMP_DIR", str(tmp_path))
    opts = _opts(["fake-slow-a", "fake-slow-b"], isolate=True, timeout_s=60)
    rows = run_sweep(_sweep(seqlens=["1x70"]), opts, tmp_path / "rows.jsonl")
    assert {r.status for r in rows} == {"PASSED"}
    a, b = (float((tmp_path / n).read_text()) for n in ("fake-slow-a", "fake-slow-b"))
    assert abs(a - b) < 3.0


def test_isolated_setups_overlap_except_for_backends_that_autotune(tmp_path, fake_backends, monkeypatch):
    # each fake setup takes 2 s: a and b run theirs at once, the tuner alone before them
    monkeypatch.setenv("QLA_TEST_STAMP_DIR", str(tmp_path))
    opts = _opts(["fake-slow-setup-a", "fake-slow-setup-tuner", "fake-slow-setup-b"], isolate=True, timeout_s=60)
    rows = run_sweep(_sweep(seqlens=["1x70"]), opts, tmp_path / "rows.jsonl")
    assert [r.backend for r in rows] == opts.backends and {r.status for r in rows} == {"PASSED"}
    a, tuner, b = (
        [float(x) for x in (tmp_path / f"{n}.setup").read_text().split()]
        for n in ("fake-slow-setup-a", "fake-slow-setup-tuner", "fake-slow-setup-b")
    )
    assert abs(a[0] - b[0]) < 1.5  # begun together, not one after the other (>= 2 s apart)
    assert tuner[1] <= min(a[0], b[0])  # the autotuning backend had the device to itself


def test_worker_dying_while_warming_up_becomes_error_rows(tmp_path, fake_backends):
    opts = _opts(["fake-dies-on-import", "torch"], isolate=True, timeout_s=30)
    rows = run_sweep(_sweep(), opts, tmp_path / "rows.jsonl")
    by = {(r.backend, r.label): r for r in rows}
    for label in ("1x70", "1+33"):
        dead = by[("fake-dies-on-import", label)]
        assert dead.status == "ERROR" and "exit code 3" in dead.reason
        assert by[("torch", label)].status == "PASSED"


def test_results_folder_skips_side_folders(tmp_path):
    from qla_bench.rows import load_rows

    run_sweep(_sweep(seqlens=["1x70"]), _opts(["torch"]), tmp_path / "sweep.jsonl")
    for side in ("numerics", "baseline", "noise"):
        run_sweep(_sweep(seqlens=["1+33"]), _opts(["torch"]), tmp_path / side / "x.jsonl")
    assert [r.label for r in load_rows([tmp_path])] == ["1x70"]
    assert [r.label for r in load_rows([tmp_path / "numerics"])] == ["1+33"]


def test_check_seeds_rows_hold_the_worst_error_over_the_seeds(tmp_path):
    one = run_sweep(_sweep(seqlens=["1x70"]), _opts(["torch"]), None)[0]
    opts = _opts(["torch"])
    opts.check_seeds = 3
    three = run_sweep(_sweep(seqlens=["1x70"]), opts, None)[0]
    assert one.check_seeds == 1 and three.check_seeds == 3 and three.status == "PASSED"
    assert three.first_call_ms is not None  # seed 0's first call, not None from a later seed
    for name, err in one.rel_l2.items():  # seed 0 is among the three, so the worst is at least its error
        assert three.rel_l2[name] >= err
    assert set(three.worst_seed) == set(three.rel_l2)  # each output names the input seed behind its error
    assert all(three.seed <= s < three.seed + 3 for s in three.worst_seed.values())
    assert one.worst_seed == {name: one.seed for name in one.rel_l2}


def test_worst_of_seeds_merges_errors_and_keeps_the_first_failure():
    from qla_bench.session import SetupResult, worst_of_seeds

    a = SetupResult("PASSED", rel_l2={"o": 1e-3, "dg": 5e-3}, max_abs={"o": 0.1}, nonfinite={"o": 0}, first_call_ms=9.0)
    b = SetupResult("PASSED", rel_l2={"o": 2e-3, "dg": 4e-3}, max_abs={"o": 0.05}, nonfinite={"o": 0})
    c = SetupResult("INCORRECT", reason="o rel-L2 0.5", rel_l2={"o": 0.5}, nonfinite={"o": 2})
    m = worst_of_seeds([a, b])
    assert m.status == "PASSED" and m.rel_l2 == {"o": 2e-3, "dg": 5e-3} and m.max_abs == {"o": 0.1}
    assert m.first_call_ms == 9.0
    assert m.worst_seed == {"o": 1, "dg": 0}  # which input each output's reported error came from
    assert worst_of_seeds([a, b], seeds=[70, 71]).worst_seed == {"o": 71, "dg": 70}
    with pytest.raises(ValueError, match="one seed per result"):
        worst_of_seeds([a, b], seeds=[70])
    nan = SetupResult("INCORRECT", rel_l2={"o": float("nan")})
    for order in ([a, nan, b], [nan, b]):  # a NaN error is never hidden by a later finite one
        m = worst_of_seeds(order)
        assert m.rel_l2["o"] != m.rel_l2["o"] and m.worst_seed["o"] == order.index(nan)
    m = worst_of_seeds([a, c])
    assert m.status == "INCORRECT" and m.reason == "o rel-L2 0.5" and m.nonfinite == {"o": 2}
