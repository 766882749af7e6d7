"""Noise arithmetic, and the noise command running real CPU sweeps in separate processes."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from qla_bench.cli import app, register_commands
from qla_bench.noise import NoisePoint, noise_points, render_noise_markdown, suggested_threshold
from qla_bench.rows import Row


def _row(backend, label, med, status="PASSED"):
    return Row(
        backend=backend,
        mode="fwd",
        h_qk=1,
        h_v=2,
        k=128,
        v=128,
        seqlens=[int(label)],
        label=label,
        timer="cuda-events",
        status=status,
        median_ms=med,
    )


def test_spread_and_threshold():
    p = NoisePoint("a", "t", "m", "l", (1.0, 1.1, 0.9))
    assert p.spread == pytest.approx(0.2)
    quiet = [NoisePoint("a", "t", "m", str(i), (1.0, 1.01)) for i in range(10)]
    assert suggested_threshold(quiet) == 0.05
    loud = [NoisePoint("a", "t", "m", str(i), (1.0, 1.06)) for i in range(10)]
    assert suggested_threshold(loud) == pytest.approx(2 * 0.06 / 1.03)


def test_noise_points_match_across_runs():
    runs = [
        [_row("x", "64", 1.0), _row("x", "128", 2.0), _row("y", "64", 1.0, "INCORRECT")],
        [_row("x", "64", 1.2), _row("x", "128", 2.2)],
    ]
    pts = noise_points(runs)
    assert [(p.label, p.medians_ms) for p in pts] == [("128", (2.0, 2.2)), ("64", (1.0, 1.2))]
    md = render_noise_markdown(pts, 2, "CPU")
    assert "| cuda-events | 2 |" in md
    with pytest.raises(ValueError):
        noise_points(runs[:1])


def test_noise_command_on_cpu(tmp_path):
    register_commands()
    res = CliRunner().invoke(
        app,
        [
            "noise",
            "--sweep",
            "cpu-smoke",
            "--heads",
            "1/2",
            "--seqlens",
            "1x64",
            "--processes",
            "2",
            "--reps",
            "3",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "noise.md").is_file() and (tmp_path / "run2").is_dir()
    assert "cpu-wall" in (tmp_path / "noise.md").read_text()
