"""Run a sweep: per config, set up every backend (numerics first), time the passing ones in
interleaved rounds, and append one row per (backend, timer) to the results file at once.

Terminal-free: the CLI passes callbacks for progress. Resume: points whose rows are already in the
results file are skipped.
"""

from __future__ import annotations

import datetime as _dt
import statistics
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .backends import get_backend
from .provenance import env_flags, git_sha, is_throttled, library_versions, read_health
from .roofline import Ceilings, derived
from .rows import Row, Status, append_row, iter_rows
from .session import BackendSession, SetupResult
from .stats import summarize
from .sweeps import Sweep, SweepPoint
from .worker import IsolatedSession, WorkerFailure
from .workload import HeadConfig, InputRecipe, Workload


@dataclass
class RunOptions:
    mode: str = "fwd"
    backends: list[str] = field(default_factory=lambda: ["torch"])
    timers: tuple[str, ...] = ("cpu-wall",)
    reps: int = 100
    rounds: int = 4
    tolerance: str = "bf16"
    isolate: bool = False
    timeout_s: float = 600.0
    cold_l2: bool = True
    gpu: str = "CPU"
    device: str = "auto"
    check_seeds: int = 1
    seed_base: int = 0
    sweep: str = ""
    numerics_only: bool = False
    ceilings: Ceilings | None = None


@dataclass
class Callbacks:
    """Hooks the CLI uses for progress; all optional."""

    point_started: Callable[[SweepPoint], None] = lambda p: None
    row_written: Callable[[Row], None] = lambda r: None
    backend_step: Callable[[str, str], None] = lambda backend, what: None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def open_sessions(opts: RunOptions) -> dict[str, BackendSession | IsolatedSession]:
    if opts.isolate:
        sessions = {
            b: IsolatedSession(b, opts.device, opts.tolerance, opts.cold_l2, opts.timeout_s) for b in opts.backends
        }
        for s in sessions.values():
            s.warm_up()  # all workers import their libraries at once
        return sessions
    return {b: BackendSession(b, opts.device, opts.tolerance, opts.cold_l2) for b in opts.backends}


def close_sessions(sessions: dict) -> None:
    isolated = [s for s in sessions.values() if isinstance(s, IsolatedSession)]
    for s in isolated:
        s.begin_close()  # all workers release their GPU contexts at once
    for s in isolated:
        s.close()


def _base_row(point: SweepPoint, backend: str, opts: RunOptions, timer: str, run_id: str) -> Row:
    wl = point.workload
    recipe = wl.recipe if wl else InputRecipe()
    return Row(
        backend=backend,
        mode=opts.mode,
        h_qk=point.h_qk,
        h_v=point.h_v,
        k=wl.k if wl else 128,
        v=wl.v if wl else 128,
        seqlens=list(point.seqlens),
        label=point.label,
        model=point.model,
        dtype=recipe.dtype,
        gate=recipe.gate,
        zero_gate_frac=recipe.zero_gate_frac,
        seed=wl.seed(opts.seed_base) if wl else 0,
        check_seeds=opts.check_seeds,
        sweep=opts.sweep,
        timer=timer,
        gpu=opts.gpu,
        versions=library_versions(),
        env_flags=env_flags(),
        git_sha=git_sha(),
        run_id=run_id,
        timestamp=_now(),
    )


def done_keys(path: Path) -> set[tuple]:
    """Keys of rows already in a results file (for resume). A torn last line is ignored."""
    keys: set[tuple] = set()
    if not path.is_file():
        return keys
    try:
        for row in iter_rows(path):
            keys.add(row.config_key())
    except Exception:
        # a partial final line after a crash: keep what parsed
        pass
    return keys


def _timers(opts: RunOptions) -> tuple[str, ...]:
    return ("",) if opts.numerics_only else opts.timers


def measure_point(
    point: SweepPoint, opts: RunOptions, sessions: dict, run_id: str, cb: Callbacks | None = None
) -> list[Row]:
    """All rows of one config: numerics per backend, then interleaved timing of the passing ones."""
    cb = cb or Callbacks()
    timers = _timers(opts)
    rows: list[Row] = []
    if point.workload is None:
        for b in opts.backends:
            for t in timers:
                row = _base_row(point, b, opts, t, run_id)
                row.status, row.reason = Status.UNSUPPORTED.value, point.skip_reason
                rows.append(row)
        return rows
    wl = point.workload
    seed = wl.seed(opts.seed_base)
    health_before = read_health()
    setups = _setup_all(wl, seed, opts, sessions, cb)
    passing = [b for b in opts.backends if setups[b].status == Status.PASSED.value]
    samples: dict[tuple[str, str], list[float]] = {}
    host: dict[tuple[str, str], list[float]] = {}
    failures: dict[tuple[str, str], tuple[str, str]] = {}
    if not opts.numerics_only and passing:
        rounds = min(opts.rounds, opts.reps)
        per_round = [opts.reps // rounds + (1 if r < opts.reps % rounds else 0) for r in range(rounds)]
        for timer in timers:
            for r in range(rounds):
                order = passing if r % 2 == 0 else list(reversed(passing))  # A B C, C B A: cancels drift
                for b in order:
                    if (b, timer) in failures:
                        continue
                    cb.backend_step(b, f"{timer} round {r + 1}/{rounds}")
                    try:
                        device_ms, host_ms = sessions[b].sample(timer, per_round[r])
                        samples.setdefault((b, timer), []).extend(device_ms)
                        host.setdefault((b, timer), []).extend(host_ms)
                    except WorkerFailure as exc:
                        failures[(b, timer)] = (exc.status.value, exc.reason)
                    except Exception as exc:
                        failures[(b, timer)] = (Status.ERROR.value, f"timing failed: {type(exc).__name__}: {exc}"[:300])
    for b in opts.backends:
        sessions[b].teardown()
    health_after = read_health()
    throttled = is_throttled(health_before, health_after)
    for b in opts.backends:
        s = setups[b]
        for timer in timers:
            row = _base_row(point, b, opts, timer, run_id)
            row.status, row.reason = s.status, s.reason
            row.rel_l2, row.max_abs, row.nonfinite = s.rel_l2, s.max_abs, s.nonfinite
            row.worst_seed = s.worst_seed
            row.first_call_ms = s.first_call_ms
            row.versions = {**row.versions, **s.versions}
            row.env_flags = {**row.env_flags, **s.env_flags}
            row.health = {"before": health_before, "after": health_after} if health_before else {}
            row.throttled = throttled
            if (b, timer) in failures:
                row.status, row.reason = failures[(b, timer)]
            elif (b, timer) in samples and s.status == Status.PASSED.value:
                _fill_timing(row, samples[(b, timer)], wl, opts, host.get((b, timer), []))
            rows.append(row)
    return rows


def _setup_all(wl: Workload, seed: int, opts: RunOptions, sessions: dict, cb: Callbacks) -> dict[str, SetupResult]:
    """Numerics (and first calls) of every backend for one config, in backend order.

    Isolated workers set up at the same time (their first calls, cache loads and float64 references
    overlap), except backends that autotune on the GPU (FLA's Triton): those run theirs first, alone,
    so no other work skews the configs they keep. Nothing is timed until every setup has returned.
    """
    args = (wl, opts.mode, seed, opts.check_seeds)
    setups: dict[str, SetupResult] = {}
    for b in opts.backends:
        if isinstance(sessions[b], IsolatedSession) and get_backend(b).tunes_on_device:
            cb.backend_step(b, "numerics (alone: it autotunes on the GPU)")
            setups[b] = sessions[b].setup(*args)
    for b in opts.backends:
        if b not in setups and isinstance(sessions[b], IsolatedSession):
            sessions[b].begin_setup(*args)
    for b in opts.backends:
        if b not in setups:
            cb.backend_step(b, "numerics")
            setups[b] = sessions[b].setup(*args)
    return {b: setups[b] for b in opts.backends}


def _fill_timing(
    row: Row, samples_ms: list[float], wl: Workload, opts: RunOptions, host_ms: list[float] | None = None
) -> None:
    st = summarize(samples_ms)
    row.host_median_ms = statistics.median(host_ms) if host_ms else None
    row.samples_ms = [round(x, 6) for x in samples_ms]
    row.median_ms, row.min_ms, row.mean_ms = st.median, st.minimum, st.mean
    row.q1_ms, row.q3_ms, row.ci_low_ms, row.ci_high_ms = st.q1, st.q3, st.ci_low, st.ci_high
    row.l2 = "n/a" if row.timer == "cpu-wall" else ("cold" if opts.cold_l2 else "warm")
    d = derived(wl, opts.mode, st.median, opts.ceilings)
    row.tflops, row.gbps, row.pct_roofline = d["tflops"], d["gbps"], d["pct_roofline"]


def run_sweep(
    sweep: Sweep, opts: RunOptions, out_path: Path | None, cb: Callbacks | None = None, resume: bool = True
) -> list[Row]:
    """Measure every point; rows are appended to out_path as each config finishes."""
    cb = cb or Callbacks()
    run_id = uuid.uuid4().hex[:12]
    done = done_keys(out_path) if (out_path is not None and resume) else set()
    sessions = open_sessions(opts)
    rows: list[Row] = []
    try:
        for point in sweep.points:
            cb.point_started(point)
            if done and _point_done(point, opts, done):
                continue
            for row in measure_point(point, opts, sessions, run_id, cb):
                if out_path is not None:
                    append_row(out_path, row)
                rows.append(row)
                cb.row_written(row)
    finally:
        close_sessions(sessions)
    return rows


def _point_done(point: SweepPoint, opts: RunOptions, done: set[tuple]) -> bool:
    for b in opts.backends:
        for t in _timers(opts):
            probe = _base_row(point, b, opts, t, "")
            if probe.config_key() not in done:
                return False
    return True


def points_from_rows(rows: Iterable[Row]) -> list[SweepPoint]:
    """Rebuild the sweep points of existing rows (for re-measuring them)."""
    seen: dict[tuple, SweepPoint] = {}
    for r in rows:
        key = (r.h_qk, r.h_v, r.k, r.v, tuple(r.seqlens), r.dtype, r.gate, r.zero_gate_frac, r.model, r.label)
        if key in seen:
            continue
        heads = HeadConfig(r.h_qk, r.h_v, r.model)
        wl = Workload(
            heads,
            tuple(r.seqlens),
            r.k,
            r.v,
            InputRecipe(r.gate, r.zero_gate_frac, r.dtype),
            model=r.model,
            label=r.label,
        )
        seen[key] = SweepPoint(r.model, r.label, tuple(r.seqlens), wl, "", r.h_qk, r.h_v)
    return list(seen.values())


def remeasure(rows: list[Row], reps: int | None = None) -> list[Row]:
    """Measure the configs of these rows again, here, with the same backends, mode and timers.

    Used by `qla-bench gate --rerun` to give suspected regressions a second, interleaved measurement.
    """
    from .provenance import resolve_gpu

    out: list[Row] = []
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.mode, r.timer, r.sweep), []).append(r)
    gpu = resolve_gpu(None)
    for (mode, timer, sweep_name), group in groups.items():
        backends = sorted({r.backend for r in group})
        opts = RunOptions(
            mode=mode,
            backends=backends,
            timers=(timer,),
            gpu=gpu,
            sweep=sweep_name,
            reps=reps or max(len(group[0].samples_ms), 20),
        )
        sweep = Sweep(name=sweep_name, mode=mode, points=points_from_rows(group))
        wanted = {r.config_key() for r in group}
        out.extend(r for r in run_sweep(sweep, opts, None, resume=False) if r.config_key() in wanted)
    return out
