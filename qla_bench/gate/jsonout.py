"""Machine-readable reports: the verdict, the suite check and every row's evidence."""

from __future__ import annotations

import math
from typing import Any

from .classify import Comparison
from .compare import CompareResult
from .gate import GateResult, SuiteCheck
from .params import GateParams


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def comparison_json(c: Comparison) -> dict[str, Any]:
    row = c.row
    out: dict[str, Any] = {"name": c.name, "verdict": c.verdict.value}
    if row is not None:
        out.update(
            gpu=row.gpu, backend=row.backend, mode=row.mode, h_qk=row.h_qk, h_v=row.h_v, k=row.k, v=row.v,
            seqlens=list(row.seqlens), label=row.label, dtype=row.dtype, gate=row.gate,
            zero_gate_frac=row.zero_gate_frac,
        )  # fmt: skip
    out.update(
        baseline_ms=_num(c.base_ms),
        candidate_ms=_num(c.head_ms),
        ratio=_num(c.ratio),
        ratio_ci=[_num(x) for x in c.ratio_ci] if c.ratio_ci else None,
        p_value=_num(c.p_value),
        bound=_num(c.bound),
        noise=_num(c.noise),
        baseline_status=c.base.status if c.base else None,
        candidate_status=c.head.status if c.head else None,
        note=c.note,
    )
    return out


def suite_json(s: SuiteCheck) -> dict[str, Any]:
    return {"geomean": _num(s.geomean), "rows": s.n_rows, "limit": s.limit, "failed": s.failed}


def params_json(p: GateParams) -> dict[str, Any]:
    return {
        "threshold": p.threshold,
        "iqr_factor": p.iqr_factor,
        "alpha": p.alpha,
        "suite_limit": p.suite_limit,
    }


def gate_json(result: GateResult) -> dict[str, Any]:
    return {
        "tool": "qla-bench gate",
        "status": result.status,
        "exit_code": result.exit_code,
        "baseline": result.baseline,
        "candidate": result.candidate,
        "gpus": result.gpus,
        "params": params_json(result.params),
        "counts": result.counts(),
        "suite": suite_json(result.suite),
        "reasons": result.reasons(),
        "notes": result.notes,
        "ignored_baseline_rows": result.ignored_baseline_rows,
        "rows": [comparison_json(c) for c in result.sorted()],
    }


def compare_json(result: CompareResult) -> dict[str, Any]:
    return {
        "tool": "qla-bench compare",
        "reference": result.labels[0],
        "params": params_json(result.params),
        "runs": [
            {"label": label, "gpus": gpus, "suite": suite_json(s), "rows": [comparison_json(c) for c in pair]}
            for label, gpus, s, pair in zip(
                result.labels[1:], result.gpus[1:], result.suites, result.pairs, strict=True
            )
        ],
    }
