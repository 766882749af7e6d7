"""A backend session: set up one workload (inputs, reference, numerics, first call), then time it.

The same object runs in-process or inside an isolated worker process (qla_bench.worker), so the
runner drives both the same way and can interleave backends per config in rounds.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field

import torch

from .backends import BWD_OUTPUTS, get_backend
from .backends.base import Prepared
from .inputs import make_inputs
from .numerics import compare_outputs, get_tolerance
from .reference import chunk_gated_delta_rule_ref, chunk_gated_delta_rule_ref_grads
from .rows import Status
from .timing import L2Flusher, time_callable
from .workload import Workload


@dataclass
class SetupResult:
    """Outcome of the untimed part: support check, first call (compile/autotune) and numerics."""

    status: str
    reason: str = ""
    rel_l2: dict[str, float] = field(default_factory=dict)
    max_abs: dict[str, float] = field(default_factory=dict)
    nonfinite: dict[str, int] = field(default_factory=dict)
    first_call_ms: float | None = None
    versions: dict[str, str] = field(default_factory=dict)
    env_flags: dict[str, str] = field(default_factory=dict)
    worst_seed: dict[str, int] = field(default_factory=dict)  # per output: the seed its rel_l2 came from


def _worse(err: float, than: float) -> bool:
    """err is a worse error than `than`: larger, and a NaN is worse than any number (it must not hide)."""
    return not math.isnan(than) and (math.isnan(err) or err > than)


def worst_of_seeds(results: list[SetupResult], seeds: list[int] | None = None) -> SetupResult:
    """One check's outcome from several seeds' (in seed order): the first failing seed's status and reason,
    else PASSED; per output the largest error and the summed non-finite count over the seeds, so a row
    (and the report's comparison with another library's row) reflects the worst input seen, and which seed
    (of seeds, default 0, 1, ...) gave each output's largest rel-L2, so that input can be rebuilt; the first
    call's time is seed 0's (the one that compiled)."""
    if not results:
        raise ValueError("results must hold at least one seed's check")
    seeds = list(range(len(results))) if seeds is None else list(seeds)
    if len(seeds) != len(results):
        raise ValueError(f"seeds must hold one seed per result ({len(results)}), got {len(seeds)}")
    failed = next((r for r in results if r.status != Status.PASSED.value), None)
    first = results[0]
    merged = SetupResult(
        status=(failed or first).status,
        reason=(failed or first).reason,
        first_call_ms=first.first_call_ms,
        versions=first.versions,
        env_flags=first.env_flags,
    )
    for seed, r in zip(seeds, results):
        for name, err in r.rel_l2.items():
            if name not in merged.rel_l2 or _worse(err, merged.rel_l2[name]):
                merged.rel_l2[name] = err
                merged.worst_seed[name] = seed
        for name, err in r.max_abs.items():
            merged.max_abs[name] = max(err, merged.max_abs.get(name, err))
        for name, count in r.nonfinite.items():
            merged.nonfinite[name] = merged.nonfinite.get(name, 0) + count
    return merged


class _ReferenceCache:
    """Keeps the float64 reference of the last workload (backends of one config share it)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.value: dict[str, torch.Tensor] | None = None

    def get(self, wl: Workload, mode: str, seed: int, inputs) -> dict[str, torch.Tensor]:
        key = (wl.key(), mode, seed, str(inputs.device))
        if key != self.key:
            self.value = None  # free the previous one first
            self.value = reference_outputs(inputs, mode)
            self.key = key
        assert self.value is not None
        return self.value


def reference_outputs(x, mode: str) -> dict[str, torch.Tensor]:
    """Float64 reference of the canonical outputs for a mode, computed on the inputs' device."""
    if mode == "fwd":
        o, ht = chunk_gated_delta_rule_ref(x.q, x.k, x.v, x.g, x.beta, x.scale, x.h0, True, x.cu_seqlens)
        return {"o": o, "final_state": ht}
    grads = chunk_gated_delta_rule_ref_grads(x.q, x.k, x.v, x.g, x.beta, x.do, x.dht, x.scale, x.h0, x.cu_seqlens)
    return {n: grads[n] for n in BWD_OUTPUTS}


def classify_exception(exc: BaseException) -> tuple[Status, str]:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return Status.OOM, text
    return Status.ERROR, text


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BackendSession:
    """One backend in one process. setup() per workload, then sample() as often as the runner asks."""

    def __init__(self, backend: str, device: str = "auto", tolerance: str = "bf16", cold_l2: bool = True) -> None:
        self.backend = get_backend(backend)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tolerance = get_tolerance(tolerance)
        self.cold_l2 = cold_l2
        self.prepared: Prepared | None = None
        self._refs = _ReferenceCache()
        self._flusher: L2Flusher | None = None

    def availability(self) -> str | None:
        try:
            return self.backend.available()
        except Exception as exc:  # a library that explodes on import is unavailable, not fatal
            return f"{type(exc).__name__}: {exc}"

    def warm(self) -> str | None:
        """Import the library and create the device context ahead of the first config; availability()."""
        why = self.availability()
        if self.device.type == "cuda":
            torch.empty(1, device=self.device)
        return why

    def setup(self, wl: Workload, mode: str, seed: int, check_seeds: int = 1) -> SetupResult:
        self.prepared = None
        base = {"versions": self.backend.versions(), "env_flags": self.backend.env_flags()}
        why = self.availability()
        if why:
            return SetupResult(Status.UNSUPPORTED.value, f"unavailable: {why}", **base)
        why = self.backend.supports(wl, mode, self.device)
        if why:
            return SetupResult(Status.UNSUPPORTED.value, why, **base)
        try:
            results = []
            for i in range(check_seeds):  # several seeds: a kernel must be right on any valid input
                results.append(self._check_one(wl, mode, seed + i, keep=(i == 0), base=base))
                if results[-1].status != Status.PASSED.value:
                    break
            result = worst_of_seeds(results, [seed + i for i in range(len(results))])
            if result.status != Status.PASSED.value:
                self.prepared = None
            return result
        except Exception as exc:
            self.prepared = None
            status, reason = classify_exception(exc)
            if status == Status.ERROR:
                reason += " | " + traceback.format_exc().strip().splitlines()[-1][:200]
            _free(self.device)
            return SetupResult(status.value, reason, **base)

    def _check_one(self, wl: Workload, mode: str, seed: int, keep: bool, base: dict) -> SetupResult:
        inputs = make_inputs(wl, self.device, seed, with_grads=(mode != "fwd"))
        ref = self._refs.get(wl, mode, seed, inputs)
        prepared = self.backend.prepare(inputs, mode)
        _sync(self.device)
        t0 = time.perf_counter()
        raw = prepared.run()
        _sync(self.device)
        first_ms = (time.perf_counter() - t0) * 1e3
        cmp = compare_outputs(prepared.outputs(raw), ref, self.tolerance)
        if keep:
            self.prepared = prepared
        return SetupResult(
            cmp.status.value, cmp.reason, cmp.rel_l2, cmp.max_abs, cmp.nonfinite, first_ms if keep else None, **base
        )

    def sample(self, timer: str, reps: int) -> tuple[list[float], list[float]]:
        """(the timer's per-call samples, the host's own time in each call; empty for cuda-graph), in ms."""
        if self.prepared is None:
            raise RuntimeError("sample() before a passing setup()")
        flusher = self._cold_flusher()
        fn = self.prepared.run
        if timer == "cuda-graph" and not self.prepared.graph_safe:
            raise RuntimeError(f"{self.backend.name} is not CUDA-graph capturable")
        result = time_callable(fn, timer, reps, self.device, flusher)
        return result.samples_ms, result.host_ms

    def kernels(self, calls: int, warmup: int = 3, profiler: str = "torch") -> list[dict]:
        """Per kernel of one call of the prepared backend: launches and device us (kernel_profile), with the
        L2 flushed between calls when the session runs cold. profiler "ncu-range" instead runs the calls inside
        a CUDA profiler range for Nsight Compute outside the process to record, and returns no rows."""
        if self.prepared is None:
            raise RuntimeError("kernels() before a passing setup()")
        if self.device.type != "cuda":
            raise RuntimeError("kernel profiles need a CUDA device (torch.profiler's CUDA activities)")
        from .kernel_profile import PROFILERS, profile_calls, run_in_profiler_range

        if profiler not in PROFILERS:
            raise ValueError(f"profiler must be one of {', '.join(PROFILERS)}, got {profiler!r}")
        if profiler == "ncu-range":
            run_in_profiler_range(self.prepared.run, calls, self._cold_flusher(), warmup)
            return []
        return [k.as_dict() for k in profile_calls(self.prepared.run, calls, self._cold_flusher(), warmup)]

    def _cold_flusher(self) -> L2Flusher | None:
        """The L2 flush to run between timed or profiled calls (one buffer per session), or None: warm L2 or
        no GPU."""
        if self.device.type != "cuda" or not self.cold_l2:
            return None
        if self._flusher is None:
            self._flusher = L2Flusher(self.device)
        return self._flusher

    def teardown(self) -> None:
        self.prepared = None
        _free(self.device)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
