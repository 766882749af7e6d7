"""The Typer app and main(): the only place that knows about terminals, exit codes and argv.

Command modules (run_cmds, info_cmds, report_cmd, gate_cmds, noise_cmd, kernels_cmd) register their commands on `app`.
main() maps known exceptions to one clean error line and an exit code (3 usage, 2 numerics).
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

app = typer.Typer(
    name="qla-bench",
    help="GDN chunked-prefill benchmarks: numerics against float64, then timing, tables, plots and gating.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_NUMERICS = 2
EXIT_USAGE = 3


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    """Print one red error line on stderr and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    return typer.Exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    from ..errors import QlaBenchError
    from . import register_commands

    register_commands()
    try:
        code = app(args=argv, standalone_mode=False)  # click returns typer.Exit codes here
        if isinstance(code, int) and code:
            sys.exit(code)
    except QlaBenchError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("[yellow]interrupted[/]: rows written so far are kept; rerun with the same --out to resume")
        sys.exit(130)
    except Exception as exc:  # click's usage errors (typer may vendor its own click: match by class name)
        kinds = {c.__name__ for c in type(exc).__mro__}
        if "UsageError" in kinds and hasattr(exc, "format_message"):
            err_console.print(f"[bold red]error:[/] {exc.format_message()}", highlight=False)
            sys.exit(EXIT_USAGE)
        if "ClickException" in kinds and hasattr(exc, "show"):
            exc.show()
            sys.exit(getattr(exc, "exit_code", 1))
        raise
