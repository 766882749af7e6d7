"""The result row: the hub every printer, plot and the gate read (schema first, versioned).

One row per (config, backend, mode). Rows are appended to a JSON Lines file as soon as they finish,
so an interrupted sweep loses nothing and can resume. Nothing here imports torch or a backend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path

from .errors import UsageError

SCHEMA_VERSION = 1
_SIDE_FOLDERS = {"baseline", "numerics", "noise"}


class Status(str, Enum):
    PASSED = "PASSED"
    INCORRECT = "INCORRECT"
    UNSUPPORTED = "UNSUPPORTED"
    ERROR = "ERROR"
    OOM = "OOM"
    TIMEOUT = "TIMEOUT"
    SKIPPED = "SKIPPED"


@dataclass
class Row:
    """One measured (workload, backend, mode). Timing fields stay empty unless status is PASSED."""

    # workload key
    backend: str
    mode: str  # fwd | bwd | train
    h_qk: int
    h_v: int
    k: int
    v: int
    seqlens: list[int]
    label: str  # sequence-mix label, e.g. '1x32768', '28672+4096'
    model: str = ""  # head-config label, e.g. '397B/122B TP8'
    dtype: str = "bfloat16"
    gate: str = "flashqla"
    zero_gate_frac: float = 0.25
    seed: int = 0
    check_seeds: int = 1  # seeds seed.. the numerics ran on; rel_l2 / max_abs are the worst over them
    sweep: str = ""
    # outcome
    status: str = Status.SKIPPED.value
    reason: str = ""
    # numerics, per output tensor name (o, final_state, dq, dk, dv, dg, dbeta, dh0)
    rel_l2: dict[str, float] = field(default_factory=dict)
    max_abs: dict[str, float] = field(default_factory=dict)
    nonfinite: dict[str, int] = field(default_factory=dict)
    # per output, the input seed whose rel_l2 the row reports (seed .. seed + check_seeds - 1)
    worst_seed: dict[str, int] = field(default_factory=dict)
    tolerance: float | None = None
    # timing
    timer: str = ""  # cuda-events | cuda-graph | cpu-wall
    l2: str = ""  # cold | warm | n/a
    median_ms: float | None = None
    min_ms: float | None = None
    mean_ms: float | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    samples_ms: list[float] = field(default_factory=list)
    # the median host time of the library call itself over the timed calls (cuda-events and cpu-wall rows; None
    # for cuda-graph and rows written before it was recorded). On a cuda-events row, a value near or above
    # median_ms says the GPU waited for the host: the row measures the library's host path, not its kernels.
    host_median_ms: float | None = None
    first_call_ms: float | None = None  # includes JIT / autotune / compile
    # derived
    tflops: float | None = None
    gbps: float | None = None
    pct_roofline: float | None = None
    # device health around the measurement
    health: dict[str, object] = field(default_factory=dict)
    throttled: bool = False
    # provenance
    gpu: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    env_flags: dict[str, str] = field(default_factory=dict)
    git_sha: str = ""
    run_id: str = ""
    timestamp: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED.value

    def config_key(self) -> tuple:
        """Identity of a row for resume and gating: same GPU, backend, mode, timer and workload."""
        return (
            self.gpu,
            self.backend,
            self.mode,
            self.timer,
            self.h_qk,
            self.h_v,
            self.k,
            self.v,
            tuple(self.seqlens),
            self.dtype,
            self.gate,
            round(float(self.zero_gate_frac), 6),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Row:
        known = {f.name for f in fields(cls)}
        missing = [n for n in ("backend", "mode", "h_qk", "h_v", "k", "v", "seqlens", "label") if n not in data]
        if missing:
            raise UsageError("results", f"row lacks required fields {missing}")
        row = cls(**{k: v for k, v in data.items() if k in known})
        row.seqlens = [int(x) for x in row.seqlens]
        return row


def append_row(path: str | os.PathLike, row: Row) -> None:
    """Append one row and flush it to disk at once (a crash later loses nothing)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row.to_dict(), sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def iter_rows(path: str | os.PathLike) -> Iterator[Row]:
    p = Path(path)
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield Row.from_dict(json.loads(line))
            except json.JSONDecodeError as exc:
                # a torn last line from a crash is expected; anything earlier is corruption
                raise UsageError("results", f"{p}:{lineno}: not valid JSON ({exc.msg})") from None


def results_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files and folders into the .jsonl files they hold (folders recursively)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            # a stored baseline, numerics-only checks and noise runs inside a results folder are not part of
            # that folder's sweep rows; name those subfolders explicitly to load them
            out.extend(sorted(q for q in p.rglob("*.jsonl") if not set(q.relative_to(p).parts[:-1]) & _SIDE_FOLDERS))
        elif p.is_file():
            out.append(p)
        else:
            raise UsageError("results", f"{p} does not exist", "a .jsonl file or a folder holding them")
    if not out:
        raise UsageError("results", f"no .jsonl results found in {[str(p) for p in paths]}")
    return out


def load_rows(paths: Iterable[str | os.PathLike]) -> list[Row]:
    """Load rows from files/folders; a later row with the same key replaces an earlier one."""
    latest: dict[tuple, Row] = {}
    for f in results_files(paths):
        for row in iter_rows(f):
            latest[row.config_key()] = row
    return list(latest.values())


def rows_to_frame(rows: Iterable[Row]):
    """Flatten rows into a pandas DataFrame (per-output metrics become columns like rel_l2.o)."""
    import pandas as pd

    records = []
    for r in rows:
        d = r.to_dict()
        for group in ("rel_l2", "max_abs", "nonfinite", "worst_seed"):
            for name, val in d.pop(group).items():
                d[f"{group}.{name}"] = val
        d["seqlens"] = "+".join(str(x) for x in r.seqlens)
        d["versions"] = json.dumps(r.versions, sort_keys=True)
        d["env_flags"] = json.dumps(r.env_flags, sort_keys=True)
        d["health"] = json.dumps(r.health, sort_keys=True)
        d["samples_ms"] = json.dumps(r.samples_ms)
        records.append(d)
    return pd.DataFrame.from_records(records)


def export_rows(rows: list[Row], path: str | os.PathLike) -> Path:
    """Write rows as CSV or Parquet, by the file's suffix."""
    p = Path(path)
    df = rows_to_frame(rows)
    if p.suffix == ".csv":
        df.to_csv(p, index=False)
    elif p.suffix == ".parquet":
        df.to_parquet(p, index=False)
    else:
        raise UsageError("--export", f"unknown format {p.suffix!r}", ".csv, .parquet")
    return p
