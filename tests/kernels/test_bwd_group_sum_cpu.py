"""The backward's GVA group sum (gdn/bwd/group_sum.py) run on the CPU through TileLang's C backend.

Rows = (token, query head) pairs; each sums its group's r value-head rows of dq and dk. Cases: r = 1..4 and
a row count that is not a multiple of the CTA's block, so the last CTA's guard is exercised.
"""

import importlib.util
import shutil

import pytest
import torch

if importlib.util.find_spec("tilelang") is None:
    pytest.skip("tilelang is not installed", allow_module_level=True)
if shutil.which("g++") is None:
    pytest.skip("TileLang's C backend needs g++", allow_module_level=True)

import tilelang

from qla_kernels.gdn.bwd.group_sum import BLOCK_ROWS, PASS_CONFIGS, gva_group_sum_program

D = 128


@pytest.fixture(scope="module")
def kernel():
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    return tilelang.compile(gva_group_sum_program(D, "float32", cpu_debug=True), target="c", pass_configs=cfg)


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_group_sum_matches_torch(kernel, group):
    rows = 2 * BLOCK_ROWS + 13  # a partial last block
    gen = torch.Generator().manual_seed(group)
    dq_v, dk_v = (torch.randn(rows, group, D, generator=gen) for _ in range(2))
    dq, dk = (torch.full((rows, D), float("nan")) for _ in range(2))
    kernel(dq_v, dk_v, dq, dk)
    for got, src in ((dq, dq_v), (dk, dk_v)):
        want = src.double().sum(1)
        assert torch.isfinite(got).all()
        assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-6
