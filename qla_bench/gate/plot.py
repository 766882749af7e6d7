"""Compare plot: candidate/baseline ratio per config with its bootstrap CI, coloured by class.

Written as PNG and SVG with matplotlib's Agg backend (no display needed on CI runners).
"""

from __future__ import annotations

from pathlib import Path

from .classify import Comparison, Verdict
from .compare import CompareResult
from .gate import GateResult

COLOURS = {
    Verdict.SLOWER: "#d62728",
    Verdict.FASTER: "#2ca02c",
    Verdict.SAME: "#7f7f7f",
    Verdict.AMBIGUOUS: "#ff7f0e",
}
MARKERS = ("o", "s", "^", "D", "v", "P")


def plot_paths(path: str | Path) -> list[Path]:
    """'out/gate.png' or 'out/gate' -> [out/gate.png, out/gate.svg]."""
    p = Path(path)
    stem = p.with_suffix("") if p.suffix.lower() in (".png", ".svg") else p
    return [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")]


def plot_series(
    series: list[tuple[str, list[Comparison]]],
    names: list[str],
    path: str | Path,
    title: str,
    threshold: float,
    xlabel: str = "median ratio (candidate / baseline)",
) -> list[Path]:
    """One horizontal line per config (names, top to bottom), one marker per run in `series`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ypos = {name: i for i, name in enumerate(names)}
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.32 * max(len(names), 1)))
    width = 0.6 / max(len(series), 1)
    for s, (_label, comps) in enumerate(series):
        offset = (s - (len(series) - 1) / 2) * width
        for c in comps:
            if c.ratio is None or c.name not in ypos or c.verdict not in COLOURS:
                continue
            lo, hi = c.ratio_ci or (c.ratio, c.ratio)
            err = [[max(c.ratio - lo, 0.0)], [max(hi - c.ratio, 0.0)]]
            ax.errorbar(
                c.ratio, ypos[c.name] + offset, xerr=err, fmt=MARKERS[s % len(MARKERS)],
                color=COLOURS[c.verdict], ecolor=COLOURS[c.verdict], capsize=3, markersize=5,
            )  # fmt: skip
    ax.axvline(1.0, color="black", linewidth=0.8)
    for x in (1.0 + threshold, 1.0 / (1.0 + threshold)):
        ax.axvline(x, color="grey", linestyle="--", linewidth=0.7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlabel(f"{xlabel}, 95% bootstrap CI; dashed: threshold")
    ax.set_title(title, fontsize=10)
    handles = [Line2D([], [], color=col, marker="o", linestyle="", label=v.value) for v, col in COLOURS.items()]
    if len(series) > 1:
        handles += [
            Line2D([], [], color="black", marker=MARKERS[i % len(MARKERS)], linestyle="", label=label)
            for i, (label, _) in enumerate(series)
        ]
    ax.legend(handles=handles, fontsize=7, loc="best")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = plot_paths(path)
    out[0].parent.mkdir(parents=True, exist_ok=True)
    for p in out:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return out


def gate_plot(result: GateResult, path: str | Path) -> list[Path]:
    comps = [c for c in result.sorted() if c.ratio is not None]
    title = f"qla-bench gate: {result.candidate} vs {result.baseline} ({', '.join(result.gpus)})"
    unplotted = len(result.comparisons) - len(comps)
    if unplotted:
        title += f"; {unplotted} row(s) without a ratio not shown"
    return plot_series([(result.candidate, comps)], [c.name for c in comps], path, title, result.params.threshold)


def compare_plot(result: CompareResult, path: str | Path) -> list[Path]:
    names = [result.names[result.keys[i]] for i in result.order()]
    series = list(zip(result.labels[1:], result.pairs, strict=True))
    title = f"qla-bench compare: ratio to {result.labels[0]}"
    xlabel = f"median ratio (run / {result.labels[0]})"
    return plot_series(series, names, path, title, result.params.threshold, xlabel)
