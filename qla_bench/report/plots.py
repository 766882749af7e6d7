"""Plots from rows: latency vs total tokens per head config, and a speedup heatmap.

Uses matplotlib's object API (Figure, no pyplot), so nothing needs a display and no global
backend state is touched; every figure is written as PNG and SVG.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from ..errors import UsageError
from ..rows import Row
from .grid import Grid, backends_of, display_name, format_ratio, grids, latency, ratio, status_cell

FORMATS = ("png", "svg")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "", text.replace("/", "-").replace(" ", "_")) or "none"


def _save(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in FORMATS:
        path = out_dir / f"{stem}.{ext}"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        paths.append(path)
    return paths


def latency_figure(grid: Grid) -> Figure:
    """One subplot per head config; per backend, every mix as a marker and a line through the median
    latency at each total token count (several mixes share a total)."""
    n = len(grid.groups)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (head, lines) in zip(axes, grid.groups, strict=False):
        for i, backend in enumerate(grid.backends):
            points = [(line.total_tokens, ms) for line in lines if (ms := latency(line.cells.get(backend)))]
            if not points:
                continue
            color = f"C{i}"
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, s=12, color=color, alpha=0.6)
            totals = sorted(set(xs))
            medians = [float(np.median([y for x, y in points if x == t])) for t in totals]
            ax.plot(totals, medians, color=color, label=display_name(backend), marker="o", markersize=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{head.label(grid.mode)} (h_qk={head.h_qk}, h_v={head.h_v})", fontsize=9)
        ax.set_xlabel("total tokens")
        ax.set_ylabel("latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(f"GDN {grid.mode} latency ({grid.timer}, median): dots = each mix, line = median per total")
    return fig


def default_baseline(grid: Grid, baseline: str | None = None) -> str | None:
    """The heatmap's reference: the requested backend, else FLA, else the first other backend."""
    others = grid.backends[1:]
    if baseline is not None:
        return baseline if baseline in others else None  # this table lacks it: no heatmap
    if "fla" in others:
        return "fla"
    return others[0] if others else None


def heatmap_figure(grid: Grid, baseline: str) -> Figure:
    """Head config x sequence mix, colour = log2(baseline / primary), annotated with the ratio."""
    heads = [head for head, _ in grid.groups]
    mixes: list[str] = []
    for _, lines in grid.groups:
        mixes.extend(line.label for line in lines if line.label not in mixes)
    values = np.full((len(heads), len(mixes)), np.nan)
    notes = [["-"] * len(mixes) for _ in heads]
    for i, (_, lines) in enumerate(grid.groups):
        for line in lines:
            j = mixes.index(line.label)
            base, prim = line.cells.get(baseline), line.cells.get(grid.primary)
            r = ratio(base, prim)
            if r is not None:
                values[i, j] = math.log2(r)
                notes[i][j] = format_ratio(r)
            else:
                bad = prim if prim is not None and not prim.passed else base
                notes[i][j] = status_cell(bad)
    span = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    span = max(span, 0.1)
    fig = Figure(figsize=(max(6.0, 0.75 * len(mixes) + 3), max(2.5, 0.45 * len(heads) + 1.8)), layout="constrained")
    ax = fig.subplots()
    cmap = colormaps["RdYlGn"].with_extremes(bad="#d0d0d0")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=TwoSlopeNorm(0.0, -span, span), aspect="auto")
    for i in range(len(heads)):
        for j in range(len(mixes)):
            ax.text(j, i, notes[i][j], ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(mixes)), mixes, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(heads)), [f"{h.label(grid.mode)} ({h.h_qk}/{h.h_v})" for h in heads], fontsize=8)
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(f"log2({display_name(baseline)} / {display_name(grid.primary)})")
    prim, base = display_name(grid.primary), display_name(baseline)
    ax.set_title(f"{prim} speedup vs {base} ({grid.mode}, {grid.timer}, median)")
    return fig


def write_plots(
    rows: Sequence[Row], out_dir: str | Path, *, primary: str | None = None, baseline: str | None = None
) -> list[Path]:
    """Write the latency and heatmap figures of every (mode, timer) table; returns the paths."""
    out = Path(out_dir)
    written: list[Path] = []
    rows = list(rows)
    present = backends_of(rows)
    if baseline is not None and baseline not in present:
        raise UsageError("--baseline", f"no rows for backend {baseline!r}", ", ".join(present))
    _, tables = grids(rows, primary)
    for grid in tables:
        tag = f"{grid.mode}_{_slug(grid.timer)}"
        written += _save(latency_figure(grid), out, f"latency_{tag}")
        base = default_baseline(grid, baseline)
        if base is not None:
            written += _save(heatmap_figure(grid, base), out, f"speedup_{tag}_vs_{_slug(base)}")
    return written
