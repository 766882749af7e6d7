"""`noise`: measure the same configs in several fresh processes and report the spread of the median."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

from ..errors import UsageError
from ..noise import noise_points, render_noise_markdown, suggested_threshold
from ..provenance import resolve_gpu
from ..rows import load_rows
from .app import app, console, err_console


@app.command("noise")
def noise_cmd(
    gpu: str = typer.Option(None, "--gpu", help="Expected GPU; must match the device."),
    sweep: str = typer.Option("ci", "--sweep", "-s", help="Sweep whose configs are measured."),
    heads: str = typer.Option(None, "--heads", help="Override head configs."),
    seqlens: str = typer.Option(None, "--seqlens", help="Override sequence mixes."),
    backends: str = typer.Option(None, "--backends", "-b", help="Comma list (default: all available)."),
    timers: str = typer.Option(None, "--timers", help="events, graph (GPU) or wall (CPU)."),
    processes: int = typer.Option(3, "--processes", help="Separate processes (runs)."),
    reps: int = typer.Option(None, "--reps", help="Timed calls per backend and timer."),
    out: Path = typer.Option(None, "--out", "-o", help="Folder for runs and noise.md (default results/<GPU>/noise)."),
) -> None:
    """Run a sweep in N fresh processes; write noise.md with the spread of the median per timer."""
    if processes < 2:
        raise UsageError("--processes", f"must be >= 2, got {processes}")
    name = resolve_gpu(gpu)
    out_dir = Path(out) if out else Path("results") / name / "noise"
    runs = []
    for i in range(processes):
        run_dir = out_dir / f"run{i + 1}"
        argv = [
            sys.executable,
            "-m",
            "qla_bench.cli",
            "fwd",
            "--sweep",
            sweep,
            "--out",
            str(run_dir),
            "--no-report",
            "--no-resume",
        ]
        for flag, val in (
            ("--gpu", gpu),
            ("--heads", heads),
            ("--seqlens", seqlens),
            ("--backends", backends),
            ("--timers", timers),
            ("--reps", reps),
        ):
            if val is not None:
                argv += [flag, str(val)]
        err_console.print(f"[dim]noise run {i + 1}/{processes}: {' '.join(argv[1:])}[/]")
        if subprocess.run(argv, check=False).returncode != 0:
            raise typer.Exit(2)
        runs.append(load_rows([run_dir]))
    points = noise_points(runs)
    text = render_noise_markdown(points, processes, name)
    path = out_dir / "noise.md"
    path.write_text(text, encoding="utf-8")
    console.print(text)
    err_console.print(f"[dim]wrote {path}; suggested gate threshold {100 * suggested_threshold(points):.1f} %[/]")
