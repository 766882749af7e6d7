"""Stage 2 of the TileLang backward (gdn/bwd/chunk_grads.py), run on the CPU through TileLang's C backend.

The kernel's own program with GEMMs and reductions as loops (cpu_debug=True), fp32 in and out, fed
float64-exact chunk start states and dS' (rounded to fp32), must match the specification's per-chunk
gradients (gdn/bwd_chunked.py, _chunk_bwd): dq and dk per value head, dbeta, and dg after the in-chunk
reverse cumsum. Cases: ragged lengths, T = 1, a full chunk, GVA 1-3, a g = 0 head, a strong-decay head.
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

from qla_kernels.gdn.bwd.chunk_grads import PASS_CONFIGS, bwd_chunk_grads_program
from qla_kernels.gdn.bwd.fused_ws import bwd_fused_ws_program
from qla_kernels.gdn.bwd_chunked import _chunk, _chunk_bwd
from qla_kernels.gdn.plan import build_plan_from_list

D = 128
SCALE = D**-0.5
CASES = [
    # (cu_seqlens, h_qk, h_v)
    ([0, 150], 1, 1),
    ([0, 1, 65, 130, 200], 1, 3),
    ([0, 64, 100], 2, 4),
]


@pytest.fixture(
    scope="module",
    params=[
        (False, False, False, False, False, False),
        (True, False, False, False, False, False),
        (True, True, False, False, False, False),
        (True, True, True, False, False, False),
        (True, True, True, True, False, False),
        (True, True, True, True, True, False),
        (True, True, True, True, True, True),
    ],
    ids=[
        "rev1-element-loads", "rev2-tile-loads", "rev3-hoisted-indices", "rev6-dw-beta-fp32", "rev7-gamma-fragment",
        "rev12-lean", "rev13-lean-dg-i2",
    ],
)
def kernel(request):
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    tile_loads, hoist, dw_beta, gamma_frag, lean, dg_i2 = request.param
    program = bwd_chunk_grads_program(
        D, D, SCALE, "float32", cpu_debug=True, tile_loads=tile_loads, hoist_index=hoist, dw_beta_fp32=dw_beta,
        gamma_frag=gamma_frag, lean=lean, dg_i2=dg_i2,
    )  # fmt: skip
    return tilelang.compile(program, target="c", pass_configs=cfg)


def make(cu, h_qk, h_v, seed):
    nt = cu[-1]
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(1, nt, h_qk, D, generator=gen), dim=-1)
    k = F.normalize(torch.randn(1, nt, h_qk, D, generator=gen), dim=-1)
    v = torch.randn(1, nt, h_v, D, generator=gen)
    g = F.logsigmoid(torch.randn(1, nt, h_v, generator=gen)) / 64
    g[..., 0] = 0.0
    if h_v > 2:
        g[..., 1] = -20.0
    beta = torch.sigmoid(torch.randn(1, nt, h_v, generator=gen))
    gc = torch.zeros_like(g)
    a0 = torch.zeros(1, nt, h_v, 64)
    for s, e in itertools.pairwise(cu):
        for c0 in range(s, e, 64):
            c1 = min(c0 + 64, e)
            gc[0, c0:c1] = torch.cumsum(g[0, c0:c1], 0)
            n = c1 - c0
            a0[0, c0:c1, :, :n] = torch.tril(torch.randn(h_v, n, n, generator=gen) / 8).transpose(0, 1)
    do = torch.randn(1, nt, h_v, D, generator=gen)
    ds = [torch.randn(h_v, D, D, generator=gen) for _ in range(len(cu) - 1)]
    return q, k, v, gc, beta, a0, do, ds


def reference(q, k, v, gc, beta, a0, do, ds_last, cu, extra=False):
    """float64: per chunk (S_c, dS'_c) and the chunk's gradients, from the specification; extra=True adds dv and
    dh0 (the gradient of each sequence's start state) to the gradients."""
    h_qk, h_v = q.shape[2], gc.shape[2]
    r = h_v // h_qk
    f = [x[0].double() for x in (q, k, v, gc, beta, a0, do)]
    names = ("dq", "dk", "dv") if extra else ("dq", "dk")
    states, ds_next, grads = [], [], {n: torch.zeros(q.shape[1], h_v, D, dtype=torch.float64) for n in names}
    grads.update({n: torch.zeros(q.shape[1], h_v, dtype=torch.float64) for n in ("dbeta", "dg")})
    dh0 = []
    for s, (lo, hi) in enumerate(itertools.pairwise(cu)):
        st = torch.randn(h_v, D, D, generator=torch.Generator().manual_seed(s), dtype=torch.float64) / 4
        starts = list(range(lo, hi, 64))
        seq_states = []
        for c0 in starts:
            seq_states.append(st)
            st = _chunk(f[0], f[1], f[2], f[3], f[4], f[5], c0, min(c0 + 64, hi), r, SCALE, st)[0]
        dsn = ds_last[s].double()
        seq_ds = []
        for c0, s_c in zip(reversed(starts), reversed(seq_states)):
            c1 = min(c0 + 64, hi)
            seq_ds.append(dsn)
            out = _chunk_bwd(*f, c0, c1, r, SCALE, s_c, dsn)
            for n in grads:
                grads[n][c0:c1] = out[n]
            dsn = out["ds"]
        states += seq_states
        ds_next += reversed(seq_ds)
        dh0.append(dsn)
    if extra:
        grads["dh0"] = torch.stack(dh0)
    return torch.stack(states), torch.stack(ds_next), grads


def rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-h{c[1]}/{c[2]}")
def test_chunk_grads_match_float64(kernel, case):
    cu, h_qk, h_v = case
    q, k, v, gc, beta, a0, do, ds_last = make(cu, h_qk, h_v, seed=len(cu) + 10 * h_v)
    states, ds_next, ref = reference(q, k, v, gc, beta, a0, do, ds_last, cu)
    plan = build_plan_from_list(cu, "cpu")
    nt = cu[-1]
    out = {n: torch.full((1, nt, h_v, D), float("nan")) for n in ("dq", "dk")}
    out.update({n: torch.full((1, nt, h_v), float("nan")) for n in ("dbeta", "dg")})
    kernel(q, k, v, gc, beta, a0, do, states.float(), ds_next.float(), plan.cu_seqlens, plan.chunk_indices,
           out["dq"], out["dk"], out["dbeta"], out["dg"])  # fmt: skip
    errs = {n: rel(out[n][0], ref[n]) for n in ref}
    assert all(e < 1e-4 for e in errs.values()), errs


@pytest.fixture(scope="module")
def fused_kernel():
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    program = bwd_chunk_grads_program(
        D, D, SCALE, "float32", cpu_debug=True, tile_loads=True, hoist_index=True, dw_beta_fp32=True,
        gamma_frag=True, store_dv=True, lean=True, fused=True,
    )  # fmt: skip
    return tilelang.compile(program, target="c", pass_configs=cfg)


def check_fused(kernel, case):
    """Run a fused backward program (the fused walk's signature) on the case; every gradient, dv and dh0 against
    float64."""
    cu, h_qk, h_v = case
    q, k, v, gc, beta, a0, do, ds_last = make(cu, h_qk, h_v, seed=len(cu) + 10 * h_v)
    states, _, ref = reference(q, k, v, gc, beta, a0, do, ds_last, cu, extra=True)
    plan = build_plan_from_list(cu, "cpu")
    nt = cu[-1]
    out = {n: torch.full((1, nt, h_v, D), float("nan")) for n in ("dq", "dk", "dv")}
    out.update({n: torch.full((1, nt, h_v), float("nan")) for n in ("dbeta", "dg")})
    slots = torch.stack(ds_last).float()  # dht in; dh0 out
    kernel(q, k, v, gc, beta, a0, do, states.float(), slots, plan.cu_seqlens, plan.chunk_offsets,
           out["dq"], out["dk"], out["dbeta"], out["dg"], out["dv"])  # fmt: skip
    out["dh0"] = slots
    errs = {n: rel(out[n][0] if n != "dh0" else out[n], ref[n]) for n in ref}
    assert all(e < 1e-4 for e in errs.values()), errs


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-h{c[1]}/{c[2]}")
def test_fused_walk_matches_float64(fused_kernel, case):
    """The fused backward (session 23): one CTA per (sequence, value head) walks the chunks last to first, carrying
    dS' in fp32 through its slot of ds_slots (dht in, dh0 out) while it forms every chunk's gradients and dv; the
    chunk start states are inputs. Every gradient, dv and dh0 against float64."""
    check_fused(fused_kernel, case)


@pytest.fixture(scope="module", params=["ws", "ws2", "ws3"], ids=["ws", "ws2-dq-aside", "ws3-early-release"])
def fused_ws_kernel(request):
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    program = bwd_fused_ws_program(D, D, SCALE, "float32", cpu_debug=True, dq_aside=request.param == "ws2",
                                   early_release=request.param == "ws3")  # fmt: skip
    return tilelang.compile(program, target="c", pass_configs=cfg)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-h{c[1]}/{c[2]}")
def test_fused_ws_matches_float64(fused_ws_kernel, case):
    """The warp-specialised fused backward (session 28, bwd/fused_ws.py): its role phases, run one after another
    in an order the hand-offs allow, with the GPU build's buffer reuse (V's tile holding D_r Vn, Vn's dVn, P's T
    and dKKt, dA0's dKKt + dKKt^T; ws3: dVn in the tile of WG0's scale D dO parts). Every gradient, dv and dh0
    against float64."""
    check_fused(fused_ws_kernel, case)
