"""Fixtures for the gate tests: the fake backend, row files, and a CLI runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so tests can `import gate_fakes`
from gate_fakes import FakeBackend, write_rows


@pytest.fixture
def fake():
    return FakeBackend


@pytest.fixture
def rows_file():
    return write_rows


@pytest.fixture
def run_cli(monkeypatch):
    """Invoke the Typer app like a user would; returns click's Result (exit_code, stdout, stderr)."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    from qla_bench.cli import app, register_commands

    try:
        register_commands()
    except ModuleNotFoundError:  # sibling command modules not written yet: register ours alone
        import qla_bench.cli.gate_cmds  # noqa: F401

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return invoke
