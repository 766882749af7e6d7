"""The Typer app and main(): the only place that knows about terminals, exit codes and argv.

Command modules (run_cmds, info_cmds, report_cmd, gate_cmds) register their commands on `app`.
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
console = Console()
err_console = Console(stderr=True)

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
        app(args=argv, standalone_mode=False)
    except QlaBenchError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("[yellow]interrupted[/]: rows written so far are kept; rerun with the same --out to resume")
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in standalone_mode=False
        import click

        if isinstance(exc, click.exceptions.UsageError):
            err_console.print(f"[bold red]error:[/] {exc.format_message()}", highlight=False)
            sys.exit(EXIT_USAGE)
        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
