"""Stage 1 of the TileLang backward (gdn/bwd/dstate_chain.py), run on the CPU through TileLang's C backend.

The program is the GPU kernel's own code with its GEMMs as loops (cpu_debug=True), in fp32: grid decode,
GVA head mapping, the reverse chunk walk, ragged-tail masks, V-slicing, dht and the per-chunk dS' store.
It must match the float64 chain of gdn/bwd_chunked.py (the specification) to fp32 rounding.
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

from qla_kernels.gdn.bwd.dstate_chain import PASS_CONFIGS, bwd_dstate_program
from qla_kernels.gdn.bwd_chunked import dstate_chain

D = 128
SCALE = D**-0.5
CASES = [
    # (cu_seqlens, h_qk, h_v, block_v, use_dht)
    ([0, 300], 2, 4, 64, True),
    ([0, 1, 65, 130, 200], 1, 3, 128, False),  # T = 1, a full chunk, ragged, GVA 3
    ([0, 64, 128], 2, 2, 64, True),
]


@pytest.fixture(scope="module")
def kernels():
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    return {
        (bv, dht, rev2): tilelang.compile(
            bwd_dstate_program(D, D, SCALE, "float32", dht, block_v=bv, cpu_debug=True, pipelined=rev2),
            target="c",
            pass_configs=cfg,
        )
        for bv, dht in {(c[3], c[4]) for c in CASES}
        for rev2 in (False, True)
    }


def make(cu, h_qk, h_v, seed):
    nt = cu[-1]
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(1, nt, h_qk, D, generator=gen), dim=-1)
    k = F.normalize(torch.randn(1, nt, h_qk, D, generator=gen), dim=-1)
    g = F.logsigmoid(torch.randn(1, nt, h_v, generator=gen)) / 64  # exp(gamma) about 0.4 per chunk
    g[..., 0] = 0.0  # a head that never decays
    if h_v > 2:
        g[..., 1] = -20.0  # strong decay
    gc = torch.zeros_like(g)
    for s, e in itertools.pairwise(cu):
        for c0 in range(s, e, 64):
            gc[0, c0 : min(c0 + 64, e)] = torch.cumsum(g[0, c0 : min(c0 + 64, e)], 0)
    beta = torch.sigmoid(torch.randn(1, nt, h_v, generator=gen))
    a0 = torch.tril(torch.randn(1, nt, h_v, 64, generator=gen) / 8)  # the chain reads A0 as data
    do = torch.randn(1, nt, h_v, D, generator=gen)
    dht = torch.randn(len(cu) - 1, h_v, D, D, generator=gen)
    return q, k, gc, beta, a0, do, dht


def rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("pipelined", [False, True], ids=["rev1", "rev2-tile-loads"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-h{c[1]}/{c[2]}-bv{c[3]}-dht{int(c[4])}")
def test_chain_matches_float64(kernels, case, pipelined):
    cu, h_qk, h_v, bv, use_dht = case
    q, k, gc, beta, a0, do, dht = make(cu, h_qk, h_v, seed=len(cu) + h_v)
    n_chunks = [-(-(e - s) // 64) for s, e in itertools.pairwise(cu)]
    offsets = torch.tensor([0, *itertools.accumulate(n_chunks)], dtype=torch.int32)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    dv = torch.full((1, cu[-1], h_v, D), float("nan"))  # every valid row must be written
    ds_next = torch.full((sum(n_chunks), h_v, D, D), float("nan"))
    dh0 = torch.full((len(cu) - 1, h_v, D, D), float("nan"))
    kernels[(bv, use_dht, pipelined)](q, k, gc, beta, a0, do, dht, cu_t, offsets, dv, ds_next, dh0)
    ref_ds, ref_dv, ref_dh0 = dstate_chain(q, k, gc, beta, a0, do, dht if use_dht else None, SCALE, cu)
    if not use_dht:  # dS' of every sequence's last chunk is then exactly zero
        assert all(ds_next[int(o) - 1].abs().max() == 0 for o in offsets[1:])
    assert rel(ds_next, ref_ds) < 2e-5 and rel(dh0, ref_dh0) < 2e-5
    assert rel(dv[0], ref_dv) < 2e-5


@pytest.fixture(scope="module")
def rev3_kernels():
    """Stage 1 rev 3 and rev 4: bwd/dvl_wk.py's parallel part, then the chain over its dvl and Wk. In fp32 rev 4's
    low part of scale D dO is exactly zero, so rev 4 must match float64 like rev 3: a wrong sign or a
    missing subtraction in the split counts the product twice and fails."""
    from qla_kernels.gdn.bwd.dvl_wk import bwd_dvl_wk_program

    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    pre = tilelang.compile(bwd_dvl_wk_program(D, D, SCALE, "float32", cpu_debug=True), target="c", pass_configs=cfg)
    chains = {
        (bv, dht, split): tilelang.compile(
            bwd_dstate_program(
                D, D, SCALE, "float32", dht, block_v=bv, cpu_debug=True, pipelined=True, precomputed=True,
                dod_split=split != "rev3", async_dod=split == "rev5",
            ),
            target="c",
            pass_configs=cfg,
        )
        for bv, dht in {(c[3], c[4]) for c in CASES}
        for split in ("rev3", "rev4", "rev5")
    }
    return pre, chains


@pytest.mark.parametrize("split", ["rev3", "rev4", "rev5"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-h{c[1]}/{c[2]}-bv{c[3]}-dht{int(c[4])}")
def test_rev3_chain_over_precomputed_parts_matches_float64(rev3_kernels, case, split):
    from qla_kernels.gdn.plan import build_plan_from_list

    pre, chains = rev3_kernels
    cu, h_qk, h_v, bv, use_dht = case
    q, k, gc, beta, a0, do, dht = make(cu, h_qk, h_v, seed=len(cu) + h_v)
    plan = build_plan_from_list(cu, "cpu")
    nt = cu[-1]
    # rows past a sequence's end are never written: the chain must not read them unmasked
    dvl = torch.full((1, nt, h_v, D), 0.0)
    wk = torch.full((1, nt, h_v, D), 0.0)
    pre(q, k, gc, beta, a0, do, plan.cu_seqlens, plan.chunk_indices, dvl, wk)
    ds_next = torch.full((plan.num_chunks, h_v, D, D), float("nan"))
    dh0 = torch.full((len(cu) - 1, h_v, D, D), float("nan"))
    chains[(bv, use_dht, split)](q, k, gc, do, dvl, wk, dht, plan.cu_seqlens, plan.chunk_offsets, ds_next, dh0)
    ref_ds, _, ref_dh0 = dstate_chain(q, k, gc, beta, a0, do, dht if use_dht else None, SCALE, cu)
    assert rel(ds_next, ref_ds) < 2e-5 and rel(dh0, ref_dh0) < 2e-5


def test_pass_a_chain_stores_only_the_start_gradients():
    """store_ds=False (the fused backward's pass A, bwd_api._bwd_fused): dh0 as the storing chain computes it, and
    ds_next, a one-chunk stand-in, left untouched."""
    from qla_kernels.gdn.bwd.dvl_wk import bwd_dvl_wk_program
    from qla_kernels.gdn.plan import build_plan_from_list

    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    pre = tilelang.compile(bwd_dvl_wk_program(D, D, SCALE, "float32", cpu_debug=True), target="c", pass_configs=cfg)
    program = bwd_dstate_program(D, D, SCALE, "float32", False, block_v=64, cpu_debug=True, pipelined=True,
                                 precomputed=True, dod_split=True, store_ds=False)  # fmt: skip
    chain = tilelang.compile(program, target="c", pass_configs=cfg)
    cu, h_qk, h_v = [0, 1, 65, 200], 1, 2
    q, k, gc, beta, a0, do, _ = make(cu, h_qk, h_v, seed=7)
    plan = build_plan_from_list(cu, "cpu")
    nt = cu[-1]
    dvl = torch.zeros(1, nt, h_v, D)
    wk = torch.zeros(1, nt, h_v, D)
    pre(q, k, gc, beta, a0, do, plan.cu_seqlens, plan.chunk_indices, dvl, wk)
    unused = torch.full((1, h_v, D, D), float("nan"))
    dh0 = torch.full((len(cu) - 1, h_v, D, D), float("nan"))
    chain(q, k, gc, do, dvl, wk, torch.zeros(1, h_v, D, D), plan.cu_seqlens, plan.chunk_offsets, unused, dh0)
    _, _, ref_dh0 = dstate_chain(q, k, gc, beta, a0, do, None, SCALE, cu)
    assert rel(dh0, ref_dh0) < 2e-5
    assert torch.isnan(unused).all()
