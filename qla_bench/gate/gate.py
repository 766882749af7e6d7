"""Gate a candidate run against a baseline: match rows, validate the pairing, classify, suite check.

Rows are matched by Row.config_key() (GPU, backend, mode, workload). A pairing that can't be right is
a usage error (exit 3), never a silent pass: different GPUs, no rows in common, different timers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..errors import UsageError
from ..rows import Row
from ..stats import geomean
from .classify import Comparison, Verdict, classify
from .labels import describe_gpus, gpu_names
from .params import GateParams

TIMED = (Verdict.SLOWER, Verdict.FASTER, Verdict.SAME, Verdict.AMBIGUOUS)


@dataclass(frozen=True)
class SuiteCheck:
    """Geometric mean of candidate/baseline ratios over the rows timed on both sides."""

    geomean: float
    n_rows: int
    limit: float

    @property
    def failed(self) -> bool:
        return self.n_rows > 0 and math.isfinite(self.geomean) and self.geomean > self.limit


@dataclass
class GateResult:
    """Everything a report needs. exit_code: 0 pass, 1 performance regression, 2 numerics/missing."""

    baseline: str
    candidate: str
    params: GateParams
    comparisons: list[Comparison]
    suite: SuiteCheck
    gpus: list[str]
    ignored_baseline_rows: int = 0  # baseline rows on GPUs the candidate did not run on
    notes: list[str] = field(default_factory=list)

    def of(self, verdict: Verdict) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict is verdict]

    def counts(self) -> dict[str, int]:
        return {v.value: len(self.of(v)) for v in Verdict}

    @property
    def exit_code(self) -> int:
        code = max((c.verdict.exit_code for c in self.comparisons), default=0)
        return max(code, 1 if self.suite.failed else 0)

    @property
    def status(self) -> str:
        return {0: "PASS", 1: "FAIL (performance regression)", 2: "FAIL (numerics or missing rows)"}[self.exit_code]

    def sorted(self) -> list[Comparison]:
        """Regressions first, then by how much slower, then by name (stable for golden files)."""
        return sorted(self.comparisons, key=sort_key)

    def reasons(self) -> list[str]:
        """One line per reason the gate fails (empty when it passes)."""
        out = []
        for verdict in (Verdict.NUMERICS, Verdict.MISSING, Verdict.SLOWER):
            rows = self.of(verdict)
            if rows:
                out.append(f"{len(rows)} {verdict.value} row(s): " + ", ".join(c.name for c in rows))
        if self.suite.failed:
            out.append(
                f"suite geometric mean ratio {self.suite.geomean:.3f} > {self.suite.limit:.3f} "
                f"over {self.suite.n_rows} rows"
            )
        return out


def sort_key(c: Comparison) -> tuple:
    return (c.verdict.severity, -(c.ratio if c.ratio is not None else 0.0), c.name)


def suite_check(comparisons: list[Comparison], params: GateParams) -> SuiteCheck:
    ratios = [c.ratio for c in comparisons if c.verdict in TIMED and c.ratio is not None]
    return SuiteCheck(geomean=geomean(ratios), n_rows=len(ratios), limit=params.suite_limit)


def index_rows(rows: list[Row]) -> dict[tuple, Row]:
    return {r.config_key(): r for r in rows}


def validate_pairing(base: list[Row], head: list[Row]) -> list[Row]:
    """Check that the runs can be gated; return the baseline rows on the candidate's GPUs."""
    if not base:
        raise UsageError("--baseline", "holds no result rows")
    if not head:
        raise UsageError("--candidate", "holds no result rows")
    head_gpus = set(gpu_names(head))
    scoped = [r for r in base if r.gpu in head_gpus]
    if not scoped:
        raise UsageError(
            "--candidate",
            f"candidate ran on GPU {describe_gpus(sorted(head_gpus))} but the baseline is from "
            f"{describe_gpus(gpu_names(base))}; the gate compares runs on the same GPU only "
            "(use `qla-bench compare` to put different GPUs side by side)",
        )
    base_idx, head_idx = index_rows(scoped), index_rows(head)
    common = [k for k in base_idx if k in head_idx]
    if not common:
        raise UsageError("--candidate", _no_common_rows(scoped, head))
    for k in common:
        b, h = base_idx[k], head_idx[k]
        if b.l2 and h.l2 and b.l2 != h.l2:
            raise UsageError(
                "--candidate",
                f"timed with L2 {h.l2!r} but the baseline with L2 {b.l2!r}; "
                "rerun the candidate with the baseline's L2 mode",
            )
    return scoped


def _no_common_rows(base: list[Row], head: list[Row]) -> str:
    """Say why nothing matched, naming the field that differs when one does."""
    text = f"no rows in common with the baseline ({len(base)} baseline rows, {len(head)} candidate rows)"
    for field_name in ("timer", "mode", "backend", "dtype"):
        loose = {replace(r, **{field_name: ""}).config_key() for r in base}
        if any(replace(r, **{field_name: ""}).config_key() in loose for r in head):
            theirs = sorted({getattr(r, field_name) for r in head})
            ours = sorted({getattr(r, field_name) for r in base})
            return f"{text}: the {field_name} differs (baseline {ours}, candidate {theirs})"
    return f"{text}; were they made with the same sweep, backends and modes?"


def gate_rows(
    base: list[Row],
    head: list[Row],
    params: GateParams | None = None,
    baseline_label: str = "baseline",
    candidate_label: str = "candidate",
) -> GateResult:
    """Classify every config of the baseline and candidate; raises UsageError for bad pairings."""
    params = params or GateParams()
    scoped = validate_pairing(base, head)
    base_idx, head_idx = index_rows(scoped), index_rows(head)
    keys = list(base_idx) + [k for k in head_idx if k not in base_idx]
    comparisons = [classify(base_idx.get(k), head_idx.get(k), params) for k in keys]
    return GateResult(
        baseline=baseline_label,
        candidate=candidate_label,
        params=params,
        comparisons=comparisons,
        suite=suite_check(comparisons, params),
        gpus=gpu_names(head),
        ignored_baseline_rows=len(base) - len(scoped),
    )


def reclassify(result: GateResult, new_head: dict[tuple, Row], note: str = "") -> GateResult:
    """Replace the candidate side of some configs (e.g. after a re-measurement) and classify again."""
    out: list[Comparison] = []
    for c in result.comparisons:
        if c.key in new_head:
            again = classify(c.base, new_head[c.key], result.params)
            if note:
                again.note = f"{note.format(first=c)}; {again.note}".rstrip("; ")
            out.append(again)
        else:
            out.append(c)
    result.comparisons = out
    result.suite = suite_check(out, result.params)
    return result
