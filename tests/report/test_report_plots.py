"""Plots are written as PNG and SVG, one latency figure and one heatmap per (mode, timer)."""

from __future__ import annotations

import numpy as np
import pytest

from qla_bench.report.grid import grids
from qla_bench.report.plots import heatmap_figure, latency_figure, write_plots


def test_plots_written_per_mode_and_format(rows, tmp_path):
    paths = write_plots(rows, tmp_path)
    names = sorted(p.name for p in paths)
    stems = ["latency_bwd_cuda-graph", "latency_fwd_cuda-graph", "speedup_bwd_cuda-graph_vs_fla"]
    stems.append("speedup_fwd_cuda-graph_vs_fla")
    assert names == sorted(f"{s}.{ext}" for s in stems for ext in ("png", "svg"))
    for p in paths:
        assert p.parent == tmp_path and p.stat().st_size > 1000
        head = p.read_bytes()[:400]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else b"<svg" in head


def test_baseline_choice_and_single_backend(rows, tmp_path):
    names = {p.name for p in write_plots(rows, tmp_path / "a", baseline="flashqla")}
    assert "speedup_fwd_cuda-graph_vs_flashqla.png" in names
    assert not any(n.startswith("speedup_bwd") for n in names)  # primary of bwd is flashqla itself
    only = [r for r in rows if r.backend == "qla"]
    assert {p.name for p in write_plots(only, tmp_path / "b")} == {
        "latency_fwd_cuda-graph.png",
        "latency_fwd_cuda-graph.svg",
    }


def test_heatmap_values_are_log_ratios(rows):
    _, tables = grids(rows)
    fwd = next(g for g in tables if g.mode == "fwd")
    fig = heatmap_figure(fwd, "fla")
    image = fig.axes[0].images[0].get_array()
    expected = np.full(image.shape, np.nan)
    for i, (_, lines) in enumerate(fwd.groups):
        for j, line in enumerate(lines):
            fla, qla = line.cells["fla"], line.cells["qla"]
            if fla.passed:
                expected[i, j] = np.log2(fla.median_ms / qla.median_ms)
    assert np.ma.getmaskarray(image).tolist() == np.isnan(expected).tolist()
    assert np.ma.filled(image, np.nan)[~np.isnan(expected)] == pytest.approx(expected[~np.isnan(expected)])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "UNSUPP" in texts and f"{3.0:.2f}x" in texts


def test_latency_figure_has_one_subplot_per_head_config(rows):
    _, tables = grids(rows)
    fwd = next(g for g in tables if g.mode == "fwd")
    fig = latency_figure(fwd)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == len(fwd.groups) == 2
    assert {t.get_text() for t in visible[0].get_legend().get_texts()} == {"qla", "flash_qla", "FLA"}
    assert visible[0].get_xscale() == "log" and visible[0].get_yscale() == "log"
