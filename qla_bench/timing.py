"""Timers. Each takes a callable and returns per-call samples in ms; nothing library-specific.

- cuda-events: CUDA events around each call; before every call the L2 is overwritten (cold L2) by
  writing a buffer of max(256 MB, 2 x L2) outside the timed region.
- cuda-graph: the callable is captured N times into one graph per replay batch; the L2 flush is
  captured between calls, and a flush-only graph is timed and subtracted (do_bench_cudagraph does not
  flush, so its numbers are warm-L2).
- cpu-wall: perf_counter around each call, for CPU runs; labelled as such in every row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

TIMERS = ("cuda-events", "cuda-graph", "cpu-wall")


@dataclass
class TimingResult:
    timer: str
    l2: str  # 'cold' | 'warm' | 'n/a'
    samples_ms: list[float]
    # per sample, the host's own time in the call (entry to return, no synchronisation): where it reaches the
    # cuda-events sample the GPU waited for the host, and the sample measures the host. Empty for cuda-graph
    # (a replay has no host work of the library's).
    host_ms: list[float] = field(default_factory=list)


class L2Flusher:
    """Overwrites a buffer larger than the L2 so each timed call starts with a cold cache."""

    def __init__(self, device: torch.device, min_bytes: int = 256 << 20) -> None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (60 << 20)
        nbytes = max(min_bytes, 2 * l2)
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def time_cpu_wall(fn: Callable[[], Any], reps: int, warmup: int = 1) -> TimingResult:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return TimingResult("cpu-wall", "n/a", out, host_ms=list(out))


def time_cuda_events(fn: Callable[[], Any], reps: int, flusher: L2Flusher | None, warmup: int = 3) -> TimingResult:
    """Median-ready per-call samples: one event pair per call, flush between calls, one sync at the end."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    host = [0.0] * reps
    for i in range(reps):
        if flusher is not None:
            flusher()
        starts[i].record()
        t0 = time.perf_counter()
        fn()
        host[i] = (time.perf_counter() - t0) * 1e3
        ends[i].record()
    torch.cuda.synchronize()
    return TimingResult("cuda-events", "cold" if flusher else "warm", [s.elapsed_time(e) for s, e in zip(starts, ends)],
                        host_ms=host)  # fmt: skip


def _capture(body: Callable[[], None], stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        body()
    return graph


def time_cuda_graph(
    fn: Callable[[], Any], reps: int, flusher: L2Flusher | None, calls_per_graph: int = 5, warmup: int = 3
) -> TimingResult:
    """`reps` samples from graph replays: each replay runs (flush, call) x calls_per_graph and gives one
    per-call sample; a graph of flushes alone is replayed alternately and its time subtracted, leaving the
    calls with a cold L2."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up on the capture stream too (allocator, lazy init)
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    def work() -> None:
        for _ in range(calls_per_graph):
            if flusher is not None:
                flusher()
            fn()

    def flush_only() -> None:
        for _ in range(calls_per_graph):
            if flusher is not None:
                flusher()

    g_work = _capture(work, stream)
    g_flush = _capture(flush_only, stream) if flusher is not None else None
    torch.cuda.synchronize()
    g_work.replay()
    if g_flush is not None:
        g_flush.replay()
    torch.cuda.synchronize()
    batches = max(1, reps)
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(batches)]
    for e in ev:
        e[0].record()
        g_work.replay()
        e[1].record()
        if g_flush is not None:
            e[2].record()
            g_flush.replay()
            e[3].record()
    torch.cuda.synchronize()
    out = []
    for e in ev:
        total = e[0].elapsed_time(e[1])
        flush = e[2].elapsed_time(e[3]) if g_flush is not None else 0.0
        out.append(max(total - flush, 0.0) / calls_per_graph)
    return TimingResult("cuda-graph", "cold" if flusher else "warm", out)


def time_callable(
    fn: Callable[[], Any], timer: str, reps: int, device: torch.device, flusher: L2Flusher | None = None
) -> TimingResult:
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {TIMERS}, got {timer!r}")
    if timer == "cpu-wall":
        return time_cpu_wall(fn, reps)
    if device.type != "cuda":
        raise ValueError(f"timer {timer!r} needs a CUDA device")
    if timer == "cuda-events":
        return time_cuda_events(fn, reps, flusher)
    return time_cuda_graph(fn, reps, flusher)
