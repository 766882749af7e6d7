"""Rows whose CUDA-events time measures the host, not the GPU.

The events timer brackets one call per sample, so a call whose host work (argument checks, allocations,
launches) takes longer than its kernels leaves the GPU waiting, and the sample is host time; the CUDA-graph
timer replays the recorded launches with no host work in between. Where both timers timed one config at one
commit, events well above graph marks a host-bound row: its events latency says how fast the library's
Python path is on that host (which moves by tens of microseconds between processes), not the kernels.
Rows that record the host's own time per call (host_median_ms) say it without a graph row: events rows whose
host time reaches HOST_TIME_FRACTION of their median.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..rows import Row

EVENTS, GRAPH = "cuda-events", "cuda-graph"
HOST_BOUND_RATIO = 1.2  # events / graph at or above this: the GPU waited for the host
HOST_TIME_FRACTION = 0.9  # an events row whose own host time per call is at least this share of its median


@dataclass(frozen=True)
class HostBoundRow:
    events: Row
    graph: Row

    @property
    def ratio(self) -> float:
        return self.events.median_ms / self.graph.median_ms


def _pair_key(r: Row) -> tuple:
    """Everything but the timer: the same backend, workload and commit on the same GPU."""
    return (r.gpu, r.backend, r.mode, r.h_qk, r.h_v, r.k, r.v, tuple(r.seqlens), r.dtype, r.gate,
            r.zero_gate_frac, r.seed, r.git_sha)  # fmt: skip


def host_bound_rows(rows: Iterable[Row], threshold: float = HOST_BOUND_RATIO) -> tuple[list[HostBoundRow], int]:
    """(the pairs with events / graph >= threshold, worst first; how many pairs there were). Only PASSED rows
    with a median count, the latest of each timer per key; rows of different commits are never paired (a
    kernel change between them would read as host time)."""
    latest: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        if not r.passed or r.timer not in (EVENTS, GRAPH) or not r.median_ms:
            continue
        slot = latest.setdefault(_pair_key(r), {})
        if r.timer not in slot or r.timestamp > slot[r.timer].timestamp:
            slot[r.timer] = r
    pairs = [HostBoundRow(s[EVENTS], s[GRAPH]) for s in latest.values() if EVENTS in s and GRAPH in s]
    flagged = sorted((p for p in pairs if p.ratio >= threshold), key=lambda p: -p.ratio)
    return flagged, len(pairs)


def host_timed_rows(rows: Iterable[Row], fraction: float = HOST_TIME_FRACTION) -> tuple[list[Row], int]:
    """(the cuda-events rows whose recorded host time per call is >= fraction x their median, by that share,
    largest first; how many events rows recorded a host time). PASSED rows only, the latest per config key."""
    latest: dict[tuple, Row] = {}
    for r in rows:
        if not r.passed or r.timer != EVENTS or not r.median_ms or r.host_median_ms is None:
            continue
        key = r.config_key()
        if key not in latest or r.timestamp > latest[key].timestamp:
            latest[key] = r
    share = {id(r): r.host_median_ms / r.median_ms for r in latest.values()}
    flagged = sorted((r for r in latest.values() if share[id(r)] >= fraction), key=lambda r: -share[id(r)])
    return flagged, len(latest)
