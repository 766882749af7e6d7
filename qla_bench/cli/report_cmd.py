"""`qla-bench report RESULTS...`: rebuild the text table, report.md and plots from result rows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer

from ..errors import QlaBenchError, UsageError
from .app import app, console, err_console, fail


def _default_out(results: list[Path]) -> Path:
    """Next to the results: the folder given, or the folder of the first file."""
    first = results[0]
    return first if first.is_dir() else first.parent


def _default_gpu(rows) -> str:
    names = Counter(r.gpu for r in rows if r.gpu)
    return names.most_common(1)[0][0] if names else "unknown"


@app.command("report")
def report(
    results: list[Path] = typer.Argument(..., help="Result .jsonl files or folders holding them."),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: the results folder)."),
    primary: str | None = typer.Option(
        None, "--primary", help="Backend the ratios divide by (default: qla, else flashqla, else the first)."
    ),
    baseline: str | None = typer.Option(
        None, "--baseline", help="Backend the speedup heatmap compares the primary with (default: fla)."
    ),
    anchors: Path | None = typer.Option(
        None,
        "--anchors",
        help="FlashQLA's published table to compare ratios with "
        "(default: ../shared/anchors/flashqla_benchmark_results_<GPU>.txt if present).",
    ),
    no_anchors: bool = typer.Option(False, "--no-anchors", help="Skip the comparison with published ratios."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU name for file names (default: from the rows)."),
    export: list[Path] = typer.Option(
        [], "--export", help="Also write the rows flattened to a .csv or .parquet file (repeatable)."
    ),
) -> None:
    """Write benchmark_results_<GPU>.txt, report.md and plots (PNG, SVG) from result rows."""
    from ..report.writer import gpu_file_tag, write_reports
    from ..rows import export_rows, load_rows

    try:
        rows = load_rows(results)
        if not rows:
            raise UsageError("results", f"no rows in {', '.join(map(str, results))}")
        if anchors is not None and no_anchors:
            raise UsageError("--anchors", "cannot be combined with --no-anchors")
        name = gpu or gpu_file_tag(_default_gpu(rows))
        paths = write_reports(
            rows,
            out or _default_out(results),
            gpu=name,
            anchors_path=anchors,
            primary=primary,
            baseline=baseline,
            find_anchors=not no_anchors,
        )
        paths += [export_rows(rows, target) for target in export]
    except QlaBenchError as exc:
        raise fail(str(exc), exc.exit_code) from None
    backends = Counter(r.backend for r in rows)
    err_console.print(
        f"{len(rows)} rows (" + ", ".join(f"{b} {n}" for b, n in backends.items()) + f"), gpu {name}",
        highlight=False,
    )
    for path in paths:
        console.print(str(path), highlight=False, soft_wrap=True)
