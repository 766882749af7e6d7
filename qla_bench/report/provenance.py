"""Provenance summaries shared by the text table and the Markdown report (versions, env, timers).

Rows from several runs may disagree (two torch builds, two timers): summaries show every value
instead of silently picking one, because a table is only as trustworthy as its header.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..rows import Row
from .grid import NO_TIMER

STATISTIC = "median"
# header order of library versions; anything else follows alphabetically
VERSION_ORDER = (
    "torch",
    "triton",
    "tilelang",
    "fla-core",
    "flash-linear-attention",
    "fla",
    "flashinfer-python",
    "flashinfer",
    "flash-qla",
    "cuda",
    "driver",
)
# distribution name -> the short name FlashQLA's header uses ('fla: 0.5.1 | flashinfer: 0.6.13')
SHORT_LIB = {
    "fla-core": "fla",
    "flash-linear-attention": "fla",
    "flashinfer-python": "flashinfer",
    "flash_qla": "flash-qla",
    "flashqla": "flash-qla",
}


def _merge(dicts: Iterable[Mapping[str, object]]) -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    for d in dicts:
        for key, value in (d or {}).items():
            vals = merged.setdefault(str(key), [])
            if str(value) not in vals:
                vals.append(str(value))
    return merged


def merged_versions(rows: Iterable[Row]) -> dict[str, list[str]]:
    """Every version seen per distribution, in first-seen order."""
    return _merge(r.versions for r in rows)


def merged_env_flags(rows: Iterable[Row]) -> dict[str, list[str]]:
    return _merge(r.env_flags for r in rows)


def _ordered(keys: Iterable[str]) -> list[str]:
    keys = list(keys)
    first = [k for k in VERSION_ORDER if k in keys]
    return first + sorted(k for k in keys if k not in VERSION_ORDER)


def versions_line(versions: Mapping[str, Sequence[str]]) -> str:
    """FlashQLA's 'torch: 2.9.1 | fla: 0.5.1' line; conflicting versions are joined with '/'."""
    return " | ".join(f"{k}: {'/'.join(versions[k])}" for k in _ordered(versions))


def env_line(flags: Mapping[str, Sequence[str]]) -> str:
    return " ".join(f"{k}={'/'.join(v)}" for k, v in sorted(flags.items()))


def short_versions(versions: Mapping[str, object]) -> dict[str, str]:
    """Map distribution names to FlashQLA's short library names (fla-core wins over its wrapper)."""
    out: dict[str, str] = {}
    for key in _ordered(versions):
        short = SHORT_LIB.get(key, key)
        out.setdefault(short, str(versions[key]))
    return out


def models_summary(rows: Sequence[Row]) -> str:
    """'397B/122B TP8, 27B TP1, d=128': model labels (or head configs) in first-seen order and dims."""
    labels = list(dict.fromkeys(r.model or f"h{r.h_qk}/{r.h_v}" for r in rows))
    dims = list(dict.fromkeys((r.k, r.v) for r in rows))
    if len(dims) == 1 and dims[0][0] == dims[0][1]:
        dim = f"d={dims[0][0]}"
    else:
        dim = "K/V=" + ", ".join(f"{k}/{v}" for k, v in dims)
    return ", ".join([*labels, dim])


def _repeats(rows: Sequence[Row]) -> str:
    counts = sorted({len(r.samples_ms) for r in rows if r.samples_ms})
    if not counts:
        return ""
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def timer_rows(rows: Iterable[Row], timer: str) -> list[Row]:
    return [r for r in rows if r.passed and (r.timer == timer or timer == NO_TIMER)]


def timer_summary(rows: Sequence[Row], timer: str) -> str:
    """'Timer=cuda-graph, Statistic=median, Repeats=100, L2=cold' for the rows that timer measured."""
    timed = timer_rows(rows, timer)
    parts = [f"Timer={timer}", f"Statistic={STATISTIC}"]
    repeats = _repeats(timed)
    if repeats:
        parts.append(f"Repeats={repeats}")
    l2 = list(dict.fromkeys(r.l2 for r in timed if r.l2))
    if l2:
        parts.append(f"L2={'/'.join(l2)}")
    return ", ".join(parts)
