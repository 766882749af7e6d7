"""The table model every printer shares: which backends, in what order, which row fills which cell.

Text table, Markdown and plots all read rows through this module so they agree on ordering (head
config as first seen, then sequence mix as first seen), on the primary backend and on ratios.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import UsageError
from ..rows import Row, Status

# FlashQLA's column names, so users read our table the way they read theirs
DISPLAY_NAMES = {"qla": "qla", "flashqla": "flash_qla", "flashinfer": "FI", "fla": "FLA", "torch": "torch"}
# preferred column order after the primary; unknown backends follow alphabetically
BACKEND_ORDER = ("qla", "flashqla", "flashinfer", "fla", "torch")
# short status words fit a latency column
STATUS_CELLS = {Status.UNSUPPORTED.value: "UNSUPP"}
MODES = ("fwd", "bwd", "train")
NO_TIMER = "n/a"


def display_name(backend: str) -> str:
    return DISPLAY_NAMES.get(backend, backend)


def status_cell(row: Row | None) -> str:
    """What a non-PASSED cell shows instead of a time ('-' when the backend has no row)."""
    if row is None:
        return "-"
    return STATUS_CELLS.get(row.status, row.status or "?")


def backends_of(rows: Iterable[Row]) -> list[str]:
    """Backends present, in display order (BACKEND_ORDER first, then alphabetical)."""
    present = {r.backend for r in rows}
    known = [b for b in BACKEND_ORDER if b in present]
    return known + sorted(present - set(BACKEND_ORDER))


def choose_primary(backends: Sequence[str], primary: str | None = None) -> str:
    """The backend every ratio divides by: explicit, else qla, else flashqla, else the first."""
    if not backends:
        raise UsageError("results", "no rows to report")
    if primary is not None:
        if primary not in backends:
            raise UsageError("--primary", f"no rows for backend {primary!r}", ", ".join(backends))
        return primary
    for candidate in ("qla", "flashqla"):
        if candidate in backends:
            return candidate
    return backends[0]


def column_order(backends: Sequence[str], primary: str) -> list[str]:
    """Primary first, then the others in display order."""
    return [primary, *[b for b in backends if b != primary]]


def latency(row: Row | None) -> float | None:
    """The headline statistic (median) of a PASSED row, else None."""
    if row is None or not row.passed or row.median_ms is None:
        return None
    value = float(row.median_ms)
    return value if value > 0 and math.isfinite(value) else None


def ratio(other: Row | None, primary: Row | None) -> float | None:
    """Other latency / primary latency: > 1 means the primary is faster (FlashQLA's 'vs X')."""
    a, b = latency(other), latency(primary)
    return None if a is None or b is None else a / b


@dataclass(frozen=True)
class HeadKey:
    model: str
    h_qk: int
    h_v: int
    k: int
    v: int

    def label(self, mode: str = "fwd") -> str:
        """Model Config cell; backward tables fall back to FlashQLA's 'hk16_hv32' naming."""
        if self.model:
            return self.model
        return f"hk{self.h_qk}_hv{self.h_v}" if mode != "fwd" else f"h{self.h_qk}/{self.h_v}"


def head_key(row: Row) -> HeadKey:
    return HeadKey(row.model or "", int(row.h_qk), int(row.h_v), int(row.k), int(row.v))


def mix_key(row: Row) -> tuple[int, ...]:
    return tuple(int(x) for x in row.seqlens)


def bwd_seqlen_label(seqlens: Sequence[int]) -> str:
    """FlashQLA's backward label: total tokens in k and the number of sequences, e.g. '8k_4seq'."""
    total = sum(seqlens)
    size = f"{total // 1024}k" if total % 1024 == 0 else str(total)
    return f"{size}_{len(seqlens)}seq"


@dataclass
class Line:
    """One table line: a (head config, sequence mix) and its row per backend."""

    head: HeadKey
    mix: tuple[int, ...]
    label: str
    cells: dict[str, Row] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return sum(self.mix)


@dataclass
class Grid:
    """Lines of one (mode, timer) table grouped by head config, in first-seen order."""

    mode: str
    timer: str
    backends: list[str]  # column order, primary first
    primary: str
    groups: list[tuple[HeadKey, list[Line]]]

    def lines(self) -> list[Line]:
        return [line for _, lines in self.groups for line in lines]

    def ratios(self, backend: str) -> list[tuple[Line, float]]:
        """(line, backend / primary) for every line where both are PASSED."""
        out = []
        for line in self.lines():
            r = ratio(line.cells.get(backend), line.cells.get(self.primary))
            if r is not None:
                out.append((line, r))
        return out


def timers_of(rows: Iterable[Row]) -> list[str]:
    """Timers that produced timings, in first-seen order; [NO_TIMER] when no row has one."""
    seen: list[str] = []
    for r in rows:
        if r.timer and r.timer not in seen:
            seen.append(r.timer)
    return seen or [NO_TIMER]


def modes_of(rows: Iterable[Row]) -> list[str]:
    present = {r.mode for r in rows}
    return [m for m in MODES if m in present] + sorted(present - set(MODES))


def build_grid(rows: Sequence[Row], mode: str, timer: str, primary: str, backends: Sequence[str]) -> Grid:
    """Place rows of one mode into one timer's table.

    A row without a timer (never timed: failed numerics, unsupported) shows in every timer's table,
    but never hides a row that this timer did measure.
    """
    groups: dict[HeadKey, dict[tuple[int, ...], Line]] = {}
    for r in rows:  # order from every row of the mode, so all timers' tables list lines alike
        if r.mode != mode:
            continue
        head, mix = head_key(r), mix_key(r)
        lines = groups.setdefault(head, {})
        if mix not in lines:
            label = bwd_seqlen_label(mix) if mode != "fwd" else r.label or "+".join(map(str, mix))
            lines[mix] = Line(head, mix, label)
        if r.timer and r.timer != timer and timer != NO_TIMER:
            continue
        line = lines[mix]
        old = line.cells.get(r.backend)
        if old is None or r.timer or not old.timer:
            line.cells[r.backend] = r
    groups = {h: {m: ln for m, ln in g.items() if ln.cells} for h, g in groups.items()}
    groups = {h: g for h, g in groups.items() if g}
    used = [b for b in backends if any(b in ln.cells for g in groups.values() for ln in g.values())]
    # a primary without rows in this mode (e.g. no backward yet) hands over to the default choice
    prim = primary if primary in used or not used else choose_primary(used)
    return Grid(mode, timer, column_order(used, prim), prim, [(h, list(g.values())) for h, g in groups.items()])


def grids(rows: Sequence[Row], primary: str | None = None) -> tuple[str, list[Grid]]:
    """All (mode, timer) tables of a set of rows, and the primary backend they use."""
    backends = backends_of(rows)
    prim = choose_primary(backends, primary)
    out = [build_grid(rows, mode, timer, prim, backends) for timer in timers_of(rows) for mode in modes_of(rows)]
    return prim, [g for g in out if g.groups]


def format_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}ms"


def format_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def latency_cell(row: Row | None) -> str:
    """A time for a PASSED row, else its status word."""
    value = latency(row)
    return format_ms(value) if value is not None else status_cell(row)
