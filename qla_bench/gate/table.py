"""Cell formatting shared by every output, and the rich tables the CLI prints (regressions first)."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from .classify import Comparison, Verdict
from .compare import CompareResult
from .gate import GateResult, SuiteCheck

STYLES = {
    Verdict.NUMERICS: "bold red",
    Verdict.MISSING: "bold magenta",
    Verdict.SLOWER: "red",
    Verdict.AMBIGUOUS: "yellow",
    Verdict.NEW: "cyan",
    Verdict.UNTIMED: "dim",
    Verdict.FASTER: "green",
    Verdict.SAME: "",
}
DASH = "-"
GATE_HEADER = ("Class", "Row", "Baseline ms", "Candidate ms", "Ratio", "95% CI", "p", "Note")


def fmt_ms(value: float | None) -> str:
    return DASH if value is None else f"{value:.3f}"


def fmt_ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.3f}x"


def fmt_ci(ci: tuple[float, float] | None) -> str:
    return DASH if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}"


def fmt_p(p: float | None) -> str:
    return DASH if p is None else f"{p:.2g}"


def gate_cells(c: Comparison) -> tuple[str, ...]:
    """One comparison as the strings of GATE_HEADER."""
    return (
        c.verdict.value,
        c.name,
        fmt_ms(c.base_ms),
        fmt_ms(c.head_ms),
        fmt_ratio(c.ratio),
        fmt_ci(c.ratio_ci),
        fmt_p(c.p_value),
        c.note,
    )


def suite_line(suite: SuiteCheck) -> str:
    if suite.n_rows == 0 or not math.isfinite(suite.geomean):
        return "suite: no rows timed on both sides"
    state = "FAIL" if suite.failed else "ok"
    return (
        f"suite: geometric mean ratio {suite.geomean:.3f} over {suite.n_rows} rows (limit {suite.limit:.3f}): {state}"
    )


def counts_line(counts: dict[str, int]) -> str:
    return " · ".join(f"{n} {name}" for name, n in counts.items() if n) or "no rows"


def gate_table(result: GateResult) -> Table:
    table = Table(
        title=f"qla-bench gate: {result.candidate} vs {result.baseline} ({', '.join(result.gpus)})",
        caption=suite_line(result.suite),
    )
    for i, head in enumerate(GATE_HEADER):
        table.add_column(head, justify="right" if 2 <= i <= 6 else "left", overflow="fold")
    for c in result.sorted():
        table.add_row(*gate_cells(c), style=STYLES[c.verdict])
    return table


def compare_header(result: CompareResult) -> list[str]:
    cols = ["Row", f"{result.labels[0]} ms"]
    for label in result.labels[1:]:
        cols += [f"{label} ms", f"{label} ratio", f"{label} class"]
    return cols


def compare_cells(result: CompareResult, i: int) -> list[str]:
    key = result.keys[i]
    cells = [result.names[key], fmt_ms(result.pairs[0][i].base_ms)]
    for pair in result.pairs:
        c = pair[i]
        in_either = c.base is not None or c.head is not None
        cells += [fmt_ms(c.head_ms), fmt_ratio(c.ratio), c.verdict.value if in_either else DASH]
    return cells


def compare_table(result: CompareResult) -> Table:
    table = Table(
        title=f"qla-bench compare (reference: {result.labels[0]})",
        caption="; ".join(
            f"{label}: {suite_line(s)}" for label, s in zip(result.labels[1:], result.suites, strict=True)
        ),
    )
    for i, head in enumerate(compare_header(result)):
        table.add_column(head, justify="left" if i == 0 or head.endswith(" class") else "right", overflow="fold")
    for i in result.order():
        cells: list[str | Text] = list(compare_cells(result, i))
        cells[0] = Text(str(cells[0]), style=STYLES[result.worst(i)])
        for j, pair in enumerate(result.pairs):
            pos = 4 + 3 * j
            cells[pos] = Text(str(cells[pos]), style=STYLES[pair[i].verdict])
        table.add_row(*cells)
    return table
