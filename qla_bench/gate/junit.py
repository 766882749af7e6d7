"""JUnit XML: one testcase per row (CI systems show failing rows as failing tests), plus the suite check.

Deterministic output (no timestamps or hostnames), so it can be compared against a golden file.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from .classify import Comparison, Verdict
from .compare import CompareResult
from .gate import GateResult, SuiteCheck
from .table import fmt_ci, fmt_ms, fmt_p, fmt_ratio, suite_line

FAILURES = (Verdict.NUMERICS, Verdict.MISSING, Verdict.SLOWER)
SKIPS = (Verdict.NEW, Verdict.UNTIMED)


def _detail(c: Comparison) -> str:
    parts = []
    if c.base_ms is not None:
        parts.append(f"baseline {fmt_ms(c.base_ms)} ms")
    if c.head_ms is not None:
        parts.append(f"candidate {fmt_ms(c.head_ms)} ms")
    if c.ratio is not None:
        parts.append(f"ratio {fmt_ratio(c.ratio)} (95% CI {fmt_ci(c.ratio_ci)}), p={fmt_p(c.p_value)}")
    text = ", ".join(parts)
    return f"{text}; {c.note}" if text and c.note else text or c.note


def _testcase(parent: ET.Element, c: Comparison, prefix: str) -> None:
    row = c.row
    classname = f"{prefix}.{row.backend}.{row.mode}" if row is not None else prefix
    seconds = (c.head_ms or 0.0) / 1000.0
    case = ET.SubElement(parent, "testcase", classname=classname, name=c.name, time=f"{seconds:.6f}")
    if c.verdict in FAILURES:
        message = f"{c.verdict.value}: {c.note}" if c.note else c.verdict.value
        failure = ET.SubElement(case, "failure", type=c.verdict.value, message=message)
        failure.text = _detail(c)
    elif c.verdict in SKIPS:
        ET.SubElement(case, "skipped", message=f"{c.verdict.value}: {c.note}")
    else:
        ET.SubElement(case, "system-out").text = f"{c.verdict.value}: {_detail(c)}"


def _suite_case(parent: ET.Element, suite: SuiteCheck, prefix: str) -> None:
    case = ET.SubElement(parent, "testcase", classname=prefix, name="suite geometric mean", time="0.000000")
    if suite.failed:
        ET.SubElement(case, "failure", type="SUITE", message=suite_line(suite))
    else:
        ET.SubElement(case, "system-out").text = suite_line(suite)


def _testsuite(parent: ET.Element, name: str, comparisons: list[Comparison], suite: SuiteCheck) -> ET.Element:
    failures = sum(c.verdict in FAILURES for c in comparisons) + int(suite.failed)
    skipped = sum(c.verdict in SKIPS for c in comparisons)
    ts = ET.SubElement(
        parent,
        "testsuite",
        name=name,
        tests=str(len(comparisons) + 1),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time="0",
    )
    for c in comparisons:
        _testcase(ts, c, "qla_bench")
    _suite_case(ts, suite, "qla_bench")
    return ts


def _render(root: ET.Element) -> str:
    total = {k: sum(int(ts.get(k, "0")) for ts in root) for k in ("tests", "failures", "errors", "skipped")}
    for k, v in total.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def gate_junit(result: GateResult) -> str:
    root = ET.Element("testsuites", name="qla-bench gate")
    name = f"gate {result.candidate} vs {result.baseline}"
    _testsuite(root, name, result.sorted(), result.suite)
    return _render(root)


def compare_junit(result: CompareResult) -> str:
    root = ET.Element("testsuites", name="qla-bench compare")
    for label, pair, suite in zip(result.labels[1:], result.pairs, result.suites, strict=True):
        ordered = [pair[i] for i in result.order()]
        _testsuite(root, f"compare {label} vs {result.labels[0]}", ordered, suite)
    return _render(root)
