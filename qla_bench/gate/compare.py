"""Side-by-side comparison of several runs (two library versions, two commits, two GPUs).

The first run is the reference; every other run is classified against it with the gate's rules.
When each run holds a single GPU, rows are matched without the GPU name, so an H200 run can be put
next to a GB200 run. compare reports; it does not fail on regressions (that is `gate`'s job).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..rows import Row
from .classify import Comparison, Verdict, classify
from .gate import SuiteCheck, suite_check
from .labels import gpu_names, row_name
from .params import GateParams


@dataclass
class CompareResult:
    labels: list[str]
    params: GateParams
    keys: list[tuple]
    names: dict[tuple, str]
    cells: dict[tuple, list[Row | None]]  # per key, one row (or None) per run
    pairs: list[list[Comparison]]  # per run after the first, one comparison per key (keys order)
    suites: list[SuiteCheck]
    gpus: list[list[str]]
    by_gpu: bool  # whether the GPU name is part of the match

    def worst(self, i: int) -> Verdict:
        """Most severe verdict of key i across the runs."""
        return min((p[i].verdict for p in self.pairs), key=lambda v: v.severity)

    def order(self) -> list[int]:
        """Key indices, regressions first (by the most severe verdict, then the largest ratio)."""

        def key(i: int) -> tuple:
            ratios = [p[i].ratio for p in self.pairs if p[i].ratio is not None]
            return (self.worst(i).severity, -max(ratios, default=0.0), self.names[self.keys[i]])

        return sorted(range(len(self.keys)), key=key)


def compare_key(row: Row, by_gpu: bool) -> tuple:
    key = row.config_key()
    return key if by_gpu else key[1:]


def compare_runs(runs: list[tuple[str, list[Row]]], params: GateParams | None = None) -> CompareResult:
    """Classify every run after the first against the first; raises UsageError on unusable input."""
    params = params or GateParams()
    if len(runs) < 2:
        raise UsageError("RUNS", f"need at least two runs to compare, got {len(runs)}")
    for label, rows in runs:
        if not rows:
            raise UsageError("RUNS", f"{label} holds no result rows")
    by_gpu = any(len(gpu_names(rows)) > 1 for _, rows in runs)
    indexed = [{compare_key(r, by_gpu): r for r in rows} for _, rows in runs]
    keys = list(dict.fromkeys(k for idx in indexed for k in idx))  # first-seen order, no repeats
    ref = indexed[0]
    for (label, _), idx in zip(runs[1:], indexed[1:], strict=True):
        if not any(k in ref for k in idx):
            raise UsageError("RUNS", f"{label} has no rows in common with {runs[0][0]}")
    cells = {k: [idx.get(k) for idx in indexed] for k in keys}
    names = {k: row_name(next(r for r in cells[k] if r is not None), with_gpu=by_gpu) for k in keys}
    pairs = []
    for idx in indexed[1:]:
        pair = []
        for k in keys:
            if k in ref or k in idx:
                c = classify(ref.get(k), idx.get(k), params)
            else:
                c = Comparison(key=k, name="", base=None, head=None, verdict=Verdict.UNTIMED, note="in neither run")
            c.key, c.name = k, names[k]
            pair.append(c)
        pairs.append(pair)
    return CompareResult(
        labels=[label for label, _ in runs],
        params=params,
        keys=keys,
        names=names,
        cells=cells,
        pairs=pairs,
        suites=[suite_check(p, params) for p in pairs],
        gpus=[gpu_names(rows) for _, rows in runs],
        by_gpu=by_gpu,
    )
