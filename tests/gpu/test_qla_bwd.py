"""The differentiable qla forward on the H200: TileLang forward + chunk-form backward (gdn/autograd.py)
against float64 autograd through the reference, on the forward suite's inputs.

Issue 6 tolerances: relative L2 <= 0.01 on dq, dk, dv, dh0 and <= 0.02 on dg, dbeta. Both backwards
behind $QLA_BWD_IMPL run: "torch" (the chunk-form specification) and "tilelang" (bwd_api.py: state
store, reverse dS chain, per-chunk gradients). Only numerics are checked here, never speed.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu.test_qla_fwd import CASES, case_inputs, rel_l2  # noqa: E402

from qla_bench.reference import chunk_gated_delta_rule_ref_grads  # noqa: E402
from qla_kernels import chunk_gated_delta_rule  # noqa: E402

TOL = {"dq": 0.01, "dk": 0.01, "dv": 0.01, "dh0": 0.01, "dg": 0.02, "dbeta": 0.02}


@pytest.mark.parametrize("impl", ["torch", "tilelang"])
@pytest.mark.parametrize("name", list(CASES))
def test_autograd_matches_float64(name, impl, monkeypatch):
    monkeypatch.setenv("QLA_BWD_IMPL", impl)
    q, k, v, g, beta, s0, cu = case_inputs(name)
    n, h_v, dtype = (cu.numel() - 1 if cu is not None else q.shape[0]), v.shape[2], v.dtype
    gen = torch.Generator(device="cuda").manual_seed(1)
    do = torch.randn(v.shape, generator=gen, device="cuda").to(dtype)
    dht = torch.randn(n, h_v, 128, 128, generator=gen, device="cuda")
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta)]
    h0_leaf = s0.detach().clone().requires_grad_(True) if s0 is not None else None
    o, ht = chunk_gated_delta_rule(*leaves, initial_state=h0_leaf, output_final_state=True, cu_seqlens=cu)
    ((o.float() * do.float()).sum() + (ht * dht).sum()).backward()
    ref = chunk_gated_delta_rule_ref_grads(
        q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), do.cpu(), dht.cpu(), None,
        None if s0 is None else s0.cpu(), None if cu is None else cu.cpu(),
    )
    got = dict(zip(("dq", "dk", "dv", "dg", "dbeta"), (x.grad for x in leaves)))
    if h0_leaf is not None:
        got["dh0"] = h0_leaf.grad
    errs = {n_: rel_l2(got[n_], ref[n_]) for n_ in got}
    print(f"\n[qla-bwd {impl}] {name}: " + " ".join(f"{n_}={e:.2e}" for n_, e in errs.items()))
    for n_, e in errs.items():
        assert e <= TOL[n_], (n_, e)



@pytest.mark.parametrize("name", [n for n in CASES if CASES[n][5] == torch.bfloat16])  # the precompiled dtype
def test_chunk_states_ws5_matches_v2(name, monkeypatch):
    """Stage 0's ws5 state store against the v2 one (checked on the H200 since session 3): both store the
    bf16 state each chunk's GEMMs used, so they agree to bf16 rounding of two fp32 accumulation orders;
    every chunk of every sequence is compared, so a wrong chunk offset or V-slice fails."""
    from qla_kernels.gdn import bwd_api
    from qla_kernels.gdn.api import _plan, chunk_gated_delta_rule_fwd, pack_tokens

    q, k, v, g, beta, s0, cu = case_inputs(name)
    fwd = chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu)
    plan = _plan(q, cu)
    qf, kf, vf, af = (pack_tokens(x) for x in (q, k, v, fwd.a0))
    gf, bf = (pack_tokens(x).float() for x in (fwd.g_cumsum, beta))
    got = {}
    for impl in bwd_api.STATES_IMPLS:
        monkeypatch.setenv(bwd_api.STATES_IMPL_ENV, impl)
        got[impl] = bwd_api.chunk_states(qf, kf, vf, gf, bf, af, s0, plan, 128**-0.5).float()
    per_chunk = [rel_l2(got["ws5"][c], got["v2"][c]) for c in range(plan.num_chunks)]
    print(f"\n[states ws5 vs v2] {name}: chunks={plan.num_chunks} worst={max(per_chunk):.2e}")
    assert max(per_chunk) <= 5e-3, max(per_chunk)
    # ws12 (session 24) forms each chunk's values otherwise (U - Wk bf(S) from Agb): the same states to the
    # roundings of two formations, every chunk of every sequence stored
    per_chunk = [rel_l2(got["ws12"][c], got["v2"][c]) for c in range(plan.num_chunks)]
    print(f"[states ws12 vs v2] {name}: worst={max(per_chunk):.2e}")
    assert max(per_chunk) <= 1e-2, max(per_chunk)



def _stage_inputs(h_qk: int, h_v: int, lens: list[int], seed: int):
    """Random inputs (make_inputs, with h0) over sequences of these lengths, the forward's outputs, dO, and the
    packed tensors, chunk states and dS' the backward's stages take: what every stage test here starts from."""
    import itertools
    from types import SimpleNamespace

    from gpu.test_qla_fwd import make_inputs

    from qla_kernels.gdn import bwd_api
    from qla_kernels.gdn.api import _plan, chunk_gated_delta_rule_fwd, pack_tokens

    t = sum(lens)
    (q, k, v, g, beta), s0 = make_inputs(1, t, h_qk, h_v, seed=seed, n=len(lens))
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    fwd = chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu)
    do = torch.randn_like(v)
    scale = 128**-0.5
    plan = _plan(q, cu)
    qf, kf, vf, af, dof = (pack_tokens(x) for x in (q, k, v, fwd.a0, do))
    gf, bf = (pack_tokens(x).float() for x in (fwd.g_cumsum, beta))
    states = bwd_api.chunk_states(qf, kf, vf, gf, bf, af, s0, plan, scale)
    ds_next = bwd_api._dstate_packed(qf, kf, gf, bf, af, dof, None, plan, scale, None).ds_next
    return SimpleNamespace(q=q, k=k, v=v, g=g, beta=beta, s0=s0, cu=cu, fwd=fwd, do=do, scale=scale, plan=plan,
                           qf=qf, kf=kf, vf=vf, af=af, dof=dof, gf=gf, bf=bf, states=states, ds_next=ds_next)


BWD_TIMING = [(2, 8, "1x32768"), (16, 32, "1x32768"), (16, 32, "8192x4"), (16, 64, "1024x8")]


def _time_bwd_config(h_qk: int, h_v: int, mix: str, flusher) -> dict:
    import statistics

    from qla_bench.timing import time_cuda_events
    from qla_bench.workload import parse_seqlens
    from qla_kernels.gdn import bwd_api
    from qla_kernels.gdn.api import chunk_gated_delta_rule_fwd

    lens = parse_seqlens(mix)  # the harness's labels: "1xL" one sequence, "LxN" N sequences of L
    x = _stage_inputs(h_qk, h_v, lens, 3)
    q, k, v, g, beta, s0, cu, fwd, do, scale, plan = (x.q, x.k, x.v, x.g, x.beta, x.s0, x.cu, x.fwd, x.do, x.scale,
                                                      x.plan)  # fmt: skip
    qf, kf, vf, af, dof, gf, bf, states, ds_next = (x.qf, x.kf, x.vf, x.af, x.dof, x.gf, x.bf, x.states,
                                                    x.ds_next)  # fmt: skip
    calls = {
        "fwd": lambda: chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu),
        "stage0_states": lambda: bwd_api.chunk_states(qf, kf, vf, gf, bf, af, s0, plan, scale),
        "stage1_dstate": lambda: bwd_api._dstate_packed(qf, kf, gf, bf, af, dof, None, plan, scale, None),
        "stage2_grads": lambda: bwd_api.chunk_bwd_grads(qf, kf, vf, gf, bf, af, dof, states, ds_next, plan, scale),
        "bwd_total": lambda: bwd_api.chunk_gated_delta_rule_bwd(
            q, k, v, fwd.g_cumsum, beta, fwd.a0, do, None, scale, s0, cu
        ),
    }
    row: dict = {"h_qk": h_qk, "h_v": h_v, "seqs": mix}
    for name, fn in calls.items():
        row[name] = statistics.median(time_cuda_events(fn, 20, flusher).samples_ms)
    for impl in bwd_api.STATES_IMPLS:  # stage 0's implementations side by side
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(bwd_api.STATES_IMPL_ENV, impl)
            row[f"stage0_{impl}"] = statistics.median(time_cuda_events(calls["stage0_states"], 20, flusher).samples_ms)
    for rev in bwd_api.GRADS_REVS:  # each stage's revisions side by side (stage 1 has rev1 to rev3)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("QLA_BWD_GRADS", rev)
            if rev in bwd_api.DSTATE_REVS:  # rev3 includes its parallel part (bwd/dvl_wk.py)
                mp.setenv("QLA_BWD_DSTATE", rev)
                row[f"stage1_{rev}"] = statistics.median(
                    time_cuda_events(calls["stage1_dstate"], 20, flusher).samples_ms
                )
            row[f"stage2_{rev}"] = statistics.median(time_cuda_events(calls["stage2_grads"], 20, flusher).samples_ms)
    return row


def test_time_bwd_stages():
    """Where the TileLang backward's time goes (stage 0 state store, stage 1 dS chain, stage 2 per-chunk
    gradients) and the whole bwd_api call; CUDA events, L2 flushed, median of 20; $OUT/bwd_timing.json.
    Not an assertion on speed: it is what kernels/NOTES.md compares with FlashQLA's backward."""
    import json
    import os

    from qla_bench.timing import L2Flusher

    flusher = L2Flusher(torch.device("cuda"))
    rows = []
    for h_qk, h_v, mix in BWD_TIMING:
        row = _time_bwd_config(h_qk, h_v, mix, flusher)
        rows.append(row)
        times = " ".join(f"{c}={row[c]:.4f}" for c in row if c not in ("h_qk", "h_v", "seqs"))
        print(f"[bwd-timing] {h_qk}/{h_v} {mix}: {times}", flush=True)
    out_dir = os.environ.get("OUT") or "out"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bwd_timing.json"), "w") as fh:
        json.dump(
            {"timer": "cuda-events, L2 flushed, median of 20", "device": torch.cuda.get_device_name(), "rows": rows},
            fh,
            indent=1,
        )



BLOCK_V_TIMING = [(16, 32, "1x32768"), (16, 32, "16384x2"), (16, 32, "8192x4"), (8, 16, "16384x2"), (4, 8, "8192x4")]


def _time_block_v_config(h_qk: int, h_v: int, mix: str, flusher) -> dict:
    import statistics

    from qla_bench.timing import time_cuda_events
    from qla_bench.workload import parse_seqlens
    from qla_kernels.gdn import bwd_api
    from qla_kernels.gdn.api import _TL_DTYPE, _num_sms
    from qla_kernels.gdn.bwd.dvl_wk import bwd_dvl_wk_kernel
    from qla_kernels.gdn.plan import choose_block_v

    lens = parse_seqlens(mix)
    t = sum(lens)
    x = _stage_inputs(h_qk, h_v, lens, 3)
    q, k, v, beta, s0, cu, fwd, do, scale, plan = x.q, x.k, x.v, x.beta, x.s0, x.cu, x.fwd, x.do, x.scale, x.plan
    qf, kf, vf, af, dof, gf, bf, states, ds_next = (x.qf, x.kf, x.vf, x.af, x.dof, x.gf, x.bf, x.states,
                                                    x.ds_next)  # fmt: skip
    dvl = torch.empty(*dof.shape, dtype=torch.float32, device="cuda")
    wk = torch.empty(1, t, h_v, 128, dtype=q.dtype, device="cuda")
    pre = bwd_dvl_wk_kernel(128, 128, scale, _TL_DTYPE[q.dtype])
    dv = torch.empty_like(vf)
    calls = {
        "dvl_wk": lambda: pre(qf, kf, gf, bf, af, dof, plan.cu_seqlens, plan.chunk_indices, dvl, wk),
        "stage1_bv32": lambda: bwd_api._dstate_packed(qf, kf, gf, bf, af, dof, None, plan, scale, 32),
        "stage1_bv64": lambda: bwd_api._dstate_packed(qf, kf, gf, bf, af, dof, None, plan, scale, 64),
        "stage0_states": lambda: bwd_api.chunk_states(qf, kf, vf, gf, bf, af, s0, plan, scale),
        "stage2_grads_dv": lambda: bwd_api.chunk_bwd_grads(
            qf, kf, vf, gf, bf, af, dof, states, ds_next, plan, scale, dv
        ),
        "bwd_total": lambda: bwd_api.chunk_gated_delta_rule_bwd(
            q, k, v, fwd.g_cumsum, beta, fwd.a0, do, None, scale, s0, cu
        ),
    }
    row: dict = {
        "h_qk": h_qk,
        "h_v": h_v,
        "seqs": mix,
        "rule_block_v": choose_block_v(len(lens), h_v),  # rev1/rev2's pair-count rule (session 6's call 5 row)
        "dstate_rule_block_v": bwd_api.choose_block_v_dstate(plan, h_v, _num_sms(q.device)),
    }
    for name, fn in calls.items():
        row[name] = statistics.median(time_cuda_events(fn, 20, flusher).samples_ms)
    return row


def test_time_dstate_block_v():
    """Stage 1 rev3's V-slice measured both ways, with its parallel part (bwd/dvl_wk.py) alone and the
    other stages, on configs either side of the width rules; $OUT/bwd_block_v.json. Not an assertion on
    speed: it is what bwd_cp_plan.DSTATE_STEP_US and choose_block_v_dstate are fitted from."""
    import json
    import os

    from qla_bench.timing import L2Flusher

    flusher = L2Flusher(torch.device("cuda"))
    rows = []
    for h_qk, h_v, mix in BLOCK_V_TIMING:
        rows.append(_time_block_v_config(h_qk, h_v, mix, flusher))
        print(f"[bwd-block-v] {rows[-1]}", flush=True)
    out_dir = os.environ.get("OUT") or "out"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bwd_block_v.json"), "w") as fh:
        json.dump({"timer": "cuda-events, L2 flushed, median of 20", "rows": rows}, fh, indent=1)


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_group_sum_kernel_matches_torch(group, monkeypatch):
    """bwd/group_sum.py against the torch path on the same fp32 per-value-head gradients: equal bit for bit
    at r = 2 (both add two fp32 values once and round once), within a bf16 rounding elsewhere (torch's sum
    may order the adds differently)."""
    from qla_kernels.gdn import bwd_api

    t, h_qk = 1000, 3
    gen = torch.Generator(device="cuda").manual_seed(group)
    dq_v, dk_v = (torch.randn(1, t, h_qk * group, 128, generator=gen, device="cuda") for _ in range(2))
    got = {}
    for impl in bwd_api.GROUP_SUM_IMPLS:
        monkeypatch.setenv(bwd_api.GROUP_SUM_ENV, impl)
        got[impl] = bwd_api._group_sums(dq_v, dk_v, 1, t, h_qk, torch.bfloat16)
    for a, b in zip(got["kernel"], got["torch"]):
        assert a.dtype == b.dtype == torch.bfloat16 and a.shape == b.shape == (1, t, h_qk, 128)
        if group <= 2:
            assert torch.equal(a, b)
        else:
            assert rel_l2(a, b.float()) < 4e-3


REV9_CASES = {  # (h_qk, h_v, sequence lengths): GVA ratios 1 and 2, ragged, a sequence of one token
    "gva2_ragged_1000+3096+1": (2, 4, [1000, 3096, 1]),
    "gva1_ragged_65+640": (3, 3, [65, 640]),
    "gva2_16x32_2x512": (16, 32, [512, 512]),
}


@pytest.mark.parametrize("rev", ["rev9", "rev10"])
@pytest.mark.parametrize("name", list(REV9_CASES))
def test_stage2_rev9_sums_equal_rev8(name, rev, monkeypatch):
    """Stage 2 rev 9 (dq, dk summed over the GVA group inside a 2-CTA cluster, bwd/chunk_grads.py's
    cluster_sum) against rev 8 followed by the group-sum kernel on the same inputs: both add the same two fp32
    tiles once and round once, so dq, dk must agree bit for bit; dv, dbeta and dg come from the same code."""


    from qla_kernels.gdn import bwd_api

    h_qk, h_v, lens = REV9_CASES[name]
    t = sum(lens)
    x = _stage_inputs(h_qk, h_v, lens, 5)
    q, scale, plan = x.q, x.scale, x.plan
    qf, kf, vf, af, dof, gf, bf, states, ds_next = (x.qf, x.kf, x.vf, x.af, x.dof, x.gf, x.bf, x.states,
                                                    x.ds_next)  # fmt: skip
    out = {}
    for grads, summed in (("rev8", False), (rev, True)):
        monkeypatch.setenv(bwd_api.GRADS_REV_ENV, grads)
        monkeypatch.setenv(bwd_api.GROUP_SUM_ENV, "kernel")
        dv = torch.full_like(vf, float("nan"))
        dq, dk, dbeta, dg = bwd_api.chunk_bwd_grads(qf, kf, vf, gf, bf, af, dof, states, ds_next, plan, scale, dv,
                                                    summed)  # fmt: skip
        if not summed:
            dq, dk = bwd_api._group_sums(dq, dk, 1, t, h_qk, q.dtype)
        out[grads] = {"dq": dq.view(1, t, h_qk, 128), "dk": dk.view(1, t, h_qk, 128), "dv": dv, "dbeta": dbeta,
                      "dg": dg}  # fmt: skip
    diffs = {n: (out[rev][n].float() - out["rev8"][n].float()).abs().max().item() for n in out["rev8"]}
    print(f"\n[stage2 {rev} vs rev8] {name}: max |diff| " + " ".join(f"{n}={d:.1e}" for n, d in diffs.items()))
    for n in out["rev8"]:
        assert not out[rev][n].isnan().any(), n
        assert torch.equal(out[rev][n], out["rev8"][n]), (n, diffs[n])


@pytest.mark.parametrize("name", list(REV9_CASES))
def test_stage2_rev11_matches_rev8(name, monkeypatch):
    """Stage 2 rev 11 (bwd/chunk_grads_ws.py, two warpgroups at once) against rev 8 on the same inputs: the same
    products and roundings in another order (the pair gate terms' column sums come from the transposed products),
    so every output agrees to fp32 summation-order noise, far inside the float64 checks' tolerances."""
    from qla_kernels.gdn import bwd_api

    h_qk, h_v, lens = REV9_CASES[name]
    x = _stage_inputs(h_qk, h_v, lens, 5)
    out = {}
    for rev in ("rev8", "rev11"):
        monkeypatch.setenv(bwd_api.GRADS_REV_ENV, rev)
        dv = torch.full_like(x.vf, float("nan"))
        dq, dk, dbeta, dg = bwd_api.chunk_bwd_grads(x.qf, x.kf, x.vf, x.gf, x.bf, x.af, x.dof, x.states, x.ds_next,
                                                    x.plan, x.scale, dv)  # fmt: skip
        out[rev] = {"dq": dq, "dk": dk, "dv": dv, "dbeta": dbeta, "dg": dg}
    diffs = {n: rel_l2(out["rev11"][n], out["rev8"][n]) for n in out["rev8"]}
    print(f"\n[stage2 rev11 vs rev8] {name}: rel-L2 " + " ".join(f"{n}={d:.1e}" for n, d in diffs.items()))
    for n, d in diffs.items():
        assert not out["rev11"][n].isnan().any(), n
        assert d <= 1e-3, (n, d)


STAGE2_CLUSTER_TIMING = [(16, 32, "1x32768"), (16, 32, "8192x4"), (2, 4, "1x8192")]


def _time_stage2_cluster_config(h_qk: int, h_v: int, mix: str, flusher) -> dict:
    import statistics

    from qla_bench.timing import time_cuda_events
    from qla_bench.workload import parse_seqlens
    from qla_kernels.gdn import bwd_api
    from qla_kernels.gdn.api import _TL_DTYPE
    from qla_kernels.gdn.bwd.chunk_grads import bwd_chunk_grads_kernel
    from qla_kernels.gdn.bwd.group_sum import gva_group_sum_kernel

    lens = parse_seqlens(mix)
    t = sum(lens)
    x = _stage_inputs(h_qk, h_v, lens, 3)
    q, scale, plan = x.q, x.scale, x.plan
    qf, kf, vf, af, dof, gf, bf, states, ds_next = (x.qf, x.kf, x.vf, x.af, x.dof, x.gf, x.bf, x.states,
                                                    x.ds_next)  # fmt: skip
    dt = _TL_DTYPE[q.dtype]
    threads, *flags = bwd_api.GRADS_FLAGS["rev8"]
    r = h_v // h_qk
    dq_v, dk_v = (torch.empty(1, t, h_v, 128, device="cuda") for _ in range(2))
    dq, dk = (torch.empty(1, t, h_qk, 128, dtype=q.dtype, device="cuda") for _ in range(2))
    dbeta, dg = (torch.empty(1, t, h_v, device="cuda") for _ in range(2))
    dv = torch.empty_like(vf)
    head = (qf, kf, vf, gf, bf, af, dof, states, ds_next, plan.cu_seqlens, plan.chunk_indices)
    rev8 = bwd_chunk_grads_kernel(128, 128, scale, dt, threads, False, False, *flags, True)
    probe = bwd_chunk_grads_kernel(128, 128, scale, dt, threads, False, False, *flags, True, cluster_probe=True)
    rev9 = bwd_chunk_grads_kernel(128, 128, scale, dt, threads, False, False, *flags, True, True, r)
    rev10 = bwd_chunk_grads_kernel(128, 128, scale, dt, threads, False, False, *flags, True, True, r, pair_early=True)
    from qla_kernels.gdn.bwd.chunk_grads_ws import bwd_chunk_grads_ws_kernel

    rev11 = bwd_chunk_grads_ws_kernel(128, 128, scale, dt)
    gsum = gva_group_sum_kernel(128, dt)
    grouped = (dq_v.view(t * h_qk, r, 128), dk_v.view(t * h_qk, r, 128), dq.view(t * h_qk, 128), dk.view(t * h_qk, 128))
    calls = {
        "rev8": lambda: rev8(*head, dq_v, dk_v, dbeta, dg, dv),
        "rev8_group_sum": lambda: (rev8(*head, dq_v, dk_v, dbeta, dg, dv), gsum(*grouped)),
        "rev8_cluster_launch": lambda: probe(*head, dq_v, dk_v, dbeta, dg, dv),
        "rev9": lambda: rev9(*head, dq, dk, dbeta, dg, dv),
        "rev10": lambda: rev10(*head, dq, dk, dbeta, dg, dv),
        "rev11": lambda: rev11(*head, dq_v, dk_v, dbeta, dg, dv),
    }
    row: dict = {"h_qk": h_qk, "h_v": h_v, "seqs": mix}
    for name, fn in calls.items():
        row[name] = statistics.median(time_cuda_events(fn, 20, flusher).samples_ms)
    return row


def test_time_stage2_cluster_sum():
    """Where rev 9's time goes (session 20: the backward 0.983x rev 8's on qwen35-bwd): stage 2 rev 8 with and
    without the group-sum kernel, rev 8 launched in 2-CTA clusters with no exchange (cluster_probe), rev 9, rev 10;
    and rev 11 (session 21, two warpgroups at once) beside them; $OUT/stage2_cluster.json. Not an assertion on
    speed."""
    import json
    import os

    from qla_bench.timing import L2Flusher

    flusher = L2Flusher(torch.device("cuda"))
    rows = []
    for h_qk, h_v, mix in STAGE2_CLUSTER_TIMING:
        rows.append(_time_stage2_cluster_config(h_qk, h_v, mix, flusher))
        print(f"[stage2-cluster] {rows[-1]}", flush=True)
    out_dir = os.environ.get("OUT") or "out"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "stage2_cluster.json"), "w") as fh:
        json.dump({"timer": "cuda-events, L2 flushed, median of 20", "rows": rows}, fh, indent=1)
