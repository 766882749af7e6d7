"""Write every human output of a set of rows: the FlashQLA-style text table, report.md and plots.

This is the one call `qla-bench fwd` makes at the end of a sweep and `qla-bench report` makes on
committed results, so both produce the same files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ..errors import UsageError
from ..rows import Row
from .anchors import AnchorTable, default_anchors_path, load_anchors
from .grid import backends_of, choose_primary
from .markdown import render_markdown
from .plots import write_plots
from .text_table import render_text_table


def gpu_file_tag(gpu: str) -> str:
    """'H200' -> 'H200', 'NVIDIA H200' -> 'H200' (the profile name users see in file names)."""
    name = gpu.strip().removeprefix("NVIDIA").strip() or "unknown"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def resolve_anchors(
    rows: Iterable[Row], gpu: str, anchors_path: str | Path | None, find_anchors: bool = True
) -> AnchorTable | None:
    """The explicit file, else ../shared/anchors/flashqla_benchmark_results_<GPU>.txt if present."""
    if anchors_path is not None:
        return load_anchors(anchors_path)
    if not find_anchors:
        return None
    for name in dict.fromkeys([gpu, *(r.gpu for r in rows if r.gpu)]):
        path = default_anchors_path(name)
        if path is not None:
            return load_anchors(path)
    return None


def write_reports(
    rows: Iterable[Row],
    out_dir: str | Path,
    *,
    gpu: str,
    anchors_path: str | Path | None = None,
    primary: str | None = None,
    baseline: str | None = None,
    find_anchors: bool = True,
) -> list[Path]:
    """Write benchmark_results_<GPU>.txt, report.md and the plots into out_dir; return their paths.

    anchors_path=None looks for FlashQLA's published file of this GPU next to the repo
    (find_anchors=False skips the comparison).
    """
    rows = list(rows)
    if not rows:
        raise UsageError("results", "no rows to report")
    present = backends_of(rows)
    choose_primary(present, primary)  # bad names fail before any file is written
    if baseline is not None and baseline not in present:
        raise UsageError("--baseline", f"no rows for backend {baseline!r}", ", ".join(present))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    anchors = resolve_anchors(rows, gpu, anchors_path, find_anchors)
    header_gpu = ", ".join(dict.fromkeys(r.gpu for r in rows if r.gpu)) or gpu

    table = out / f"benchmark_results_{gpu_file_tag(gpu)}.txt"
    table.write_text(render_text_table(rows, gpu=header_gpu, primary=primary), encoding="utf-8")
    report = out / "report.md"
    report.write_text(render_markdown(rows, anchors=anchors, primary=primary), encoding="utf-8")
    return [table, report, *write_plots(rows, out, primary=primary, baseline=baseline)]
