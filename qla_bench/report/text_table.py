"""benchmark_results_<GPU>.txt in the layout of FlashQLA's published file, so users read it as theirs.

Header (GPU, models, timer/statistic, library versions), '>>> FORWARD BENCHMARKS' with one latency
column per backend and 'vs X' = X / primary columns, '>>> BACKWARD BENCHMARKS' in FlashQLA's
backward layout. Rows measured by several timers give one block of sections per timer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..rows import Row
from .grid import (
    Grid,
    display_name,
    format_ratio,
    grids,
    latency_cell,
    ratio,
)
from .provenance import (
    env_line,
    merged_env_flags,
    merged_versions,
    models_summary,
    timer_summary,
    versions_line,
)

RULE_WIDTH = 110
SECTION_TITLES = {"fwd": "FORWARD", "bwd": "BACKWARD", "train": "TRAIN (FWD+BWD)"}
FINISHED = "Benchmark Finished."


def _columns(header: Sequence[str], body: Sequence[Sequence[str] | None], spec: Sequence[tuple[str, int]]) -> list[str]:
    """Align cells: spec is (align 'l'|'r', gap) per column; None in body is a blank line."""
    widths = [len(h) for h in header]
    for cells in body:
        if cells is not None:
            widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]

    def fmt(cells: Sequence[str]) -> str:
        parts = []
        for cell, width, (align, gap) in zip(cells, widths, spec, strict=True):
            parts.append(cell.ljust(width + gap) if align == "l" else cell.rjust(width + gap))
        return "".join(parts).rstrip()

    head = fmt(header)
    out = [head, "-" * len(head)]
    out.extend("" if cells is None else fmt(cells) for cells in body)
    return out


def _ratio_headers(grid: Grid) -> list[str]:
    others = grid.backends[1:]
    if grid.mode != "fwd" and len(others) == 1:
        return ["Speedup"]  # FlashQLA's backward table: one other backend, one Speedup column
    return [f"vs {display_name(b)}" for b in others]


def render_section(grid: Grid) -> list[str]:
    """One '>>> ... BENCHMARKS' section: title, column header, rule, lines with blank lines between heads."""
    lat_headers = [f"{display_name(b)} [{grid.mode}]" for b in grid.backends]
    fwd = grid.mode == "fwd"
    if fwd:
        header = ["Model Config", "Seqlens", "h_qk", "h_v"]
        spec = [("l", 4), ("l", 4), ("r", 2), ("r", 3)]
    else:
        header = ["Model Config", "SeqLen", "h_qk", "h_v", "#seq"]
        spec = [("l", 3), ("l", 3), ("r", 2), ("r", 2), ("r", 2)]
    header += lat_headers + _ratio_headers(grid)
    spec += [("r", 4)] * len(lat_headers) + [("r", 4)] * (len(header) - len(spec) - len(lat_headers))

    body: list[list[str] | None] = []
    for i, (head, lines) in enumerate(grid.groups):
        if i:
            body.append(None)
        for line in lines:
            cells = [head.label(grid.mode), line.label, str(head.h_qk), str(head.h_v)]
            if not fwd:
                cells.append(str(len(line.mix)))
            cells += [latency_cell(line.cells.get(b)) for b in grid.backends]
            prim = line.cells.get(grid.primary)
            cells += [format_ratio(ratio(line.cells.get(b), prim)) for b in grid.backends[1:]]
            body.append(cells)
    return [
        f">>> {SECTION_TITLES.get(grid.mode, grid.mode.upper())} BENCHMARKS",
        *_columns(header, body, spec),
    ]


def _default_gpu(rows: Sequence[Row]) -> str:
    names = list(dict.fromkeys(r.gpu for r in rows if r.gpu))
    return ", ".join(names) if names else "unknown"


def render_text_table(
    rows: Iterable[Row],
    *,
    gpu: str | None = None,
    primary: str | None = None,
    models_line: str | None = None,
) -> str:
    """The FlashQLA-style text table of a set of rows (any mix of modes, backends and timers)."""
    rows = list(rows)
    prim, tables = grids(rows, primary)
    timers = list(dict.fromkeys(g.timer for g in tables))
    out = [
        f"GPU: {gpu or _default_gpu(rows)}",
        f"Models: {models_line or models_summary(rows)}",
    ]
    if len(timers) == 1:
        out.append(f"Config: {timer_summary(rows, timers[0])}, Primary={display_name(prim)}")
    else:
        out.append(f"Config: Timers={', '.join(timers)} (one block per timer), Primary={display_name(prim)}")
    out += ["Library Versions:", f"  {versions_line(merged_versions(rows)) or 'unknown'}"]
    env = merged_env_flags(rows)
    if env:
        out.append(f"Env Flags: {env_line(env)}")
    shas = list(dict.fromkeys(r.git_sha for r in rows if r.git_sha))
    if shas:
        out.append(f"Git SHA: {', '.join(shas)}")

    width = max([RULE_WIDTH, *(len(line) for g in tables for line in render_section(g))])
    rule = "=" * width
    out.append(rule)
    for t_index, timer in enumerate(timers):
        if len(timers) > 1:
            if t_index:
                out += ["", rule]
            out += [f"[{timer_summary(rows, timer)}]", rule]
        for s_index, grid in enumerate(g for g in tables if g.timer == timer):
            if s_index:
                out += ["", rule]
            out += ["", *render_section(grid)]
    out += ["", FINISHED, ""]
    return "\n".join(out)


__all__ = ["FINISHED", "render_section", "render_text_table"]
