"""Where one call's GPU time goes: every kernel a backend launches, its launches and device time per call.

The sweep times a whole call; this answers the question a kernel engineer asks next (is a library's lead in
its inverse, its recurrence, its context-parallel passes?). torch.profiler (CUPTI) records the device
activities of `steps` calls after a warm-up; they are grouped by kernel name and divided by `steps`.

With a cold L2 the flush kernel runs between the calls as the timers run it; it is profiled alone first and
its launches and time are taken off the kernels of the same name, so only the backend's own work remains.
A development reading, not a claim: the timers (timing.py) give the numbers results/ holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch

# a profiled activity: (kernel or memory operation name, device time in microseconds)
Activity = tuple[str, float]
NAME_WIDTH = 120  # C++ template names run to thousands of characters: keep their head


@dataclass(frozen=True)
class KernelTime:
    """One kernel (by name) per profiled call: launches, device microseconds, share of the call's GPU time."""

    name: str
    launches_per_call: float
    us_per_call: float
    share: float

    def as_dict(self) -> dict:
        return asdict(self)


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """The kernel's name cut to `width` characters (template arguments are where names differ least)."""
    name = " ".join(name.split())
    return name if len(name) <= width else name[: width - 3] + "..."


def totals(activities: Iterable[Activity]) -> dict[str, tuple[int, float]]:
    """name -> (launches, summed device us)."""
    out: dict[str, tuple[int, float]] = {}
    for name, us in activities:
        key = short_name(name)
        n, t = out.get(key, (0, 0.0))
        out[key] = (n + 1, t + float(us))
    return out


def subtract(total: dict[str, tuple[int, float]], other: dict[str, tuple[int, float]]) -> dict[str, tuple[int, float]]:
    """total less other's launches and time per name (the flush kernel's); a name left with no launch goes."""
    out = {}
    for name, (n, t) in total.items():
        m, u = other.get(name, (0, 0.0))
        if n - m > 0:
            out[name] = (n - m, max(t - u, 0.0))
    return out


def per_call(total: dict[str, tuple[int, float]], calls: int) -> list[KernelTime]:
    """KernelTime rows per call, longest first."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    busy = sum(t for _, t in total.values())
    rows = [
        KernelTime(name, round(n / calls, 3), round(t / calls, 3), round(t / busy, 4) if busy else 0.0)
        for name, (n, t) in total.items()
    ]
    return sorted(rows, key=lambda r: -r.us_per_call)


PROFILERS = ("torch", "ncu-range")  # who records the kernels: torch.profiler here, or Nsight Compute around us


def run_in_profiler_range(
    fn: Callable[[], object],
    calls: int,
    flush: Callable[[], object] | None = None,
    warmup: int = 3,
    start: Callable[[], object] | None = None,
    stop: Callable[[], object] | None = None,
) -> None:
    """`warmup` plain calls (compiles, autotunes, caches), then `calls` calls between cudaProfilerStart and
    cudaProfilerStop, the flush before each: what `ncu --profile-from-start off` records, so a library's
    kernels are profiled warm and alone (ncu's own -k/-c pick which). start/stop are stand-ins in tests."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    if start is None or stop is None:
        cudart = torch.cuda.cudart()
        start, stop = cudart.cudaProfilerStart, cudart.cudaProfilerStop
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()  # nothing of the warm-up may fall inside the range
    start()
    for _ in range(calls):
        if flush is not None:
            flush()
        fn()
    sync()
    stop()


def cuda_activities(
    fn: Callable[[], object], calls: int, between: Callable[[], object] | None = None
) -> list[Activity]:
    """Device activities (kernels, memcpy, memset) of `calls` calls of fn, `between` run before each."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if between is not None:
                between()
            fn()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]


def profile_calls(
    fn: Callable[[], object],
    calls: int,
    flush: Callable[[], object] | None = None,
    warmup: int = 3,
    collect: Callable[..., list[Activity]] = cuda_activities,
) -> list[KernelTime]:
    """Kernel rows per call of fn over `calls` profiled calls after `warmup` plain ones; with flush (a cold
    L2), the flush's own activities, profiled alone over as many calls, are taken off. collect is the
    profiler (a stand-in in the CPU tests)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    for _ in range(warmup):
        fn()
    total = totals(collect(fn, calls, flush))
    if flush is not None:
        total = subtract(total, totals(collect(flush, calls)))
    return per_call(total, calls)
