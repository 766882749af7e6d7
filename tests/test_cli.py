"""The CLI through typer's CliRunner and main(): the README's CPU job, listings, and clean usage errors."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from qla_bench.cli import app, main, register_commands
from qla_bench.rows import iter_rows

register_commands()
runner = CliRunner()


def _main_exit(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code or 0)


def test_fwd_cpu_default_writes_rows_table_and_plot(tmp_path):
    out = tmp_path / "res"
    res = runner.invoke(app, ["fwd", "--out", str(out), "--seqlens", "1x70,33+1", "--reps", "3"])
    assert res.exit_code == 0, res.output
    rows = list(iter_rows(out / "cpu-smoke-fwd.jsonl"))
    assert len(rows) == 6 and all(r.status == "PASSED" and r.timer == "cpu-wall" for r in rows)
    assert (out / "benchmark_results_CPU.txt").is_file()
    assert list(out.rglob("*.png")) and list(out.rglob("*.md"))
    table = (out / "benchmark_results_CPU.txt").read_text()
    assert "FORWARD" in table and "33+1" in table
    again = runner.invoke(app, ["fwd", "--out", str(out), "--seqlens", "1x70,33+1", "--reps", "3"])
    assert again.exit_code == 0 and "resumed" in again.output
    assert re.search(r"wall time \d+\.\d s \(\d+\.\d s since start-up\)", res.output), res.output[-300:]
    assert len(list(iter_rows(out / "cpu-smoke-fwd.jsonl"))) == 6


def test_bwd_and_check_on_cpu(tmp_path):
    res = runner.invoke(
        app, ["bwd", "--out", str(tmp_path), "--heads", "1/2", "--seqlens", "40+1", "--reps", "2", "--no-report"]
    )
    assert res.exit_code == 0, res.output
    rows = list(iter_rows(tmp_path / "cpu-smoke-bwd.jsonl"))
    assert rows[0].status == "PASSED" and set(rows[0].rel_l2) == {"dq", "dk", "dv", "dg", "dbeta", "dh0"}
    res = runner.invoke(app, ["check", "--out", str(tmp_path), "--heads", "1/2", "--seqlens", "1x1"])
    assert res.exit_code == 0, res.output
    assert next(iter(iter_rows(tmp_path / "numerics" / "check-fwd.jsonl"))).timer == ""


def test_check_fails_with_exit_2_on_wrong_numbers(tmp_path, fake_backends):
    code = _main_exit(
        ["check", "--out", str(tmp_path), "--backends", "fake-wrong", "--heads", "1/2", "--seqlens", "1x5"]
    )
    assert code == 2


def test_list_and_env_json():
    res = runner.invoke(app, ["list", "--json"])
    assert res.exit_code == 0
    data = json.loads(res.output)
    names = {b["name"]: b for b in data["backends"]}
    assert {"torch", "fla", "flashqla", "flashinfer", "qla"} <= set(names)
    assert names["torch"]["available"] and not names["qla"]["available"] and names["qla"]["reason"]
    assert any(s["name"] == "qwen35-fwd" and s["points"] == 171 for s in data["sweeps"])
    res = runner.invoke(app, ["env", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["device"]["gpu"] == "CPU"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["fwd", "--backends", "nope"], "unknown backend 'nope'"),
        (["fwd", "--sweep", "nope"], "unknown sweep 'nope'"),
        (["fwd", "--heads", "16/40"], "not a multiple"),
        (["fwd", "--seqlens", "12x"], "--seqlens"),
        (["fwd", "--gpu", "H200"], "no CUDA GPU"),
        (["fwd", "--timers", "graph"], "needs a CUDA GPU"),
        (["fwd", "--timers", "sundial"], "unknown timer"),
        (["bwd", "--mode", "sideways"], "--mode"),
        (["fwd", "--tolerance", "loose"], "unknown profile"),
        (["fwd", "--no-such-option"], "No such option"),
    ],
)
def test_usage_errors_exit_3_with_one_line(argv, needle, capsys):
    assert _main_exit(argv) == 3
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_malformed_sweep_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('mode = "fwd"\nseqlens = ["1x64"]\n[[heads]]\nh_qk = 2\n')
    assert _main_exit(["fwd", "--sweep", str(bad)]) == 3
    assert "h_v" in capsys.readouterr().err


def test_default_backends_leave_the_plain_torch_path_out_on_a_gpu(fake_backends):
    from qla_bench.cli.run_cmds import default_backends

    on_cpu, on_gpu = default_backends("fwd", on_gpu=False), default_backends("fwd", on_gpu=True)
    assert "torch" in on_cpu and "torch" not in on_gpu
    assert "fake-wrong" in on_gpu  # an available library backend stays a default on the GPU
    assert set(on_gpu) == set(on_cpu) - {"torch"}


def test_isolated_runs_pick_default_backends_without_importing_them(fake_backends):
    # a worker imports its own library (and an import failure becomes rows with the reason), so the
    # parent only asks whether each library is installed
    from qla_bench.cli.run_cmds import default_backends

    assert "fake-import-fails" not in default_backends("fwd", import_check=True)
    assert "fake-import-fails" in default_backends("fwd", import_check=False)
    assert "fake-missing" not in default_backends("fwd", import_check=False)  # installed() defaults to available()


def test_isolated_run_records_an_import_failure_on_every_row(tmp_path, fake_backends):
    from qla_bench.runner import RunOptions, run_sweep
    from qla_bench.sweeps import parse_sweep

    sweep = parse_sweep(
        {"mode": "fwd", "k": 32, "v": 16, "seqlens": ["1x70"], "heads": [{"model": "t", "h_qk": 1, "h_v": 1}]}, "t"
    )
    opts = RunOptions(backends=["fake-import-fails"], device="cpu", isolate=True, timeout_s=60, reps=2, rounds=1)
    rows = run_sweep(sweep, opts, tmp_path / "rows.jsonl")
    assert [(r.status, r.reason) for r in rows] == [("UNSUPPORTED", "unavailable: cannot import fake (simulated)")]
