"""`fwd`, `bwd`, `check`, `prepare`: run a sweep with numerics first, write rows, tables and plots."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import qla_bench

from ..backends import backend_names, get_backend, parse_backends
from ..errors import UsageError
from ..paths import apply_cache_dir, device_profile_path, results_dir
from ..provenance import CPU_GPU_NAME, resolve_gpu
from ..roofline import Ceilings
from ..rows import Row, Status, load_rows
from ..runner import Callbacks, RunOptions, run_sweep
from ..stats import geomean
from ..sweeps import Sweep, load_sweep, override_sweep
from ..timing import TIMERS
from .app import EXIT_NUMERICS, app, console, err_console

_TIMER_ALIASES = {"events": "cuda-events", "graph": "cuda-graph", "wall": "cpu-wall"}
_DEFAULT_SWEEP = {
    ("fwd", True): "qwen35-fwd",
    ("fwd", False): "cpu-smoke",
    ("bwd", True): "qwen35-bwd",
    ("bwd", False): "cpu-smoke",
    ("train", True): "qwen35-bwd",
    ("train", False): "cpu-smoke",
}


def parse_timers(text: str | None, on_gpu: bool) -> tuple[str, ...]:
    if not text:
        return ("cuda-events",) if on_gpu else ("cpu-wall",)
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name = _TIMER_ALIASES.get(part, part)
        if name not in TIMERS:
            raise UsageError("--timers", f"unknown timer {part!r}", "events, graph, wall")
        if name != "cpu-wall" and not on_gpu:
            raise UsageError("--timers", f"{name} needs a CUDA GPU", "wall on a CPU-only machine")
        out.append(name)
    return tuple(dict.fromkeys(out))


def wall_times(started: float, phases: dict[str, float] | None = None) -> str:
    """The command's wall time, the same since the process imported qla_bench (imports included), and
    the seconds of its phases (where a slow run spends its time)."""
    now = time.perf_counter()
    text = f"wall time {now - started:.1f} s ({now - qla_bench.STARTED:.1f} s since start-up)"
    if phases:
        text += ": " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    return text


def default_backends(mode: str, on_gpu: bool = False, import_check: bool = True) -> list[str]:
    """Every registered backend that can run here and has this mode; on a GPU only the GPU libraries
    (Backend.default_on_gpu), the others are run when --backends names them.

    import_check=False asks Backend.installed() instead of available(): for isolated runs, whose
    workers import their own library and report an import failure on every row."""
    out = []
    for name in backend_names():
        b = get_backend(name)
        if mode not in b.modes and not (mode == "train" and "bwd" in b.modes):
            continue
        if on_gpu and not b.default_on_gpu:
            continue
        try:
            ok = (b.available() if import_check else b.installed()) is None
        except Exception:
            ok = False
        if ok:
            out.append(name)
    if not out:
        raise UsageError("--backends", f"no backend with a {mode} pass can run here", ", ".join(backend_names()))
    return out


def build_sweep(mode: str, sweep: str | None, heads: str | None, seqlens: str | None, on_gpu: bool) -> Sweep:
    s = load_sweep(sweep or _DEFAULT_SWEEP[(mode, on_gpu)])
    s = override_sweep(s, heads, seqlens)
    if s.mode != mode:
        s = Sweep(name=s.name, mode=mode, description=s.description, points=s.points, source=s.source)
    return s


class _ProgressCallbacks(Callbacks):
    """Rich progress over the sweep's points, with the backend step in the description."""

    def __init__(self, progress: Progress, task) -> None:
        self.progress, self.task = progress, task
        self.current = ""
        self.started = time.perf_counter()
        self.first_point_s = 0.0  # seconds until the first config's rows were written (worker start-up in it)
        super().__init__(point_started=self._point, row_written=self._row, backend_step=self._step)

    def _row(self, row) -> None:
        if not self.first_point_s:
            self.first_point_s = time.perf_counter() - self.started

    def _point(self, point) -> None:
        if self.current:
            self.progress.advance(self.task)
        self.current = f"{point.model} {point.label}"
        self.progress.update(self.task, description=self.current)

    def _step(self, backend: str, what: str) -> None:
        self.progress.update(self.task, description=f"{self.current} [cyan]{backend}[/] {what}")

    def finish(self) -> None:
        if self.current:
            self.progress.advance(self.task)


def execute(
    mode: str,
    *,
    gpu: str | None,
    backends: str | None,
    sweep: str | None,
    heads: str | None,
    seqlens: str | None,
    out: Path | None,
    timers: str | None,
    reps: int | None,
    rounds: int,
    isolate: bool | None,
    timeout: float,
    tolerance: str,
    check_seeds: int,
    warm_l2: bool,
    resume: bool,
    report: bool,
    cache_dir: Path | None,
    numerics_only: bool = False,
    rows_file: str | None = None,
) -> tuple[list[Row], Path | None]:
    """Shared body of the run commands: validate everything before any kernel runs, then sweep."""
    started = time.perf_counter()
    gpu_name = resolve_gpu(gpu)
    on_gpu = gpu_name != CPU_GPU_NAME
    apply_cache_dir(cache_dir)
    the_sweep = build_sweep(mode, sweep, heads, seqlens, on_gpu)
    isolate = on_gpu if isolate is None else isolate
    names = parse_backends(backends) if backends else default_backends(mode, on_gpu, import_check=not isolate)
    timer_list = parse_timers(timers, on_gpu)
    if reps is not None and reps < 1:
        raise UsageError("--reps", f"must be >= 1, got {reps}")
    if rounds < 1:
        raise UsageError("--rounds", f"must be >= 1, got {rounds}")
    out_dir = Path(out) if out else results_dir(gpu_name)
    out_path = out_dir / (rows_file or f"{the_sweep.name}-{mode}.jsonl")
    ceilings = Ceilings.load(device_profile_path(gpu_name, out_dir)) if on_gpu else None
    opts = RunOptions(
        mode=mode,
        backends=names,
        timers=timer_list,
        reps=reps or (100 if on_gpu else 5),
        rounds=rounds,
        tolerance=tolerance,
        isolate=isolate,
        timeout_s=timeout,
        cold_l2=not warm_l2,
        gpu=gpu_name,
        check_seeds=check_seeds,
        sweep=the_sweep.name,
        numerics_only=numerics_only,
        ceilings=ceilings,
    )
    err_console.print(
        f"[dim]{mode}: sweep {the_sweep.name} ({len(the_sweep.points)} configs) x "
        f"{', '.join(names)} on {gpu_name}; timers {', '.join(timer_list)}; rows -> {out_path}[/]"
    )
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    phases = {"set-up": time.perf_counter() - started}
    with Progress(*columns, console=err_console, transient=False) as progress:
        task = progress.add_task(the_sweep.name, total=len(the_sweep.points))
        cb = _ProgressCallbacks(progress, task)
        t_sweep = time.perf_counter()
        rows = run_sweep(the_sweep, opts, out_path, cb, resume=resume)
        cb.finish()
        if cb.first_point_s:  # 0 when resume left nothing to measure
            phases["first config (workers start)"] = cb.first_point_s
        phases["sweep"] = time.perf_counter() - t_sweep
    t_report = time.perf_counter()
    print_summary(rows, mode)
    if report and out_path.is_file():
        from ..report.writer import write_reports

        all_rows = load_rows(sorted(out_dir.glob("*.jsonl")))  # the sweeps of this folder, not numerics/ or baseline/
        written = write_reports(all_rows, out_dir, gpu=gpu_name)
        for p in written:
            err_console.print(f"[dim]wrote {p}[/]")
    phases["summary and report"] = time.perf_counter() - t_report
    err_console.print(f"[dim]rows: {out_path}; {wall_times(started, phases)}[/]")
    return rows, out_path


def print_summary(rows: list[Row], mode: str) -> None:
    """Per backend and timer: status counts and the geomean of medians over this run's rows."""
    if not rows:
        console.print("[yellow]nothing new to measure (all rows already in the results file: resumed)[/]")
        return
    t = Table(title=f"{mode} summary (this run)")
    for col in ("backend", "timer", "PASSED", "other statuses", "geomean median ms", "worst rel-L2"):
        t.add_column(col)
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.backend, r.timer), []).append(r)
    for (b, timer), rs in groups.items():
        passed = [r for r in rs if r.passed]
        others: dict[str, int] = {}
        for r in rs:
            if not r.passed:
                others[r.status] = others.get(r.status, 0) + 1
        meds = [r.median_ms for r in passed if r.median_ms]
        worst = max((max(r.rel_l2.values()) for r in rs if r.rel_l2), default=None)
        t.add_row(
            b,
            timer or "-",
            str(len(passed)),
            ", ".join(f"{k} {v}" for k, v in others.items()) or "-",
            f"{geomean(meds):.4f}" if meds else "-",
            f"{worst:.2e}" if worst is not None else "-",
        )
    console.print(t)
    bad = [r for r in rows if r.status in (Status.INCORRECT.value, Status.ERROR.value)]
    for r in bad[:10]:
        err_console.print(f"[red]{r.status}[/] {r.backend} {r.model} {r.label}: {r.reason}", highlight=False)


# ---- shared options ---------------------------------------------------------------------------------
GPU = typer.Option(None, "--gpu", help="GPU profile name, e.g. H200; must match the device. Default: detected.")
BACKENDS = typer.Option(
    None, "--backends", "-b", help="Comma list (default: every backend available here; on a GPU without 'torch')."
)
SWEEP = typer.Option(
    None, "--sweep", "-s", help="Sweep name or TOML path (default: qwen35-* on GPU, cpu-smoke on CPU)."
)
HEADS = typer.Option(None, "--heads", help="Override head configs: '16/32,2/8'.")
SEQLENS = typer.Option(None, "--seqlens", help="Override sequence mixes: '1x32768,8192x4,28672+4096'.")
OUT = typer.Option(None, "--out", "-o", help="Results folder (default: results/<GPU>).")
TIMERS_OPT = typer.Option(None, "--timers", help="events, graph (CUDA) or wall (CPU); comma list.")
REPS = typer.Option(None, "--reps", help="Timed calls per backend and timer (default 100 on GPU, 5 on CPU).")
ROUNDS = typer.Option(4, "--rounds", help="Interleaved rounds the calls are split into (A B C, C B A, ...).")
ISOLATE = typer.Option(None, "--isolate/--no-isolate", help="One subprocess per backend (default: on for GPU).")
TIMEOUT = typer.Option(600.0, "--timeout", help="Seconds a backend may take for one config step (isolated runs).")
TOLERANCE = typer.Option("bf16", "--tolerance", help="Numerics profile: bf16 (rel-L2 <= 0.02), strict, fp32.")
SEEDS = typer.Option(
    1, "--check-seeds", help="Seeds the numerics check runs per config before timing; rows keep the worst error."
)
WARM = typer.Option(False, "--warm-l2", help="Skip the L2 flush between timed calls (default: cold L2).")
RESUME = typer.Option(True, "--resume/--no-resume", help="Skip configs already in the results file.")
REPORT = typer.Option(True, "--report/--no-report", help="Write the text table, Markdown report and plots.")
CACHE = typer.Option(None, "--cache-dir", help="Root of the TileLang/Triton/FlashInfer caches.")


@app.command("fwd")
def fwd_cmd(
    gpu: str = GPU,
    backends: str = BACKENDS,
    sweep: str = SWEEP,
    heads: str = HEADS,
    seqlens: str = SEQLENS,
    out: Path = OUT,
    timers: str = TIMERS_OPT,
    reps: int = REPS,
    rounds: int = ROUNDS,
    isolate: bool = ISOLATE,
    timeout: float = TIMEOUT,
    tolerance: str = TOLERANCE,
    check_seeds: int = SEEDS,
    warm_l2: bool = WARM,
    resume: bool = RESUME,
    report: bool = REPORT,
    cache_dir: Path = CACHE,
) -> None:
    """Forward sweep: numerics against float64, then timing; rows, table, report and plots."""
    execute("fwd", **locals())  # every option above is an argument of execute, under the same name


@app.command("bwd")
def bwd_cmd(
    gpu: str = GPU,
    backends: str = BACKENDS,
    sweep: str = SWEEP,
    heads: str = HEADS,
    seqlens: str = SEQLENS,
    out: Path = OUT,
    timers: str = TIMERS_OPT,
    reps: int = REPS,
    rounds: int = ROUNDS,
    isolate: bool = ISOLATE,
    timeout: float = TIMEOUT,
    tolerance: str = TOLERANCE,
    check_seeds: int = SEEDS,
    warm_l2: bool = WARM,
    resume: bool = RESUME,
    report: bool = REPORT,
    cache_dir: Path = CACHE,
    mode: str = typer.Option(
        "bwd",
        "--mode",
        help="bwd (backward alone, given the library's own forward outputs) or train (forward + backward as one step).",
    ),
) -> None:
    """Backward sweep (or --mode train): six gradients against float64 autograd, then timing."""
    if mode not in ("bwd", "train"):
        raise UsageError("--mode", f"unknown mode {mode!r}", "bwd, train")
    options = {name: value for name, value in locals().items() if name != "mode"}
    execute(mode, **options)


@app.command("check")
def check_cmd(
    gpu: str = GPU,
    backends: str = BACKENDS,
    sweep: str = SWEEP,
    heads: str = HEADS,
    seqlens: str = SEQLENS,
    out: Path = OUT,
    isolate: bool = ISOLATE,
    timeout: float = TIMEOUT,
    tolerance: str = TOLERANCE,
    check_seeds: int = typer.Option(2, "--check-seeds", help="Seeds per config."),
    cache_dir: Path = CACHE,
    mode: str = typer.Option("fwd", "--mode", help="fwd, bwd or train."),
) -> None:
    """Numerics only (no timing): every backend against the float64 reference. Exit 2 on any failure."""
    if mode not in ("fwd", "bwd", "train"):
        raise UsageError("--mode", f"unknown mode {mode!r}", "fwd, bwd, train")
    rows, _ = execute(
        mode,
        gpu=gpu,
        backends=backends,
        sweep=sweep,
        heads=heads,
        seqlens=seqlens,
        out=out,
        timers=None,
        reps=None,
        rounds=1,
        isolate=isolate,
        timeout=timeout,
        tolerance=tolerance,
        check_seeds=check_seeds,
        warm_l2=False,
        resume=False,
        report=False,
        cache_dir=cache_dir,
        numerics_only=True,
        rows_file=f"numerics/check-{mode}.jsonl",
    )
    bad = [
        r
        for r in rows
        if r.status in (Status.INCORRECT.value, Status.ERROR.value, Status.OOM.value, Status.TIMEOUT.value)
    ]
    if bad:
        raise typer.Exit(EXIT_NUMERICS)


@app.command("prepare")
def prepare_cmd(
    gpu: str = GPU,
    backends: str = BACKENDS,
    sweep: str = SWEEP,
    heads: str = HEADS,
    seqlens: str = SEQLENS,
    out: Path = OUT,
    isolate: bool = ISOLATE,
    timeout: float = typer.Option(1800.0, "--timeout", help="Seconds per backend and config (JIT builds)."),
    cache_dir: Path = CACHE,
    mode: str = typer.Option("fwd", "--mode", help="fwd, bwd or train."),
    jobs: int = typer.Option(
        1,
        "--jobs",
        "-j",
        help="Processes compiling at once: one per head config, plus one job that walks every head config "
        "for the backends that autotune on the GPU (FLA). 1: everything in this process.",
    ),
) -> None:
    """Compile/autotune everything a sweep needs (first-call times recorded), so later runs compile nothing."""
    import os

    if jobs < 1:
        raise UsageError("--jobs", f"must be >= 1, got {jobs}")
    if mode not in ("fwd", "bwd", "train"):
        raise UsageError("--mode", f"unknown mode {mode!r}", "fwd, bwd, train")
    os.environ["QLA_FLASHINFER_ALLOW_BUILD"] = "1"  # the one command allowed to start FlashInfer's JIT build
    if jobs > 1:
        _prepare_in_jobs(mode, jobs, gpu, backends, sweep, heads, seqlens, out, isolate, timeout, cache_dir)
        return
    execute(
        mode,
        gpu=gpu,
        backends=backends,
        sweep=sweep,
        heads=heads,
        seqlens=seqlens,
        out=out,
        timers=None,
        reps=None,
        rounds=1,
        isolate=isolate,
        timeout=timeout,
        tolerance="bf16",
        check_seeds=1,
        warm_l2=False,
        resume=False,
        report=False,
        cache_dir=cache_dir,
        numerics_only=True,
        rows_file=f"numerics/prepare-{mode}.jsonl",
    )


def _prepare_in_jobs(
    mode: str,
    jobs: int,
    gpu: str | None,
    backends: str | None,
    sweep: str | None,
    heads: str | None,
    seqlens: str | None,
    out: Path | None,
    isolate: bool | None,
    timeout: float,
    cache_dir: Path | None,
) -> None:
    """prepare --jobs N: checks everything here, then one subprocess per job (prepare_jobs.py)."""
    from .prepare_jobs import cli_base_argv, head_specs, plan_jobs, run_prepare_jobs

    started = time.perf_counter()
    gpu_name = resolve_gpu(gpu)
    the_sweep = build_sweep(mode, sweep, heads, seqlens, gpu_name != CPU_GPU_NAME)
    on_gpu = gpu_name != CPU_GPU_NAME
    names = parse_backends(backends) if backends else default_backends(mode, on_gpu, import_check=False)
    planned = plan_jobs(names, head_specs(the_sweep))
    out_dir = Path(out) if out else results_dir(gpu_name)
    rows_file = f"numerics/prepare-{mode}.jsonl"
    passthrough = {
        "--gpu": gpu_name,
        "--sweep": sweep or the_sweep.name,
        "--seqlens": seqlens,
        "--timeout": timeout,
        "--cache-dir": cache_dir,
    }
    base = cli_base_argv(mode, passthrough)
    if isolate is not None:
        base.append("--isolate" if isolate else "--no-isolate")
    err_console.print(
        f"[dim]prepare: {len(planned)} jobs over {len(head_specs(the_sweep))} head configs, "
        f"{min(jobs, len(planned))} at a time; logs in {out_dir / 'prepare-jobs'}[/]"
    )
    rows, failed = run_prepare_jobs(planned, jobs, base, out_dir, rows_file)
    print_summary(rows, mode)
    err_console.print(f"[dim]rows: {out_dir / rows_file}; {wall_times(started)}[/]")
    if failed:
        for job in failed:
            err_console.print(f"[red]job {job.name} failed ({job.exit_text()}); log: {job.log}[/]")
        raise typer.Exit(1)
