"""`qla-bench gate`, `compare` and `baseline save|show`: argument parsing and printing only.

The logic lives in qla_bench.gate. Every command raises typer.Exit with its own exit code (0 pass,
1 performance regression, 2 numerics or missing rows, 3 usage), so it also works under CliRunner.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.table import Table

from ..errors import UsageError
from ..gate import (
    GateParams,
    compare_runs,
    gate_rows,
    list_baselines,
    load_baseline,
    load_run,
    parse_threshold,
    rerun_if_possible,
    save_baseline,
    write_reports,
)
from ..gate.baseline import DEFAULT_ROOT
from ..gate.classify import Verdict
from ..gate.table import compare_table, gate_table
from .app import EXIT_OK, EXIT_USAGE, app, console, err_console, fail

baseline_app = typer.Typer(help="Keep a per-GPU baseline under results/<GPU>/baseline/.", no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")

ROOT_HELP = "Folder holding per-GPU baselines (results/<GPU>/baseline/)."
THRESHOLD_HELP = "Smallest median change that counts, as 5% or 0.05 (noisy rows need more: 3 x their IQR)."


@contextmanager
def _usage_errors() -> Iterator[None]:
    """Turn a UsageError into one red line and exit code 3, also when main() is bypassed."""
    try:
        yield
    except UsageError as exc:
        raise fail(str(exc), EXIT_USAGE) from None


def _report_options(markdown, junit, json_path, plot) -> dict:
    return {"markdown": markdown, "junit": junit, "json_path": json_path, "plot": plot}


def _print_written(paths: list[Path]) -> None:
    for p in paths:
        err_console.print(f"[dim]wrote {p}[/]", highlight=False, soft_wrap=True)


@app.command("gate")
def gate_cmd(
    baseline: str = typer.Option(..., "--baseline", help="Results file/folder, or a GPU name with a stored baseline."),
    candidate: str = typer.Option(..., "--candidate", help="Results file or folder of the run under test."),
    threshold: str = typer.Option("5%", "--threshold", help=THRESHOLD_HELP),
    suite_limit: str = typer.Option("2%", "--suite-limit", help="Largest allowed geometric-mean slowdown."),
    no_fail: bool = typer.Option(False, "--no-fail", help="Report, but exit 0 whatever the outcome."),
    rerun: bool = typer.Option(False, "--rerun", help="Re-measure SLOWER rows once here (needs the GPU)."),
    markdown: Path | None = typer.Option(None, "--markdown", help="Write a Markdown report."),
    junit: Path | None = typer.Option(None, "--junit", help="Write JUnit XML (one testcase per row)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write a JSON report."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the ratio plot (PNG and SVG)."),
    root: Path = typer.Option(DEFAULT_ROOT, "--root", help=ROOT_HELP),
) -> None:
    """Gate a candidate run against a baseline: exit 0 pass, 1 slower, 2 numerics/missing, 3 usage."""
    with _usage_errors():
        params = GateParams(
            threshold=parse_threshold(threshold),
            suite_limit=1.0 + parse_threshold(suite_limit, "--suite-limit"),
        )
        base_label, base_rows = load_run(baseline, root, "--baseline")
        head_label, head_rows = load_run(candidate, root, "--candidate")
        result = gate_rows(base_rows, head_rows, params, base_label, head_label)
    if rerun and result.of(Verdict.SLOWER):
        err_console.print(f"--rerun: {len(result.of(Verdict.SLOWER))} SLOWER row(s) suspected", highlight=False)
        result, hint = rerun_if_possible(result)
        if hint:
            err_console.print(f"[yellow]hint:[/] {hint}", highlight=False, soft_wrap=True)
        for note in result.notes:
            err_console.print(note, highlight=False, soft_wrap=True)
    written = write_reports(result, **_report_options(markdown, junit, json_path, plot))
    console.print(gate_table(result))
    colour = "green" if result.exit_code == EXIT_OK else "red"
    console.print(f"[bold {colour}]{result.status}[/]", highlight=False)
    for reason in result.reasons():
        console.print(f"  {reason}", highlight=False, markup=False, soft_wrap=True)
    _print_written(written)
    if no_fail and result.exit_code:
        err_console.print(f"--no-fail: exiting 0 instead of {result.exit_code}", highlight=False)
        return
    if result.exit_code:
        raise typer.Exit(result.exit_code)


@app.command("compare")
def compare_cmd(
    runs: list[str] = typer.Argument(
        ..., help="Two or more results files/folders or GPU baselines; the first is the reference."
    ),
    threshold: str = typer.Option("5%", "--threshold", help=THRESHOLD_HELP),
    markdown: Path | None = typer.Option(None, "--markdown", help="Write a Markdown report."),
    junit: Path | None = typer.Option(None, "--junit", help="Write JUnit XML."),
    json_path: Path | None = typer.Option(None, "--json", help="Write a JSON report."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the ratio plot (PNG and SVG)."),
    root: Path = typer.Option(DEFAULT_ROOT, "--root", help=ROOT_HELP),
) -> None:
    """Put several runs side by side (library versions, commits, GPUs), with ratios and classes."""
    with _usage_errors():
        params = GateParams(threshold=parse_threshold(threshold))
        loaded = [load_run(arg, root, "RUNS") for arg in runs]
        result = compare_runs(loaded, params)
    written = write_reports(result, **_report_options(markdown, junit, json_path, plot))
    console.print(compare_table(result))
    _print_written(written)


@baseline_app.command("save")
def baseline_save(
    results: list[str] = typer.Argument(..., help="Results files or folders to keep as the baseline."),
    gpu: str = typer.Option(..., "--gpu", help="GPU whose rows to keep, e.g. H200; names the folder."),
    root: Path = typer.Option(DEFAULT_ROOT, "--root", help=ROOT_HELP),
) -> None:
    """Copy a run's rows into results/<GPU>/baseline/ (replacing the old baseline) with a manifest."""
    with _usage_errors():
        saved = save_baseline([Path(r) for r in results], gpu, root)
    m = saved.manifest
    console.print(
        f"saved {m['rows']} rows of {gpu} to {saved.rows_path} "
        f"({', '.join(f'{n} {s}' for s, n in m['status'].items())})",
        highlight=False,
    )
    if m["skipped_rows_of_other_gpus"]:
        err_console.print(f"[dim]{m['skipped_rows_of_other_gpus']} rows of other GPUs were left out[/]")


@baseline_app.command("show")
def baseline_show(
    gpu: str | None = typer.Argument(None, help="GPU name; leave out to list the stored baselines."),
    root: Path = typer.Option(DEFAULT_ROOT, "--root", help=ROOT_HELP),
) -> None:
    """Show a stored baseline's manifest, or list the GPUs that have one."""
    if gpu is None:
        names = list_baselines(root)
        if not names:
            err_console.print(f"no baselines under {root}/ (qla-bench baseline save RESULTS --gpu GPU)")
            return
        for name in names:
            console.print(name, highlight=False)
        return
    with _usage_errors():
        saved = load_baseline(gpu, root)
    table = Table(title=f"baseline {gpu} ({saved.rows_path})", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in saved.manifest.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        table.add_row(key, str(value))
    console.print(table)
