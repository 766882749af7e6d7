"""`prepare --jobs N`: cold compiles of several head configs at once, in separate processes.

Why: on a bare GPU host most of a cold sweep is JIT compilation (TileLang: FlashQLA compiles about four
variants per head config, 15-60 s each), which is CPU work that one process does serially. Seven head
configs prepared in seven processes took 124 s on the H200 host; one process would need an estimated
13 minutes (about 110 s of compiles per head config, measured serially at 4/16). Backends
that autotune on the GPU (FLA's Triton kernels) stay in one job of their own that walks every head
config in turn: two of their autotunes never overlap. The compiling jobs still launch small first calls
and float64 references on the GPU meanwhile; run `prepare --jobs 1` where that matters.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..backends import get_backend
from ..rows import Row, append_row, iter_rows
from ..sweeps import Sweep
from .app import err_console


@dataclass
class PrepareJob:
    """One `qla-bench prepare` subprocess: some backends over some head configs."""

    name: str
    backends: list[str]
    heads: list[str]  # "h_qk/h_v"
    proc: subprocess.Popen | None = None
    log: Path | None = None
    started: float = 0.0
    wall_s: float = 0.0
    returncode: int | None = None
    argv: list[str] = field(default_factory=list)

    def exit_text(self) -> str:
        code = self.returncode
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit {code}"


def head_specs(sweep: Sweep) -> list[str]:
    """The sweep's head configs as --heads values, in sweep order, each once."""
    seen: dict[str, None] = {}
    for p in sweep.points:
        seen.setdefault(f"{p.h_qk}/{p.h_v}", None)
    return list(seen)


def plan_jobs(backends: list[str], heads: list[str]) -> list[PrepareJob]:
    """One job per head config for backends that only compile; one job over all head configs for the
    backends that autotune on the device (listed first: it is usually the longest)."""
    tuned = [b for b in backends if get_backend(b).tunes_on_device]
    compiled = [b for b in backends if b not in tuned]
    jobs = [PrepareJob("device-tuned", tuned, list(heads))] if tuned else []
    jobs += [PrepareJob(f"h{h.replace('/', '_')}", compiled, [h]) for h in heads] if compiled else []
    return jobs


def run_prepare_jobs(
    jobs: list[PrepareJob], parallel: int, base_argv: list[str], out_dir: Path, rows_file: str
) -> tuple[list[Row], list[PrepareJob]]:
    """Run the jobs, at most `parallel` at a time, with one progress line each. Returns the rows of
    every job (also appended to out_dir/rows_file) and the jobs that failed."""
    job_root = out_dir / "prepare-jobs"
    job_root.mkdir(parents=True, exist_ok=True)
    waiting = list(jobs)
    running: list[PrepareJob] = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=False) as progress:
        tasks = {j.name: progress.add_task(f"{j.name}: waiting", total=1) for j in jobs}
        while waiting or running:
            while waiting and len(running) < parallel:
                job = waiting.pop(0)
                job.argv = [
                    *base_argv,
                    "--backends",
                    ",".join(job.backends),
                    "--heads",
                    ",".join(job.heads),
                    "--out",
                    str(job_root / job.name),
                ]
                job.log = job_root / f"{job.name}.log"
                with job.log.open("w", encoding="utf-8") as log:
                    job.proc = subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT)
                job.started = time.perf_counter()
                running.append(job)
                progress.update(
                    tasks[job.name], description=f"{job.name}: {', '.join(job.backends)} x {len(job.heads)} heads"
                )
            time.sleep(0.2)
            for job in list(running):
                assert job.proc is not None
                if job.proc.poll() is None:
                    continue
                running.remove(job)
                job.returncode = job.proc.returncode
                job.wall_s = time.perf_counter() - job.started
                state = "done" if job.returncode == 0 else f"[red]failed ({job.exit_text()}, see {job.log})[/]"
                progress.update(tasks[job.name], completed=1, description=f"{job.name}: {state}")
    rows: list[Row] = []
    merged = out_dir / rows_file
    for job in jobs:
        path = job_root / job.name / rows_file
        if path.is_file():
            for row in iter_rows(path):
                append_row(merged, row)
                rows.append(row)
    failed = [j for j in jobs if j.returncode != 0]
    return rows, failed


def cli_base_argv(mode: str, passthrough: dict[str, str | None]) -> list[str]:
    """`python -m qla_bench.cli prepare --mode MODE` plus the options given (None: left out)."""
    argv = [sys.executable, "-m", "qla_bench.cli", "prepare", "--mode", mode]
    for flag, value in passthrough.items():
        if value is not None:
            argv += [flag, str(value)]
    return argv
