"""Per-kernel profiles (qla_bench/kernel_profile.py and `qla-bench kernels`) without a GPU: the arithmetic,
the flush subtraction through a stand-in profiler, the file names and the CLI's refusals. The profiler itself
runs in tests/gpu/test_harness_gpu.py (skipped here: no CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rich.console import Console

from qla_bench.cli import main, register_commands
from qla_bench.cli.kernels_cmd import kernel_table, profile_file
from qla_bench.kernel_profile import per_call, profile_calls, run_in_profiler_range, short_name, subtract, totals
from qla_bench.session import BackendSession
from qla_bench.workload import HeadConfig, Workload

register_commands()


def test_totals_per_call_and_shares():
    acts = [("kkt", 10.0), ("fused", 30.0), ("kkt", 12.0), ("fused", 28.0), ("memset", 0.5)]
    rows = per_call(totals(acts), calls=2)
    assert [r.name for r in rows] == ["fused", "kkt", "memset"]  # longest first
    fused = rows[0]
    assert fused.launches_per_call == 1 and fused.us_per_call == 29.0
    assert rows[1].us_per_call == 11.0 and rows[2].launches_per_call == 0.5
    assert sum(r.share for r in rows) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="calls must be >= 1"):
        per_call(totals(acts), 0)


def test_subtract_takes_off_launches_and_time_and_drops_emptied_names():
    total = {"fill<int>": (5, 50.0), "kkt": (5, 100.0), "fill<float>": (2, 4.0)}
    left = subtract(total, {"fill<int>": (5, 49.0)})
    assert "fill<int>" not in left and left["kkt"] == (5, 100.0) and left["fill<float>"] == (2, 4.0)
    # the backend's own launch of a kernel named like the flush survives, with its time less the flush's
    left = subtract({"fill<int>": (6, 60.0)}, {"fill<int>": (5, 50.0)})
    assert left == {"fill<int>": (1, 10.0)}


def test_short_name_keeps_the_head_of_long_template_names():
    long = "void flat::kernel<" + "cute::tuple<int, int>, " * 40 + ">(Params)"
    s = short_name(long)
    assert len(s) == 120 and s.startswith("void flat::kernel<") and s.endswith("...")
    assert short_name("  kkt_solve_v3_kernel \n") == "kkt_solve_v3_kernel"


class _StandInProfiler:
    """Records what it is asked to profile and returns made-up activities: the backend's two kernels per call,
    and the flush's fill kernel before each call when a flush runs between calls."""

    def __init__(self):
        self.calls_seen = []

    def __call__(self, fn, calls, between=None):
        self.calls_seen.append((fn, calls, between))
        acts = []
        for _ in range(calls):
            if between is not None:
                between()
                acts.append(("fill<int>", 20.0))
            fn()
            if fn is not _flush:
                acts += [("kkt", 5.0), ("fused", 15.0)]
            else:
                acts.append(("fill<int>", 20.0))
        return acts


def _flush():
    pass


def test_profile_calls_warms_up_then_removes_the_flush():
    ran = []
    prof = _StandInProfiler()
    rows = profile_calls(lambda: ran.append(1), calls=4, flush=_flush, warmup=3, collect=prof)
    assert len(ran) == 3 + 4  # three warm-up calls outside the profile, then the profiled ones
    assert [c[1] for c in prof.calls_seen] == [4, 4] and prof.calls_seen[1][0] is _flush  # the flush alone
    assert {r.name: (r.launches_per_call, r.us_per_call) for r in rows} == {"fused": (1, 15.0), "kkt": (1, 5.0)}
    rows = profile_calls(lambda: None, calls=2, flush=None, warmup=0, collect=_StandInProfiler())
    assert {r.name for r in rows} == {"kkt", "fused"}


def test_profile_file_names_and_table():
    wl = Workload(HeadConfig(16, 64), (4096, 28672))
    assert profile_file(Path("x"), "fwd", "qla", wl) == Path("x") / "fwd-qla-h16x64-4096+28672.json"
    res = {
        "qla": {"status": "PASSED", "reason": "", "kernels": [{"name": "fused", "launches_per_call": 1.0,
                                                               "us_per_call": 700.0, "share": 0.55}],
                "gpu_us_per_call": 1270.0},
        "flashinfer": {"status": "UNSUPPORTED", "reason": "unavailable: not installed", "kernels": []},
    }  # fmt: skip
    console = Console(record=True, width=160)
    console.print(kernel_table("fwd h16/64 4096+28672", res))
    text = console.export_text()
    assert "fused" in text and "700.0" in text and "55.0 %" in text and "1270.0" in text
    assert "UNSUPPORTED" in text and "not installed" in text


def _main_exit(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code or 0), capsys.readouterr().err


def test_cli_refuses_bad_options_and_a_cpu_only_machine(capsys):
    base = ["kernels", "--heads", "16/64", "--seqlens", "8192x4"]
    code, err = _main_exit([*base, "--mode", "decode"], capsys)
    assert code == 3 and "--mode" in err and "fwd, bwd, train" in err
    code, err = _main_exit([*base, "--calls", "0"], capsys)
    assert code == 3 and "--calls" in err
    code, err = _main_exit(base, capsys)
    assert code == 3 and "need a CUDA GPU" in err


def test_session_kernels_needs_a_passing_setup_and_cuda():
    session = BackendSession("torch", "cpu")
    with pytest.raises(RuntimeError, match="before a passing setup"):
        session.kernels(2)
    wl = Workload(HeadConfig(1, 2), (70,))
    assert session.setup(wl, "fwd", wl.seed()).status == "PASSED"
    with pytest.raises(RuntimeError, match="CUDA device"):
        session.kernels(2)


def test_profiler_range_runs_warm_calls_outside_and_flushes_inside():
    events = []
    run_in_profiler_range(lambda: events.append("call"), calls=2, flush=lambda: events.append("flush"), warmup=2,
                          start=lambda: events.append("start"), stop=lambda: events.append("stop"))  # fmt: skip
    assert events == ["call", "call", "start", "flush", "call", "flush", "call", "stop"]
    with pytest.raises(ValueError, match="calls must be >= 1"):
        run_in_profiler_range(lambda: None, calls=0, start=lambda: None, stop=lambda: None)


def test_cli_refuses_an_unknown_profiler(capsys):
    code, err = _main_exit(["kernels", "--heads", "16/64", "--seqlens", "8192x4", "--profiler", "nsys"], capsys)
    assert code == 3 and "--profiler" in err and "torch, ncu-range" in err


def test_session_kernels_checks_the_profiler_name(monkeypatch):
    session = BackendSession("torch", "cpu")
    wl = Workload(HeadConfig(1, 2), (70,))
    assert session.setup(wl, "fwd", wl.seed()).status == "PASSED"
    monkeypatch.setattr(session, "device", torch.device("cuda"))  # past the device guard, before any CUDA call
    with pytest.raises(ValueError, match="profiler must be one of torch, ncu-range"):
        session.kernels(2, profiler="nsys")
