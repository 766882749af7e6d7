"""CI performance gating: classify candidate rows against a baseline, compare runs, write reports.

Reads result rows only (no torch, no backends), so it runs on any machine from committed files.
A notebook can call gate_rows() / compare_runs() and the writers directly; the CLI is a thin layer.
"""

from .baseline import Baseline, list_baselines, load_baseline, load_run, resolve_run, save_baseline
from .classify import Comparison, Verdict, classify
from .compare import CompareResult, compare_runs
from .gate import GateResult, SuiteCheck, gate_rows
from .outputs import append_step_summary, write_reports
from .params import GateParams, parse_threshold
from .rerun import rerun_if_possible, rerun_slower, rerun_unavailable

__all__ = [
    "Baseline",
    "CompareResult",
    "Comparison",
    "GateParams",
    "GateResult",
    "SuiteCheck",
    "Verdict",
    "append_step_summary",
    "classify",
    "compare_runs",
    "gate_rows",
    "list_baselines",
    "load_baseline",
    "load_run",
    "parse_threshold",
    "rerun_if_possible",
    "rerun_slower",
    "rerun_unavailable",
    "resolve_run",
    "save_baseline",
    "write_reports",
]
