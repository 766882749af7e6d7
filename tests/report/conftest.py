"""Hand-built rows for the report tests (no GPU, no backends: reports read rows only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qla_bench.report.anchors import repo_root
from qla_bench.rows import Row
from qla_bench.workload import seqlens_label

VERSIONS = {"torch": "2.11.0+cu130", "fla-core": "0.6.0", "flash-qla": "0.1.3", "tilelang": "0.1.15"}


def make_row(
    backend: str,
    seqlens: tuple[int, ...] | list[int],
    ms: float | None,
    *,
    mode: str = "fwd",
    h_qk: int = 2,
    h_v: int = 8,
    model: str = "397B/122B TP8",
    status: str = "PASSED",
    timer: str = "cuda-graph",
    **extra,
) -> Row:
    """A row as the sweep writes it: timing fields only when PASSED."""
    passed = status == "PASSED"
    fields = {
        "backend": backend,
        "mode": mode,
        "h_qk": h_qk,
        "h_v": h_v,
        "k": 128,
        "v": 128,
        "seqlens": list(seqlens),
        "label": seqlens_label(tuple(seqlens)),
        "model": model,
        "status": status,
        "median_ms": ms if passed else None,
        "samples_ms": [ms] * 20 if passed and ms else [],
        "timer": timer if passed else "",
        "l2": "cold" if passed else "",
        "gpu": "NVIDIA H200",
        "versions": dict(VERSIONS),
        "env_flags": {"FLA_FLASH_QLA": "0"},
        "git_sha": "0123abc",
    }
    fields.update(extra)
    return Row(**fields)


@pytest.fixture
def rows() -> list[Row]:
    """Two head configs x two mixes x three backends, one UNSUPPORTED cell, one backward group."""
    out = []
    lat = {"qla": 1.0, "flashqla": 1.25, "fla": 3.0}
    for model, h_qk, h_v in (("397B/122B TP8", 2, 8), ("Sym h32", 32, 32)):
        for mix, scale in (((32768,), 0.3), ((8192, 8192, 8192, 8192), 0.2)):
            for backend, factor in lat.items():
                status = "UNSUPPORTED" if (backend == "fla" and h_qk == 32 and len(mix) == 4) else "PASSED"
                out.append(
                    make_row(
                        backend,
                        mix,
                        scale * factor * h_qk,
                        h_qk=h_qk,
                        h_v=h_v,
                        model=model,
                        status=status,
                        reason="not on this GPU" if status != "PASSED" else "",
                        rel_l2={"o": 0.002 * factor, "final_state": 0.001 * factor},
                    )
                )
    for backend, ms in (("flashqla", 0.8), ("fla", 1.6)):
        out.append(make_row(backend, (3000, 5192), ms, mode="bwd", h_qk=16, h_v=32, model=""))
    return out


def anchors_file(gpu: str = "H200") -> Path:
    """FlashQLA's published table: /work/shared/anchors here, ../shared/anchors next to the repo in CI."""
    name = f"flashqla_benchmark_results_{gpu}.txt"
    for folder in (repo_root().parent / "shared" / "anchors", Path("/work/shared/anchors")):
        if (folder / name).is_file():
            return folder / name
    pytest.skip(f"{name} not found next to the repo (../shared/anchors) or in /work/shared/anchors")


@pytest.fixture
def h200_anchors() -> Path:
    return anchors_file("H200")


@pytest.fixture
def published():
    """anchors_file as a fixture: published('GB200') -> path, or skip."""
    return anchors_file


@pytest.fixture
def row():
    """The make_row factory, for tests that build their own rows."""
    return make_row
