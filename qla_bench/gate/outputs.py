"""Write the requested report files; append Markdown to $GITHUB_STEP_SUMMARY when CI sets it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from .compare import CompareResult
from .gate import GateResult
from .jsonout import compare_json, gate_json
from .junit import compare_junit, gate_junit
from .markdown import compare_markdown, gate_markdown
from .plot import compare_plot, gate_plot

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


def write_text(path: str | Path, text: str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def append_step_summary(markdown: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Append to the file GitHub Actions names in $GITHUB_STEP_SUMMARY (earlier steps' text is kept)."""
    target = (env if env is not None else os.environ).get(STEP_SUMMARY)
    if not target:
        return None
    p = Path(target)
    with p.open("a", encoding="utf-8") as fh:
        fh.write(markdown if markdown.endswith("\n") else markdown + "\n")
    return p


def write_reports(
    result: GateResult | CompareResult,
    markdown: str | Path | None = None,
    junit: str | Path | None = None,
    json_path: str | Path | None = None,
    plot: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write each report that was asked for; return the paths written."""
    if isinstance(result, GateResult):
        md, xml, data = gate_markdown(result), gate_junit, gate_json
        draw = gate_plot
    else:
        md, xml, data = compare_markdown(result), compare_junit, compare_json
        draw = compare_plot
    written: list[Path] = []
    if markdown:
        written.append(write_text(markdown, md))
    if junit:
        written.append(write_text(junit, xml(result)))  # type: ignore[arg-type]
    if json_path:
        written.append(write_text(json_path, json.dumps(data(result), indent=2) + "\n"))  # type: ignore[arg-type]
    if plot:
        written += draw(result, plot)  # type: ignore[arg-type]
    summary = append_step_summary(md, env)
    if summary is not None:
        written.append(summary)
    return written
