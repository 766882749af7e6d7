"""Helpers the stage-1 (kkt) tests share, CPU and GPU alike (tests/ is on sys.path: tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import torch


def load_test_module(path: Path) -> ModuleType:
    """A test module as a plain module, for its cases and helpers: pytest runs with --import-mode=importlib, so
    test modules cannot import each other by name. Its module-level skips apply as they do under pytest."""
    spec = importlib.util.spec_from_file_location(f"_helpers_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exact_agb(a0: torch.Tensor, gc: torch.Tensor, beta: torch.Tensor, cu) -> torch.Tensor:
    """float64 Gamma o A0 diag(beta) rows [T, H_v, 64] from a float64 A0 [T, H_v, 64] and chunk-local cumsum
    [T, H_v] (the tests' exact stage 1), beta [..., H_v] on any device: each chunk's tokens only (beta is 0 past
    a sequence end); cu the sequences' token offsets."""
    agb, a0b = torch.zeros_like(a0), torch.zeros_like(a0)
    bf = beta.reshape(-1, beta.shape[-1]).double().cpu()
    for s, e in itertools.pairwise(cu):
        for c0 in range(s, e, 64):
            n = min(64, e - c0)
            rows = slice(c0, c0 + n)
            a0b[rows, :, :n] = a0[rows, :, :n] * bf[rows].T[None]
            g_i = gc[rows].permute(1, 0)[:, :, None]  # [H_v, n, 1]
            g_j = gc[rows].permute(1, 0)[:, None, :]
            gam = torch.tril(torch.exp(torch.tril(g_i - g_j)))  # [H_v, n, n], 0 above the diagonal
            agb[rows, :, :n] = a0b[rows, :, :n] * gam.permute(1, 0, 2)
    return agb
