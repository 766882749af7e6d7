"""FLOP and byte model of GDN prefill (design/gdn.md) and the roofline floor of a workload.

Forward: ~10.5 MFLOP per (64-token chunk, value head); bytes = q, k, v, g, beta, h0 read once plus o and
the final state written once. Backward: ~3.2x the forward FLOPs (a state recompute pass plus ~19 GEMMs
per chunk-head, design/gdn.md); bytes = the forward's inputs plus do, dht, g_cumsum and A0 read, and
dq, dk, dv, dg, dbeta, dh0 written. Train = forward + backward. Ceilings come from `qla-bench env
--calibrate` on the device (a device-to-device copy and a large bf16 matmul), never from datasheets.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .workload import Workload

FWD_FLOP_PER_CHUNK_HEAD = 10.5e6
BWD_FLOP_FACTOR = 3.2


@dataclass(frozen=True)
class Ceilings:
    """Measured device ceilings."""

    matmul_tflops: float
    copy_gbps: float
    gpu: str = ""
    measured_at: str = ""

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | Path) -> Ceilings | None:
        p = Path(path)
        if not p.is_file():
            return None
        return cls(**json.loads(p.read_text(encoding="utf-8")))


def flops(wl: Workload, mode: str) -> float:
    fwd = FWD_FLOP_PER_CHUNK_HEAD * wl.n_chunks * wl.heads.h_v * (wl.k * wl.v) / (128 * 128)
    if mode == "fwd":
        return fwd
    if mode == "bwd":
        return BWD_FLOP_FACTOR * fwd
    return (1 + BWD_FLOP_FACTOR) * fwd


def bytes_moved(wl: Workload, mode: str, elem: int = 2) -> float:
    t, hq, hv, k, v, n = wl.total_tokens, wl.heads.h_qk, wl.heads.h_v, wl.k, wl.v, wl.n_seqs
    qk = 2 * t * hq * k * elem
    vv = t * hv * v * elem
    gates = 2 * t * hv * 4
    state = n * hv * k * v * 4
    fwd = qk + vv + gates + state + vv + state  # inputs read, o and final state written
    if mode == "fwd":
        return fwd
    a0 = t * hv * 64 * elem + t * hv * 4  # A0 and g_cumsum
    bwd = (qk + vv + gates + state) + vv + state + a0 + (qk + vv + gates + state)  # in, do, dht, saved, grads
    return bwd if mode == "bwd" else fwd + bwd


def floor_ms(wl: Workload, mode: str, c: Ceilings) -> float:
    return max(flops(wl, mode) / (c.matmul_tflops * 1e12), bytes_moved(wl, mode) / (c.copy_gbps * 1e9)) * 1e3


def derived(wl: Workload, mode: str, median_ms: float, c: Ceilings | None) -> dict[str, float | None]:
    """TFLOP/s and GB/s achieved, and the floor over the measured time in % (None without ceilings)."""
    s = median_ms / 1e3
    out: dict[str, float | None] = {
        "tflops": flops(wl, mode) / s / 1e12,
        "gbps": bytes_moved(wl, mode) / s / 1e9,
        "pct_roofline": None,
    }
    if c is not None:
        out["pct_roofline"] = 100.0 * floor_ms(wl, mode, c) / median_ms
    return out
