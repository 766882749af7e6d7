"""kkt v10 (fwd/kkt_solve_v10.py: the gated inverse in fp16 with whole-tile doublings) on the GPU host.

1. its Agb and g_cumsum against float64 (Gamma o A0 diag(beta) from the exact inverse) and against v4t's emit_agb
   output, on test_qla_kkt_v3's cases (ragged, T = 1, T = 65, GVA 1-4, fp16, correlated keys, g = 0 and strong
   decay heads);
2. the inference forward (need_a0=False: ws12) with kkt_impl="v10" against the float64 reference, no worse than
   with v4t;
3. timings (CUDA events, L2 flushed, median of 50): stage 1 alone and the whole forward, v4t against v10, printed
   and written to $OUT/kkt_v10_timing.json.

    source .ci/gpu-host-setup.sh; python -m pytest tests/gpu/test_qla_kkt_v10.py -q -s -rfE
"""

import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from kkt_test_helpers import exact_agb, load_test_module  # noqa: E402

from qla_bench.reference import chunk_gated_delta_rule_ref  # noqa: E402
from qla_bench.timing import L2Flusher  # noqa: E402
from qla_kernels.gdn import api  # noqa: E402

# the cases, inputs, float64 stage 1 and timing helpers of test_qla_kkt_v3
_v3 = load_test_module(Path(__file__).with_name("test_qla_kkt_v3.py"))
CASES, TIMING, TOL = _v3.CASES, _v3.TIMING, _v3.TOL
case_inputs, exact_stage1, make_inputs, rel_l2, _median_ms = (
    _v3.case_inputs, _v3.exact_stage1, _v3.make_inputs, _v3.rel_l2, _v3._median_ms
)
IMPLS = ("v4t", "v10")


def stage1_agb(impl, k, g, beta, cu):
    plan = api._plan(k, cu)
    packed = [api.pack_tokens(x) for x in (k, g, beta)]
    return api._launch_kkt(impl, *packed, plan, emit_agb=True)


@pytest.mark.parametrize("name", list(CASES))
def test_v10_agb_against_float64_and_v4t(name):
    _, k, _, g, beta, _, cu, offsets = case_inputs(name)
    ref_gc, ref_a0 = exact_stage1(k, g, beta, offsets)
    ref = exact_agb(ref_a0, ref_gc, beta, offsets)
    h_v = g.shape[-1]
    errs = {}
    for impl in IMPLS:
        gc, agb = stage1_agb(impl, k, g, beta, cu)
        torch.cuda.synchronize()
        assert torch.isfinite(agb).all() and torch.isfinite(gc).all(), impl
        agb = agb.reshape(-1, h_v, 64)
        errs[impl] = (rel_l2(gc.reshape(-1, h_v), ref_gc), rel_l2(agb, ref),
                      max(rel_l2(agb[:, h], ref[:, h]) for h in range(h_v)))  # fmt: skip
    print(f"\n[kkt-v10] {name}: " + " | ".join(f"{i} gc={e[0]:.1e} agb={e[1]:.2e} worst_head={e[2]:.2e}"
                                              for i, e in errs.items()))  # fmt: skip
    e_gc, e_agb, e_head = errs["v10"]
    assert e_gc < 1e-5 and e_agb < 1e-2 and e_head < 2e-2, errs
    assert e_agb <= 1.1 * errs["v4t"][1] + 1e-4, errs


@pytest.mark.parametrize("name", list(CASES))
def test_fwd_with_v10_matches_reference(name):
    q, k, v, g, beta, s0, cu, _ = case_inputs(name)
    ref_o, ref_s = chunk_gated_delta_rule_ref(
        q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), initial_state=None if s0 is None else s0.cpu(),
        output_final_state=True, cu_seqlens=None if cu is None else cu.cpu(),
    )
    res = {}
    for impl in IMPLS:
        out = api.chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu, kkt_impl=impl,
                                             need_a0=False)  # fmt: skip
        torch.cuda.synchronize()
        assert torch.isfinite(out.o).all() and torch.isfinite(out.final_state).all(), impl
        res[impl] = (rel_l2(out.o, ref_o), rel_l2(out.final_state, ref_s))
    print(f"\n[fwd-v10] {name}: " + " | ".join(f"{i} o={e[0]:.2e} state={e[1]:.2e}" for i, e in res.items()))
    eo, es = res["v10"]
    assert eo <= TOL and es <= TOL, res
    assert eo <= 1.05 * res["v4t"][0] + 1e-5 and es <= 1.05 * res["v4t"][1] + 1e-5, res


def _time_row(h_qk, h_v, lens, flusher):
    (q, k, v, g, beta), s0 = make_inputs(1, sum(lens), h_qk, h_v, torch.bfloat16, 0, True, len(lens), False)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    row = {"h_qk": h_qk, "h_v": h_v, "seqs": f"{lens[0]}x{len(lens)}"}
    for impl in IMPLS:
        row[f"kkt_{impl}"] = _median_ms(lambda impl=impl: stage1_agb(impl, k, g, beta, cu), flusher)
        row[f"fwd_{impl}"] = _median_ms(
            lambda impl=impl: api.chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu,
                                                             kkt_impl=impl, need_a0=False), flusher)  # fmt: skip
    return row


def test_time_v10():
    """Not an assertion on speed: stage 1 alone and the inference forward, v4t against v10."""
    flusher = L2Flusher(torch.device("cuda"))
    rows = [_time_row(h_qk, h_v, lens, flusher) for h_qk, h_v, lens in TIMING]
    cols = [c for c in rows[0] if c not in ("h_qk", "h_v", "seqs")]
    print("\n[kkt-v10-timing] ms, CUDA events, L2 flushed, median of 50")
    print(f"{'heads':>6} {'seqs':>8} " + " ".join(f"{c:>10}" for c in cols))
    for r in rows:
        print(f"{r['h_qk']:>2}/{r['h_v']:<3} {r['seqs']:>8} " + " ".join(f"{r[c]:>10.4f}" for c in cols))
    out_dir = os.environ.get("OUT") or "out"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "kkt_v10_timing.json"), "w") as fh:
        json.dump({"timer": "cuda-events, L2 flushed, median of 50", **_provenance(), "rows": rows}, fh, indent=1)


def _provenance() -> dict:
    """What a results file needs beside its rows: the device, the commit and the library versions."""
    from qla_bench.provenance import git_sha, library_versions

    return {"device": torch.cuda.get_device_name(), "git_sha": git_sha(), "versions": library_versions()}


def _phase_rows(h_qk, h_v, lens):
    """v10's and v4's profile readings on one config."""
    from qla_kernels.gdn.profile_fwd import profile_kkt, profile_kkt_v10

    (_, k, _, g, beta), _ = make_inputs(1, sum(lens), h_qk, h_v, torch.bfloat16, 7, False, len(lens), False)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    head = {"h_qk": h_qk, "h_v": h_v, "seqs": f"{lens[0]}x{len(lens)}"}
    return [{**head, **profile_kkt_v10(k, g, beta, cu)}, {**head, **profile_kkt(k, g, beta, cu, "v4")}]


def test_profile_v10_phases():
    """Not an assertion on speed: where a v10 CTA and a v4 CTA spend their cycles (profile builds), on the
    many-head many-sequence config and one long few-head sequence; $OUT/kkt_v10_phases.json for NOTES.md."""
    rows = _phase_rows(16, 64, [8192] * 4) + _phase_rows(2, 8, [32768])
    for r in rows:
        print(f"\n[kkt-phases] {r['h_qk']}/{r['h_v']} {r['seqs']} {r['impl']}: CTA {r['mean_cta_cycles']:.0f} cycles, "
              f"kernel {r['kernel_ms']:.4f} ms, same as plain: {r['same_as_plain_build']}; "
              + ", ".join(f"{p}={c:.0f}" for p, c in r["mean_cycles_per_phase"].items()))  # fmt: skip
    assert all(r["same_as_plain_build"] for r in rows)
    out_dir = os.environ.get("OUT") or "out"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "kkt_v10_phases.json"), "w") as fh:
        json.dump({"timer": "clock64 stamps per CTA (profile builds)", **_provenance(), "rows": rows}, fh, indent=1)
