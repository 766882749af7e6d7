"""Run the v3 kkt_solve TileLang program itself on the CPU (TileLang's C backend, cpu_debug=True).

Everything but the GPU-only pieces is the GPU program's own code: the grid decode (value head fastest),
GVA head mapping, the scatter of L into the stacked operands, the tf32 hi/lo splits, the assembly of
A0, the ragged-tail masks. The GEMMs become loops that truncate their operands to tf32 like mma.sync,
the cumsum and forward substitution serial loops (see kkt_solve_v3_program's docstring). Inputs are fp32
holding bf16 values (the C backend has no bf16), outputs fp32, compared with float64.
"""

import importlib.util
import itertools
import shutil

import pytest
import torch
import torch.nn.functional as F

if importlib.util.find_spec("tilelang") is None:
    pytest.skip("tilelang is not installed", allow_module_level=True)
if shutil.which("g++") is None:
    pytest.skip("TileLang's C backend needs g++", allow_module_level=True)

import tilelang
from kkt_test_helpers import exact_agb

from qla_kernels.gdn.fwd.kkt_solve_v3 import PASS_CONFIGS, kkt_solve_v3_program
from qla_kernels.gdn.plan import build_plan_from_list

CASES = [
    # (cu_seqlens, h_qk, h_v)
    ([0, 300], 2, 4),
    ([0, 1, 64, 65, 130, 257, 300], 2, 4),
    ([0, 1000, 4096], 2, 6),
    ([0, 65], 4, 4),
    ([0, 1], 1, 2),
    ([0, 63, 126], 1, 4),
]


@pytest.fixture(scope="module")
def kernels():
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    built = {
        precise: tilelang.compile(kkt_solve_v3_program(128, "float32", precise, cpu_debug=True), target="c",
                                  pass_configs=cfg)
        for precise in (True, False)
    }
    # v3h: the same program with the CTA's indices computed once (hoist_index)
    built["hoist"] = tilelang.compile(
        kkt_solve_v3_program(128, "float32", True, cpu_debug=True, hoist_index=True), target="c", pass_configs=cfg
    )
    # v4: v3h with the lean scatter of L (the GPU build adds the TMA K load, which has no CPU form)
    built["lean"] = tilelang.compile(
        kkt_solve_v3_program(128, "float32", True, cpu_debug=True, hoist_index=True, lean_scatter=True),
        target="c", pass_configs=cfg,
    )  # fmt: skip
    # v5: v4's scatter with L's first rows dropped and L00 parked inside the buffer (fold_l00)
    built["fold"] = tilelang.compile(
        kkt_solve_v3_program(128, "float32", True, cpu_debug=True, hoist_index=True, lean_scatter=True, fold_l00=True),
        target="c", pass_configs=cfg,
    )  # fmt: skip
    # v4t: v4 with one tf32 product per block product (precise=False)
    built["lean_tf32"] = tilelang.compile(
        kkt_solve_v3_program(128, "float32", False, cpu_debug=True, hoist_index=True, lean_scatter=True),
        target="c", pass_configs=cfg,
    )  # fmt: skip
    # the ws10 forward's stage 1 (kkt v4 with emit_agb): Gamma o A0 diag(beta) instead of A0
    built["agb"] = tilelang.compile(
        kkt_solve_v3_program(128, "float32", True, cpu_debug=True, hoist_index=True, lean_scatter=True, emit_agb=True),
        target="c", pass_configs=cfg,
    )  # fmt: skip
    return built


def make(cu, h_qk, h_v, seed=0):
    nt = cu[-1]
    gen = torch.Generator().manual_seed(seed + nt)
    k = torch.randn(1, nt, h_qk, 128, generator=gen) + 1.5 * torch.randn(1, 1, h_qk, 128, generator=gen)
    k = F.normalize(k, dim=-1).bfloat16().float()
    g = F.logsigmoid(torch.randn(1, nt, h_v, generator=gen))
    g[..., 0] = 0.0
    if h_v > 1:
        g[..., 1] = -20.0
    beta = torch.sigmoid(torch.randn(1, nt, h_v, generator=gen))
    return k, g, beta


def exact(k, g, beta, cu):
    """float64 chunk-local cumsum [T, H_v] and A0 rows [T, H_v, 64]."""
    kf, gf, bf = k[0].double(), g[0].double(), beta[0].double()
    h_v = gf.shape[1]
    r = h_v // kf.shape[1]
    gc = torch.zeros_like(gf)
    a0 = torch.zeros(gf.shape[0], h_v, 64, dtype=torch.float64)
    eye = torch.eye(64, dtype=torch.float64)
    for s, e in itertools.pairwise(cu):
        for c0 in range(s, e, 64):
            n = min(64, e - c0)
            gc[c0:c0 + n] = torch.cumsum(gf[c0:c0 + n], 0)
            kc = torch.zeros(64, h_v, 128, dtype=torch.float64)
            kc[:n] = kf[c0:c0 + n].repeat_interleave(r, 1)
            bc = torch.zeros(64, h_v, dtype=torch.float64)
            bc[:n] = bf[c0:c0 + n]
            m = eye + torch.tril(bc.T[:, :, None] * torch.einsum("ihd,jhd->hij", kc, kc), -1)
            inv = torch.linalg.solve_triangular(m, eye.expand(h_v, 64, 64).clone(), upper=False, unitriangular=True)
            a0[c0:c0 + n] = inv.permute(1, 0, 2)[:n]
    return gc, a0


def run(kern, k, g, beta, cu_seqlens, chunk_indices):
    nt, h_v = g.shape[1], g.shape[2]
    gc = torch.full((1, nt, h_v), 123.0)  # sentinels: every row must be overwritten
    a0 = torch.full((1, nt, h_v, 64), 7.0)
    kern(k, g, beta, cu_seqlens, chunk_indices, gc, a0)
    return gc[0], a0[0]


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize(("cu", "h_qk", "h_v"), CASES)
def test_v3_program_on_cpu_matches_float64(kernels, cu, h_qk, h_v):
    k, g, beta = make(cu, h_qk, h_v)
    plan = build_plan_from_list(cu, "cpu")
    ref_gc, ref_a0 = exact(k, g, beta, cu)
    gc, a0 = run(kernels[True], k, g, beta, plan.cu_seqlens, plan.chunk_indices)
    assert rel(gc, ref_gc) < 1e-6
    assert rel(a0, ref_a0) < 2e-6 and (a0.double() - ref_a0).abs().max() < 1e-5  # 3xTF32: fp32 level
    gc1, a01 = run(kernels[False], k, g, beta, plan.cu_seqlens, plan.chunk_indices)
    assert torch.equal(gc1, gc)
    assert rel(a0, ref_a0) <= rel(a01, ref_a0) < 2e-3  # one truncated tf32 product: worse, still bounded
    gch, a0h = run(kernels["hoist"], k, g, beta, plan.cu_seqlens, plan.chunk_indices)
    assert torch.equal(gch, gc) and torch.equal(a0h, a0)  # hoisting the indices changes no value
    gcl, a0l = run(kernels["lean"], k, g, beta, plan.cu_seqlens, plan.chunk_indices)
    assert torch.equal(gcl, gc) and torch.equal(a0l, a0)  # the same products from L in one buffer
    gct, a0t = run(kernels["lean_tf32"], k, g, beta, plan.cu_seqlens, plan.chunk_indices)
    assert torch.equal(gct, gc) and torch.equal(a0t, a01)  # v4t: v3-tf32's products, read from L
    gcf, a0f = run(kernels["fold"], k, g, beta, plan.cu_seqlens, plan.chunk_indices)
    assert torch.equal(gcf, gc) and torch.equal(a0f, a0)  # the same values, L stored folded
    gca, agb = run(kernels["agb"], k, g, beta, plan.cu_seqlens, plan.chunk_indices)
    assert torch.equal(gca, gc)
    assert rel(agb, exact_agb(ref_a0, ref_gc, beta, cu)) < 2e-6
    assert torch.isfinite(agb).all()  # strong decay (g = -20 on head 1): no inf * 0 above the diagonal


def test_no_write_past_a_sequence_end(kernels):
    """Launch only sequence 0's chunks (1000 tokens: the last chunk is ragged): rows of sequence 1
    must keep their sentinels."""
    cu = [0, 1000, 1100]
    k, g, beta = make(cu, 2, 4)
    plan = build_plan_from_list(cu, "cpu")
    first = plan.chunk_indices[plan.chunk_indices[:, 0] == 0].contiguous()
    ref_gc, ref_a0 = exact(k, g, beta, cu)
    for variant in (True, "hoist", "lean", "fold"):
        gc, a0 = run(kernels[variant], k, g, beta, plan.cu_seqlens, first)
        assert rel(a0[:1000], ref_a0[:1000]) < 2e-6 and rel(gc[:1000], ref_gc[:1000]) < 1e-6
        assert torch.all(a0[1000:] == 7.0) and torch.all(gc[1000:] == 123.0)
