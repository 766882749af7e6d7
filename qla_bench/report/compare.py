"""Our ratios against FlashQLA's published ones, with the reason a ratio may differ.

A published '2.81x vs FLA' and our measured FLA / flash_qla on the same config are compared; a
deviation beyond the threshold (20 %) is flagged, and the reason column names what differs between
the two measurements: which backend moved, GPU, timer, L2 handling, statistic, library versions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..rows import Row
from ..stats import geomean
from .anchors import AnchorRecord, AnchorTable
from .grid import display_name, latency, timers_of
from .provenance import STATISTIC, short_versions

THRESHOLD = 0.20
# libraries whose version can change a backend's time
LIBS_BY_BACKEND = {
    "fla": ("torch", "triton", "fla"),
    "flashqla": ("torch", "tilelang", "flash-qla"),
    "flashinfer": ("torch", "flashinfer"),
    "qla": ("torch", "tilelang"),
    "torch": ("torch",),
}


@dataclass(frozen=True)
class Comparison:
    """One published ratio (baseline / primary) next to ours on the same config and timer."""

    record: AnchorRecord
    baseline: str
    timer: str
    theirs: float
    ours: float | None
    ours_ms: dict[str, float | None]
    reasons: tuple[str, ...]
    unavailable: str = ""  # why we have no ratio: a missing or non-PASSED row of either backend

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def deviation(self) -> float | None:
        """ours / theirs - 1 (None when we have no PASSED pair)."""
        return None if self.ours is None else self.ours / self.theirs - 1.0

    def flagged(self, threshold: float = THRESHOLD) -> bool:
        dev = self.deviation
        return dev is not None and abs(dev) > threshold


def _norm_timer(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


def _norm_gpu(name: str) -> str:
    return name.lower().removeprefix("nvidia").strip()


def _lookup_key(mode: str, h_qk: int, h_v: int, seqlens: Sequence[int] | None, total: int, n: int) -> tuple:
    """Forward lines match on the exact split; backward ones (random splits) on total and count."""
    if mode == "fwd" and seqlens is not None:
        return (mode, h_qk, h_v, tuple(seqlens))
    return (mode, h_qk, h_v, total, n)


def _index(rows: Sequence[Row], timer: str, head_dim: int | None) -> dict[tuple, dict[str, Row]]:
    """Our rows by config key, one per backend, preferring this timer's PASSED row."""
    out: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        if head_dim is not None and (r.k != head_dim or r.v != head_dim):
            continue
        if r.timer and r.timer != timer:
            continue
        key = _lookup_key(r.mode, r.h_qk, r.h_v, r.seqlens, sum(r.seqlens), len(r.seqlens))
        cell = out.setdefault(key, {})
        old = cell.get(r.backend)
        if old is None or (r.passed and not old.passed):
            cell[r.backend] = r
    return out


def _moved(pairs: Sequence[tuple[str, float | None, float | None]]) -> str | None:
    """'time vs published: FLA 1.26x, flash_qla 0.97x', the backend that moved most first."""
    factors = [(b, ours / theirs) for b, ours, theirs in pairs if ours is not None and theirs]
    if not factors:
        return None
    factors.sort(key=lambda bf: -abs(math.log(bf[1])))
    return "time vs published: " + ", ".join(f"{display_name(b)} {f:.2f}x" for b, f in factors)


def reasons(
    table: AnchorTable,
    record: AnchorRecord,
    baseline: str,
    ours: dict[str, Row],
    timer: str,
) -> tuple[str, ...]:
    """What differs between our measurement and theirs, most telling first."""
    out: list[str] = []
    primary = record.primary
    rows = [r for r in (ours.get(baseline), ours.get(primary)) if r is not None]
    for r in rows:
        if not r.passed:
            out.append(f"{display_name(r.backend)} {r.status}" + (f": {r.reason}" if r.reason else ""))
    moved = _moved([(b, latency(ours.get(b)), record.latency_ms.get(b)) for b in (baseline, primary)])
    if moved:
        out.append(moved)
    if any(r.throttled for r in rows):
        out.append("throttled during our measurement")
    gpus = {r.gpu for r in rows if r.gpu}
    if table.gpu and gpus and all(_norm_gpu(g) != _norm_gpu(table.gpu) for g in gpus):
        out.append(f"GPU {'/'.join(sorted(gpus))} vs their {table.gpu}")
    if table.timer and _norm_timer(timer) != _norm_timer(table.timer):
        out.append(f"timer {timer} vs their {table.timer}")
    l2 = {r.l2 for r in rows if r.l2}
    if "cold" in l2 and _norm_timer(table.timer) == "cudagraph" and "L2" not in table.config:
        out.append("L2 flushed here; their graph replays state no flush (warm L2)")
    if table.statistic != STATISTIC:
        out.append(f"{STATISTIC} vs their {table.statistic}")
    for r in rows:
        mine = short_versions(r.versions)
        for lib in LIBS_BY_BACKEND.get(r.backend, ("torch",)):
            theirs = table.versions.get(lib)
            text = f"{lib} {mine.get(lib)} vs {theirs}"
            if theirs and mine.get(lib) and mine[lib] != theirs and text not in out:
                out.append(text)
    return tuple(out) or ("no provenance difference found",)


def compare_with_anchors(rows: Sequence[Row], table: AnchorTable) -> list[Comparison]:
    """Every published ratio for which we have rows of both backends on the same config."""
    out: list[Comparison] = []
    for timer in timers_of(rows):
        ours_by_key = _index(rows, timer, table.head_dim)
        for rec in table.records:
            key = _lookup_key(rec.mode, rec.h_qk, rec.h_v, rec.seqlens, rec.total_tokens, rec.n_seq)
            ours = ours_by_key.get(key, {})
            prim_row = ours.get(rec.primary)
            for baseline, theirs in rec.ratios.items():
                base_row = ours.get(baseline)
                if prim_row is None and base_row is None:
                    continue
                p_ms, b_ms = latency(prim_row), latency(base_row)
                gaps = [
                    f"no {display_name(b)} row"
                    if r is None
                    else f"{display_name(b)} {r.status}" + (f": {r.reason}" if r.reason else "")
                    for b, r in ((rec.primary, prim_row), (baseline, base_row))
                    if latency(r) is None
                ]
                mine = b_ms / p_ms if p_ms and b_ms else None
                out.append(
                    Comparison(
                        record=rec,
                        baseline=baseline,
                        timer=timer,
                        theirs=theirs,
                        ours=mine,
                        ours_ms={rec.primary: p_ms, baseline: b_ms},
                        reasons=reasons(table, rec, baseline, ours, timer),
                        unavailable="; ".join(gaps),
                    )
                )
    return out


@dataclass(frozen=True)
class PairSummary:
    mode: str
    timer: str
    primary: str
    baseline: str
    compared: int
    flagged: int
    not_comparable: int
    geomean_ours_over_theirs: float


def summarize_comparisons(comps: Sequence[Comparison], threshold: float = THRESHOLD) -> list[PairSummary]:
    """Per (mode, timer, pair): how many compared, how many beyond the threshold, typical drift."""
    groups: dict[tuple[str, str, str, str], list[Comparison]] = {}
    for c in comps:
        groups.setdefault((c.record.mode, c.timer, c.record.primary, c.baseline), []).append(c)
    out = []
    for (mode, timer, primary, baseline), items in groups.items():
        valid = [c for c in items if c.ours is not None]
        out.append(
            PairSummary(
                mode=mode,
                timer=timer,
                primary=primary,
                baseline=baseline,
                compared=len(valid),
                flagged=sum(c.flagged(threshold) for c in valid),
                not_comparable=len(items) - len(valid),
                geomean_ours_over_theirs=geomean([c.ours / c.theirs for c in valid if c.ours]),
            )
        )
    return out


def common_reasons(comps: Sequence[Comparison]) -> tuple[str, ...]:
    """Reasons every comparison shares (timer, statistic, versions): stated once above a table."""
    if not comps:
        return ()
    shared = set(comps[0].reasons)
    for c in comps[1:]:
        shared &= set(c.reasons)
    return tuple(r for r in comps[0].reasons if r in shared)
