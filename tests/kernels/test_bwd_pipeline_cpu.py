"""The two TileLang backward stages composed on the CPU (TileLang's C backend, fp32), as bwd_api.py
chains them on the GPU: stage 1's dS' feeds stage 2 through the plan's chunk order, dq and dk are
summed over the GVA group, and the result must equal the whole torch backward (gdn/bwd_chunked.py) in
float64: all six gradients, with h0 and dht, ragged lengths and GVA 2. The chunk start states come from
the specification's forward (on the GPU the v2 forward's store_states mode writes them)."""

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

from qla_kernels.gdn.bwd import chunk_grads, dstate_chain, dvl_wk
from qla_kernels.gdn.bwd_chunked import _chunk, chunk_gated_delta_rule_bwd
from qla_kernels.gdn.plan import build_plan_from_list

D = 128
SCALE = D**-0.5


@pytest.mark.parametrize("dstate_rev", ["rev1", "rev3"])
def test_stages_compose_to_the_whole_backward(dstate_rev):
    """rev1: stage 1 writes dv. rev3: bwd/dvl_wk.py's parallel part, the chain over it, and stage 2
    writing dv (store_dv), as bwd_api chains them with $QLA_BWD_DSTATE=rev3."""
    cu, h_qk, h_v = [0, 70, 71, 200], 2, 4
    nt, r = cu[-1], h_v // h_qk
    gen = torch.Generator().manual_seed(7)
    q = F.normalize(torch.randn(1, nt, h_qk, D, generator=gen), dim=-1)
    k = F.normalize(torch.randn(1, nt, h_qk, D, generator=gen), dim=-1)
    v = torch.randn(1, nt, h_v, D, generator=gen)
    g = F.logsigmoid(torch.randn(1, nt, h_v, generator=gen)) / 64
    g[..., 0] = 0.0
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
    h0 = torch.randn(len(cu) - 1, h_v, D, D, generator=gen) / 4
    dht = torch.randn(len(cu) - 1, h_v, D, D, generator=gen)

    f = [x[0].double() for x in (q, k, v, gc, beta, a0)]
    states = []
    for s, (lo, hi) in enumerate(itertools.pairwise(cu)):
        st = h0[s].double()
        for c0 in range(lo, hi, 64):
            states.append(st)
            st = _chunk(*f, c0, min(c0 + 64, hi), r, SCALE, st)[0]
    states = torch.stack(states).float()

    cfg = {**dstate_chain.PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    rev3 = dstate_rev == "rev3"
    stage1 = tilelang.compile(dstate_chain.bwd_dstate_program(D, D, SCALE, "float32", True, 64, cpu_debug=True,
                                                              pipelined=rev3, precomputed=rev3),
                              target="c", pass_configs=cfg)  # fmt: skip
    stage2 = tilelang.compile(chunk_grads.bwd_chunk_grads_program(D, D, SCALE, "float32", cpu_debug=True,
                                                                  store_dv=rev3),
                              target="c", pass_configs=cfg)  # fmt: skip
    plan = build_plan_from_list(cu, "cpu")
    dv = torch.full((1, nt, h_v, D), float("nan"))  # every row must be written, by stage 1 or by stage 2
    ds_next = torch.empty(plan.num_chunks, h_v, D, D)
    dh0 = torch.empty(len(cu) - 1, h_v, D, D)
    if rev3:
        pre = tilelang.compile(dvl_wk.bwd_dvl_wk_program(D, D, SCALE, "float32", cpu_debug=True), target="c",
                               pass_configs=cfg)  # fmt: skip
        dvl, wk = torch.zeros(1, nt, h_v, D), torch.zeros(1, nt, h_v, D)
        pre(q, k, gc, beta, a0, do, plan.cu_seqlens, plan.chunk_indices, dvl, wk)
        stage1(q, k, gc, do, dvl, wk, dht, plan.cu_seqlens, plan.chunk_offsets, ds_next, dh0)
    else:
        stage1(q, k, gc, beta, a0, do, dht, plan.cu_seqlens, plan.chunk_offsets, dv, ds_next, dh0)
    dq_v, dk_v = torch.empty(1, nt, h_v, D), torch.empty(1, nt, h_v, D)
    dbeta, dg = torch.empty(1, nt, h_v), torch.empty(1, nt, h_v)
    args = (q, k, v, gc, beta, a0, do, states, ds_next, plan.cu_seqlens, plan.chunk_indices, dq_v, dk_v, dbeta, dg)
    stage2(*args, dv) if rev3 else stage2(*args)

    ref = chunk_gated_delta_rule_bwd(*(x.double() for x in (q, k, v, gc, beta, a0, do)), dht.double(), SCALE,
                                     h0.double(), torch.tensor(cu), compute_dtype=torch.float64)  # fmt: skip
    got = {
        "dq": dq_v.view(1, nt, h_qk, r, D).sum(3),
        "dk": dk_v.view(1, nt, h_qk, r, D).sum(3),
        "dv": dv,
        "dbeta": dbeta,
        "dg": dg,
        "dh0": dh0,
    }
    errs = {n: ((got[n].double() - getattr(ref, n)).norm() / getattr(ref, n).norm()).item() for n in got}
    assert all(e < 1e-4 for e in errs.values()), errs
