"""Report formats: golden Markdown and JUnit files, JSON content, the step summary, the plot files.

Regenerate the golden files after an intended format change with QLA_UPDATE_GOLDEN=1 and review the diff.
The ratio CIs in them come from a seeded bootstrap (numpy default_rng(0)): a numpy release that changed
that stream would change their last digits (regenerate then).
"""

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from gate_fakes import golden_runs

from qla_bench.gate import Verdict, append_step_summary, compare_runs, gate_rows, write_reports
from qla_bench.gate.jsonout import gate_json
from qla_bench.gate.junit import compare_junit, gate_junit
from qla_bench.gate.markdown import compare_markdown, gate_markdown
from qla_bench.gate.plot import plot_paths

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("QLA_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; run with QLA_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8")


@pytest.fixture
def gated():
    base, head, _ = golden_runs()
    return gate_rows(base, head, baseline_label="main", candidate_label="pr-123")


@pytest.fixture
def compared():
    base, head, third = golden_runs()
    return compare_runs([("v0.1", base), ("v0.2", head), ("v0.3", third)])


def test_golden_rows_cover_every_verdict(gated):
    assert {c.verdict for c in gated.comparisons} == set(Verdict)
    assert gated.exit_code == 2


def test_gate_markdown_golden(gated):
    check_golden("gate.md", gate_markdown(gated))


def test_gate_junit_golden(gated):
    check_golden("gate.junit.xml", gate_junit(gated))


def test_compare_markdown_golden(compared):
    check_golden("compare.md", compare_markdown(compared))


def test_compare_junit_golden(compared):
    check_golden("compare.junit.xml", compare_junit(compared))


def test_junit_has_one_testcase_per_row_and_fails_regressions(gated):
    root = ET.fromstring(gate_junit(gated))
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(gated.comparisons) + 1  # + the suite geomean check
    failed = {c.get("name"): c.find("failure").get("type") for c in cases if c.find("failure") is not None}
    assert failed == {
        "flashqla fwd h16/32 8192x4": "NUMERICS",
        "fla fwd h16/32 8192x4": "MISSING",
        "fla fwd h16/64 1x4096": "SLOWER",
    }
    assert root.get("failures") == "3" and root.get("skipped") == "2"


def test_markdown_lists_regressions_first(gated):
    md = gate_markdown(gated)
    attention = md.split("### Rows that need attention")[1].split("<details>")[0]
    classes = [
        line.split("|")[1].strip() for line in attention.splitlines() if line.startswith("| ") and "Row" not in line
    ]
    assert classes == ["NUMERICS", "MISSING", "SLOWER", "AMBIGUOUS"]


def test_json_report(gated):
    data = json.loads(json.dumps(gate_json(gated)))
    assert data["exit_code"] == 2 and data["status"].startswith("FAIL")
    assert data["counts"]["SLOWER"] == 1 and data["counts"]["NEW"] == 1
    slow = next(r for r in data["rows"] if r["verdict"] == "SLOWER")
    assert slow["name"] == "fla fwd h16/64 1x4096" and slow["p_value"] < 0.01
    assert slow["ratio_ci"][0] < slow["ratio"] < slow["ratio_ci"][1]
    assert data["params"]["threshold"] == 0.05


def test_step_summary_is_appended_only_when_set(tmp_path, gated):
    target = tmp_path / "summary.md"
    target.write_text("# earlier\n")
    assert append_step_summary("hello", env={}) is None
    assert append_step_summary("hello", env={"GITHUB_STEP_SUMMARY": str(target)}) == target
    assert target.read_text() == "# earlier\nhello\n"


def test_write_reports_writes_every_format(tmp_path, gated, compared):
    env = {"GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    written = write_reports(
        gated, tmp_path / "g.md", tmp_path / "g.xml", tmp_path / "g.json", tmp_path / "plots" / "g.png", env=env
    )
    assert [p.name for p in written] == ["g.md", "g.xml", "g.json", "g.png", "g.svg", "summary.md"]
    assert all(p.stat().st_size > 0 for p in written)
    written = write_reports(compared, json_path=tmp_path / "c.json", plot=tmp_path / "c", env={})
    assert [p.name for p in written] == ["c.json", "c.png", "c.svg"]
    assert json.loads((tmp_path / "c.json").read_text())["reference"] == "v0.1"


def test_plot_paths():
    assert plot_paths("out/gate.png") == [Path("out/gate.png"), Path("out/gate.svg")]
    assert plot_paths("out/gate.svg") == [Path("out/gate.png"), Path("out/gate.svg")]
    assert plot_paths("out/gate") == [Path("out/gate.png"), Path("out/gate.svg")]
