"""qla-bench command line. `register_commands()` imports every command module once."""

from __future__ import annotations

import importlib

from .app import app, main

_COMMAND_MODULES = ("run_cmds", "info_cmds", "report_cmd", "gate_cmds", "noise_cmd", "kernels_cmd")
_registered = False


def register_commands():
    """Import the command modules (each registers on `app`) and return the app. Idempotent."""
    global _registered
    if not _registered:
        for mod in _COMMAND_MODULES:
            importlib.import_module(f"{__name__}.{mod}")
        _registered = True
    return app


__all__ = ["app", "main", "register_commands"]
