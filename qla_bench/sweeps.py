"""Sweep definitions (TOML files in sweeps/) -> the ordered list of points to measure.

A sweep is data: head configs (optionally a model's total heads with a list of TP degrees), sequence
mixes (explicit labels, or seeded random splits of a token total), dims and the input recipe.
Combinations that cannot exist (heads not divisible by TP) become points with a skip reason, which
the runner writes as UNSUPPORTED rows.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError
from .workload import MODES, HeadConfig, InputRecipe, Workload, parse_heads, parse_seqlens, seqlens_label

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


@dataclass(frozen=True)
class SweepPoint:
    """One (heads, seqlens) point; workload is None when the combination is impossible (skip_reason)."""

    model: str
    label: str
    seqlens: tuple[int, ...]
    workload: Workload | None
    skip_reason: str = ""
    h_qk: int = 0
    h_v: int = 0


@dataclass
class Sweep:
    name: str
    mode: str
    description: str = ""
    points: list[SweepPoint] = field(default_factory=list)
    source: str = ""

    @property
    def workloads(self) -> list[Workload]:
        return [p.workload for p in self.points if p.workload is not None]


def sweeps_dirs() -> list[Path]:
    """Where sweep files live: $QLA_BENCH_SWEEPS, the checkout's sweeps/, the installed package data."""
    dirs = []
    if os.environ.get("QLA_BENCH_SWEEPS"):
        dirs.append(Path(os.environ["QLA_BENCH_SWEEPS"]))
    dirs.append(Path(__file__).resolve().parents[1] / "sweeps")
    return [d for d in dirs if d.is_dir()]


def available_sweeps() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in reversed(sweeps_dirs()):
        for p in sorted(d.glob("*.toml")):
            found[p.stem] = p
    return dict(sorted(found.items()))


def random_split(total: int, n: int, seed: int, min_len: int = 1) -> tuple[int, ...]:
    """Split `total` tokens into n seeded random lengths >= min_len (FlashQLA's backward grid style)."""
    if n < 1 or total < n * min_len:
        raise UsageError("splits", f"cannot split {total} tokens into {n} sequences of >= {min_len}")
    if n == 1:
        return (total,)
    rng = random.Random(f"{seed}|{total}|{n}")
    free = total - n * min_len
    cuts = sorted(rng.randint(0, free) for _ in range(n - 1))
    parts = [b - a for a, b in zip([0, *cuts], [*cuts, free])]
    return tuple(p + min_len for p in parts)


def _split_label(total: int, n: int) -> str:
    size = f"{total // 1024}k" if total % 1024 == 0 else str(total)
    return f"{size}_{n}seq"


def _require(data: dict, key: str, where: str, kind: type | tuple[type, ...]):
    if key not in data:
        raise UsageError(where, f"missing key {key!r}")
    if not isinstance(data[key], kind):
        raise UsageError(where, f"key {key!r} has the wrong type ({type(data[key]).__name__})")
    return data[key]


def _head_entries(data: dict, where: str) -> list[tuple[str, int, int, str]]:
    """[(model label, h_qk, h_v, skip reason)] from [[heads]] tables (with optional tp lists)."""
    out = []
    heads = _require(data, "heads", where, list)
    for i, h in enumerate(heads):
        w = f"{where}: heads[{i}]"
        if not isinstance(h, dict):
            raise UsageError(w, "must be a table with h_qk, h_v and optionally model, tp")
        h_qk, h_v = _require(h, "h_qk", w, int), _require(h, "h_v", w, int)
        model = str(h.get("model", f"h{h_qk}/{h_v}"))
        tps = h.get("tp")
        if tps is None:
            out.append((model, h_qk, h_v, ""))
            continue
        if not isinstance(tps, list) or not all(isinstance(t, int) and t >= 1 for t in tps):
            raise UsageError(w, "tp must be a list of positive integers", "e.g. tp = [8, 4, 2, 1]")
        for tp in tps:
            label = f"{model} TP{tp}"
            if h_qk % tp or h_v % tp:
                out.append((label, h_qk, h_v, f"{h_qk}/{h_v} heads do not divide by TP{tp}"))
            else:
                out.append((label, h_qk // tp, h_v // tp, ""))
    return out


def _mixes(data: dict, where: str) -> list[tuple[str, tuple[int, ...]]]:
    mixes: list[tuple[str, tuple[int, ...]]] = []
    for s in data.get("seqlens", []):
        lens = parse_seqlens(str(s))
        mixes.append((str(s).strip(), lens))  # keep the label as the sweep writes it
    splits = data.get("splits")
    if splits is not None:
        w = f"{where}: splits"
        totals = _require(splits, "totals", w, list)
        counts = _require(splits, "counts", w, list)
        seed = int(splits.get("seed", 0))
        for total in totals:
            for n in counts:
                mixes.append((_split_label(total, n), random_split(int(total), int(n), seed)))
    if not mixes:
        raise UsageError(where, "defines no sequence mixes", "a 'seqlens' list and/or a [splits] table")
    return mixes


def parse_sweep(data: dict, name: str, source: str = "") -> Sweep:
    where = f"sweep {name!r}"
    mode = data.get("mode", "fwd")
    if mode not in MODES:
        raise UsageError(where, f"unknown mode {mode!r}", ", ".join(MODES))
    recipe = InputRecipe(
        gate=str(data.get("gate", "flashqla")),
        zero_gate_frac=float(data.get("zero_gate_frac", 0.25)),
        dtype=str(data.get("dtype", "bfloat16")),
    )
    k, v = int(data.get("k", 128)), int(data.get("v", 128))
    sweep = Sweep(
        name=str(data.get("name", name)), mode=mode, description=str(data.get("description", "")), source=source
    )
    mixes = _mixes(data, where)
    for model, h_qk, h_v, skip in _head_entries(data, where):
        for label, lens in mixes:
            if skip:
                sweep.points.append(SweepPoint(model, label, lens, None, skip, h_qk, h_v))
                continue
            try:
                heads = HeadConfig(h_qk, h_v, model)
            except UsageError as exc:
                sweep.points.append(SweepPoint(model, label, lens, None, str(exc), h_qk, h_v))
                continue
            wl = Workload(heads, lens, k, v, recipe, model=model, label=label)
            sweep.points.append(SweepPoint(model, label, lens, wl, "", h_qk, h_v))
    return sweep


def load_sweep(name_or_path: str) -> Sweep:
    """A sweep by name (sweeps/<name>.toml) or by path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix != ".toml" or not p.is_file():
        found = available_sweeps()
        if name_or_path not in found:
            raise UsageError("--sweep", f"unknown sweep {name_or_path!r}", ", ".join(found) or "none found")
        p = found[name_or_path]
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError("--sweep", f"{p} is not valid TOML: {exc}") from None
    return parse_sweep(data, p.stem, str(p))


def override_sweep(
    sweep: Sweep, heads: str | None = None, seqlens: str | None = None, mode: str | None = None
) -> Sweep:
    """Replace a sweep's head configs and/or sequence mixes with CLI lists ('16/32,2/8', '1x32768,8192x4')."""
    if heads is None and seqlens is None and mode is None:
        return sweep
    base = sweep.workloads[0] if sweep.workloads else None
    recipe = base.recipe if base else InputRecipe()
    k, v = (base.k, base.v) if base else (128, 128)
    if heads is not None:
        head_list = [parse_heads(h) for h in heads.split(",") if h.strip()]
        if not head_list:
            raise UsageError("--heads", "empty list", "H_QK/H_V[,H_QK/H_V...]")
        # keep the sweep's model label (e.g. '397B/122B TP8') for heads it already names
        names = {(p.h_qk, p.h_v): p.model for p in reversed(sweep.points)}
        head_items = [(names.get((h.h_qk, h.h_v), h.label), h.h_qk, h.h_v) for h in head_list]
    else:
        seen: dict[str, tuple[str, int, int]] = {}
        for p in sweep.points:
            seen.setdefault(p.model, (p.model, p.h_qk, p.h_v))
        head_items = list(seen.values())
    if seqlens is not None:
        mixes = [(seqlens_label(lens), lens) for lens in (parse_seqlens(s) for s in seqlens.split(",") if s.strip())]
        if not mixes:
            raise UsageError("--seqlens", "empty list", "e.g. 1x32768,8192x4,28672+4096")
    else:
        mixes = list(dict.fromkeys((p.label, p.seqlens) for p in sweep.points))
    out = Sweep(name=sweep.name, mode=mode or sweep.mode, description=sweep.description, source=sweep.source)
    for model, h_qk, h_v in head_items:
        for label, lens in mixes:
            heads_cfg = HeadConfig(h_qk, h_v, model)
            out.points.append(
                SweepPoint(
                    model, label, lens, Workload(heads_cfg, lens, k, v, recipe, model=model, label=label), "", h_qk, h_v
                )
            )
    return out
