"""Shared fixtures. GPU tests are marked `gpu` and skipped (reported as skipped) without CUDA."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
for _p in (str(ROOT), str(TESTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200 host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_backends(monkeypatch):
    """Register tests/fakes/fake_backends.py as a plug-in, in this process and in spawned workers."""
    import importlib

    import qla_bench.backends as reg

    reg._load_builtins()
    before = dict(reg._REGISTRY)  # the built-in backends alone
    monkeypatch.setenv("QLA_BENCH_BACKENDS", "fakes.fake_backends")  # read by spawned workers
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    import fakes.fake_backends as fakes

    importlib.reload(fakes)  # runs its @register decorators again, also on a second use
    yield
    reg._REGISTRY.clear()  # the fakes must not become "all available backends" of later tests
    reg._REGISTRY.update(before)
