"""Measure the device ceilings the roofline uses: copy bandwidth and bf16 matmul rate (random data)."""

from __future__ import annotations

import datetime as _dt
import statistics

import torch

from .roofline import Ceilings


def _median_event_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _copy_ms(copy_bytes: int, reps: int) -> float:
    src = torch.randint(0, 1 << 30, (copy_bytes // 4,), dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    return _median_event_ms(lambda: dst.copy_(src), reps)


def measure_ceilings(gpu: str, copy_bytes: int = 4 << 30, n: int = 8192, reps: int = 10) -> Ceilings:
    """Device-to-device copy (bytes read + written) and an n^3 bf16 matmul on random data; medians."""
    if not torch.cuda.is_available():
        raise RuntimeError("calibration needs a CUDA device")
    copy_ms = _copy_ms(copy_bytes, reps)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm_ms = _median_event_ms(lambda: a @ b, reps)
    return Ceilings(
        matmul_tflops=2 * n**3 / (mm_ms / 1e3) / 1e12,
        copy_gbps=2 * copy_bytes / (copy_ms / 1e3) / 1e9,
        gpu=gpu,
        measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
