"""Markdown reports (PR comments, $GITHUB_STEP_SUMMARY): verdict first, rows needing attention next."""

from __future__ import annotations

from .classify import Verdict
from .compare import CompareResult
from .gate import GateResult
from .table import GATE_HEADER, compare_cells, compare_header, counts_line, gate_cells, suite_line

ATTENTION = (Verdict.NUMERICS, Verdict.MISSING, Verdict.SLOWER, Verdict.AMBIGUOUS)


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def md_table(
    header: list[str] | tuple[str, ...], rows: list[list[str]] | list[tuple[str, ...]], right: set[int]
) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def gate_markdown(result: GateResult) -> str:
    p = result.params
    out = [
        f"## qla-bench gate: {result.status}",
        "",
        f"Candidate `{result.candidate}` vs baseline `{result.baseline}` on {', '.join(result.gpus)}. "
        f"A row is SLOWER when its median ratio exceeds max({p.threshold:.1%}, "
        f"{p.iqr_factor:g} x relative IQR) and a one-sided Mann-Whitney test gives p < {p.alpha:g}.",
        "",
        f"- rows: {counts_line(result.counts())}",
        f"- {suite_line(result.suite)}",
    ]
    out += [f"- {note}" for note in result.notes]
    if result.ignored_baseline_rows:
        out.append(f"- {result.ignored_baseline_rows} baseline rows on other GPUs were not gated")
    reasons = result.reasons()
    if reasons:
        out += ["", "**Why it fails:**", ""] + [f"- {r}" for r in reasons]
    ordered = result.sorted()
    right = {2, 3, 4, 5, 6}
    attention = [gate_cells(c) for c in ordered if c.verdict in ATTENTION]
    if attention:
        out += ["", "### Rows that need attention", "", md_table(GATE_HEADER, attention, right)]
    out += [
        "",
        f"<details><summary>All {len(ordered)} rows</summary>",
        "",
        md_table(GATE_HEADER, [gate_cells(c) for c in ordered], right),
        "",
        "</details>",
        "",
    ]
    return "\n".join(out)


def compare_markdown(result: CompareResult) -> str:
    header = compare_header(result)
    right = {i for i, h in enumerate(header) if h.endswith(" ms") or h.endswith(" ratio")}
    out = [
        "## qla-bench compare",
        "",
        f"Reference: `{result.labels[0]}` ({', '.join(result.gpus[0])}). "
        "Ratios are run / reference (below 1 is faster); classes use the "
        f"gate's rules (threshold {result.params.threshold:.1%}).",
        "",
    ]
    out += [
        f"- `{label}` ({', '.join(gpus)}): {suite_line(s)}"
        for label, gpus, s in zip(result.labels[1:], result.gpus[1:], result.suites, strict=True)
    ]
    out += ["", md_table(header, [compare_cells(result, i) for i in result.order()], right), ""]
    return "\n".join(out)
