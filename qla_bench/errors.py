"""Exceptions the CLI maps to clean one-line errors and exit codes."""

from __future__ import annotations


class QlaBenchError(Exception):
    """Base class of every error qla-bench raises on purpose."""

    exit_code = 1


class UsageError(QlaBenchError, ValueError):
    """Bad input from the user: an argument, a sweep file, a config. Exit code 3."""

    exit_code = 3

    def __init__(self, argument: str, message: str, accepted: str | None = None) -> None:
        self.argument = argument
        self.accepted = accepted
        text = f"{argument}: {message}"
        if accepted:
            text += f" (accepted: {accepted})"
        super().__init__(text)


class NumericsFailure(QlaBenchError):
    """A gate or check found wrong numbers or missing rows. Exit code 2."""

    exit_code = 2
