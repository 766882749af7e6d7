"""A fake backend whose latencies are drawn from a seeded distribution, and row-file helpers.

Named gate_fakes (not a generic name) so it can't clash with helpers of other test folders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from qla_bench.rows import Row, Status
from qla_bench.workload import seqlens_label

# (backend, h_qk, h_v, seqlens, typical median ms): 2 backends x 4 workloads, like a small `ci` sweep
CONFIGS = [
    (backend, h_qk, h_v, seqlens, ms * (2.9 if backend == "fla" else 1.0))
    for backend in ("flashqla", "fla")
    for (h_qk, h_v, seqlens, ms) in [
        (2, 8, (32768,), 0.320),
        (16, 64, (4096,), 0.215),
        (16, 32, (8192, 8192, 8192, 8192), 0.632),
        (2, 8, (28672, 4096), 0.316),
    ]
]


def make_row(backend: str, h_qk: int, h_v: int, seqlens: tuple[int, ...], samples: list[float], **kw) -> Row:
    """A PASSED fwd row timed by qla-bench on an H200, with summary fields filled from the samples."""
    row = Row(
        backend=backend,
        mode="fwd",
        h_qk=h_qk,
        h_v=h_v,
        k=128,
        v=128,
        seqlens=list(seqlens),
        label=seqlens_label(tuple(seqlens)),
        status=Status.PASSED.value,
        timer="cuda-events",
        l2="cold",
        gpu="H200",
        run_id="fake",
        sweep="ci",
    )
    if samples:
        q1, med, q3 = np.quantile(samples, [0.25, 0.5, 0.75])
        row.samples_ms = [float(x) for x in samples]
        row.median_ms, row.q1_ms, row.q3_ms = float(med), float(q1), float(q3)
        row.min_ms, row.mean_ms = float(min(samples)), float(np.mean(samples))
    return replace(row, **kw)


@dataclass
class FakeBackend:
    """Latencies drawn from median * lognormal(0, noise), seeded; `slowdown` scales named rows."""

    noise: float = 0.01
    n_samples: int = 30
    gpu: str = "H200"
    slowdown: dict[str, float] = field(default_factory=dict)  # row name -> factor, e.g. 1.10
    outlier_rate: float = 0.0  # fraction of samples hit by a +30 % spike (a preempted launch)

    def run(self, seed: int) -> list[Row]:
        rng = np.random.default_rng(seed)
        rows = []
        for backend, h_qk, h_v, seqlens, ms in CONFIGS:
            name = f"{backend} fwd h{h_qk}/{h_v} {seqlens_label(seqlens)}"
            scale = ms * self.slowdown.get(name, 1.0)
            x = scale * rng.lognormal(0.0, self.noise, self.n_samples)
            if self.outlier_rate:
                x = np.where(rng.random(self.n_samples) < self.outlier_rate, x * 1.3, x)
            rows.append(make_row(backend, h_qk, h_v, seqlens, list(x), gpu=self.gpu))
        return rows


def write_rows(path: Path, rows: list[Row]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return path


SLOW_ROW = "fla fwd h16/64 1x4096"


def spread(median: float, rel: float, n: int = 12) -> list[float]:
    """n evenly spread samples around `median`, +-rel relative (deterministic, no RNG)."""
    return [float(x) for x in median * (1 + np.linspace(-rel, rel, n))]


def golden_runs() -> tuple[list[Row], list[Row], list[Row]]:
    """Baseline, candidate and a third run that between them hit every verdict (no randomness)."""
    unsupported = {"status": "UNSUPPORTED", "reason": "needs SM90+"}
    base = [
        make_row("flashqla", 2, 8, (32768,), spread(0.320, 0.01)),
        make_row("fla", 16, 64, (4096,), spread(0.825, 0.01)),
        make_row("fla", 2, 8, (32768,), spread(0.921, 0.01)),
        make_row("flashqla", 16, 64, (4096,), spread(0.215, 0.2)),
        make_row("flashqla", 16, 32, (8192,) * 4, spread(0.632, 0.01)),
        make_row("fla", 16, 32, (8192,) * 4, spread(1.952, 0.01)),
        make_row("flashinfer", 2, 8, (28672, 4096), [], **unsupported),
    ]
    head = [
        make_row("flashqla", 2, 8, (32768,), spread(0.321, 0.01)),
        make_row("fla", 16, 64, (4096,), spread(0.908, 0.01)),
        make_row("fla", 2, 8, (32768,), spread(0.800, 0.01)),
        make_row("flashqla", 16, 64, (4096,), spread(0.236, 0.2)),
        make_row("flashqla", 16, 32, (8192,) * 4, [], status="INCORRECT", reason="rel L2 of o 0.31 > 0.02"),
        make_row("flashinfer", 2, 8, (28672, 4096), [], **unsupported),
        make_row("flashqla", 2, 8, (32768,), spread(0.700, 0.01), mode="bwd"),
    ]
    third = [replace(r, samples_ms=[x * 0.97 for x in r.samples_ms]) for r in base[:4]]
    return base, head, third
