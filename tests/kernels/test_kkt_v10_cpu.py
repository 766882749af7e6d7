"""Run kkt v10's TileLang program itself on the CPU (TileLang's C backend, cpu_debug=True).

Everything but the GPU-only pieces and the fp16 roundings is the GPU program's code: the grid decode, the GVA
head, the gate and beta inside L', the strict-lower mask, the 8 x 8 substitution, each level's partner masks and
the X + P X update, beta's columns, the ragged tails. Products are fp32 loops; inputs fp32 holding bf16 values.
"""

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("tilelang") is None:
    pytest.skip("tilelang is not installed", allow_module_level=True)
if shutil.which("g++") is None:
    pytest.skip("TileLang's C backend needs g++", allow_module_level=True)

import tilelang
from kkt_test_helpers import exact_agb, load_test_module

from qla_kernels.gdn.fwd.kkt_solve_v10 import PASS_CONFIGS, kkt_solve_v10_program
from qla_kernels.gdn.plan import build_plan_from_list

# the cases, inputs, float64 stage 1 and runner of test_kkt_v3_cpu
_v3 = load_test_module(Path(__file__).with_name("test_kkt_v3_cpu.py"))


@pytest.fixture(scope="module")
def kernel():
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    return tilelang.compile(kkt_solve_v10_program(128, "float32", cpu_debug=True), target="c", pass_configs=cfg)


@pytest.mark.parametrize(("cu", "h_qk", "h_v"), _v3.CASES)
def test_v10_program_on_cpu_matches_float64(kernel, cu, h_qk, h_v):
    k, g, beta = _v3.make(cu, h_qk, h_v)
    plan = build_plan_from_list(cu, "cpu")
    ref_gc, ref_a0 = _v3.exact(k, g, beta, cu)
    gc, agb = _v3.run(kernel, k, g, beta, plan.cu_seqlens, plan.chunk_indices)
    assert _v3.rel(gc, ref_gc) < 1e-6
    assert torch.isfinite(agb).all()  # strong decay (g = -20 on head 1): no inf * 0 above the diagonal
    assert _v3.rel(agb, exact_agb(ref_a0, ref_gc, beta, cu)) < 1e-5  # fp32 throughout on the CPU


def test_no_write_past_a_sequence_end(kernel):
    """Only sequence 0's chunks (1000 tokens, the last chunk ragged): sequence 1's rows keep their sentinels."""
    cu = [0, 1000, 1100]
    k, g, beta = _v3.make(cu, 2, 4)
    plan = build_plan_from_list(cu, "cpu")
    first = plan.chunk_indices[plan.chunk_indices[:, 0] == 0].contiguous()
    ref_gc, ref_a0 = _v3.exact(k, g, beta, cu)
    gc, agb = _v3.run(kernel, k, g, beta, plan.cu_seqlens, first)
    ref = exact_agb(ref_a0, ref_gc, beta, cu)
    assert _v3.rel(agb[:1000], ref[:1000]) < 1e-5 and _v3.rel(gc[:1000], ref_gc[:1000]) < 1e-6
    assert torch.all(agb[1000:] == 7.0) and torch.all(gc[1000:] == 123.0)
