"""Context parallelism (gdn/cp.py with the ws kernel's state pass) on the H200: correctness, then timings.

    source .ci/gpu-host-setup.sh; python -m pytest tests/gpu/test_qla_cp.py -q -s -rfE

1. the state pass alone: [h | M] of each piece against float64 (h from S = 0; M from S = I, V = 0; M exactly
   zero where the piece decays below SKIP_M_LOG_DECAY);
2. the CP forward (forced piece lengths, fused_impl="ws5") against the float64 reference on GVA 1-4,
   ragged, g = 0 and strong-decay heads, fixed-length batches: o and state <= 5e-3, each head <= 1e-2,
   and within 5e-3 of the plain forward;
3. timings (CUDA events, L2 flushed, median of 30) of the plain forward vs CP at several piece lengths
   on single long sequences with few heads; written to $OUT/cp_timing.json (fits CPHeuristics).
"""

import json
import os
import statistics
import zlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu.test_qla_fwd import TOL, make_inputs, rel_l2  # noqa: E402

from qla_bench.reference import chunk_gated_delta_rule_ref  # noqa: E402
from qla_bench.timing import L2Flusher, time_cuda_events  # noqa: E402
from qla_kernels.gdn.api import chunk_gated_delta_rule_fwd, chunk_kkt_solve  # noqa: E402
from qla_kernels.gdn.fwd.fused_fwd_ws import SKIP_M_LOG_DECAY, fused_fwd_ws_kernel  # noqa: E402

CASES = {
    # name: (B, T, h_qk, h_v, cu_seqlens or None, piece chunks)
    "gva4_1x4096_p8": (1, 4096, 2, 8, [0, 4096], 8),
    "gva3_ragged_1000+3096_p4": (1, 4096, 2, 6, [0, 1000, 4096], 4),
    "gva1_1x2000_p1": (1, 2000, 4, 4, [0, 2000], 1),
    "gva2_fixed_B2_T700_p3": (2, 700, 2, 4, None, 3),
}


def _case(name):
    b, t, h_qk, h_v, cu_list, piece = CASES[name]
    n = b if cu_list is None else len(cu_list) - 1
    (q, k, v, g, beta), s0 = make_inputs(b, t, h_qk, h_v, seed=zlib.crc32(name.encode()) % 1000, n=n)
    cu = None if cu_list is None else torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    return q, k, v, g, beta, s0, cu, piece


def test_state_pass_gives_h_and_m():
    (q, k, v, g, beta), _ = make_inputs(1, 1024, 2, 4, seed=5, h0=False)
    cu = torch.tensor([0, 512, 1024], dtype=torch.int32, device="cuda")  # two pieces of 8 chunks
    g_cumsum, a0 = chunk_kkt_solve(k, g, beta, cu_seqlens=cu)
    hm = torch.empty(2, 4, 128, 256, dtype=torch.float32, device="cuda")
    fused_fwd_ws_kernel(128, 128, 128**-0.5, "bfloat16", False, False, 128, False, 5, True)(
        q, k, v, g_cumsum, beta, a0, cu, hm
    )
    torch.cuda.synchronize()
    args = [x.cpu() for x in (q, k, v, g, beta)]
    _, h_ref = chunk_gated_delta_rule_ref(*args, None, None, True, cu.cpu())
    eye = torch.eye(128, dtype=torch.float64).expand(2, 4, 128, 128).contiguous()
    _, m_ref = chunk_gated_delta_rule_ref(args[0], args[1], torch.zeros_like(args[2]), *args[3:], None, eye, True,
                                          cu.cpu())
    # the transition of a piece whose summed log gate is at most SKIP_M_LOG_DECAY is written as zeros (gate-
    # driven: exp(decay) bounds its effect); the heads here range from g = 0 (exact M needed) to strong decay
    decay = torch.stack([g[0, a:b].double().sum(0).cpu() for a, b in ((0, 512), (512, 1024))])  # [piece, head]
    m = hm[..., 128:].double().cpu()
    skipped, kept = decay < SKIP_M_LOG_DECAY - 1, decay > SKIP_M_LOG_DECAY + 1
    assert kept.any() and skipped.any(), decay
    assert (m[skipped] == 0).all()
    assert (m_ref[skipped].norm(dim=(-2, -1)) <= 1e-10 * 128**0.5).all()  # what was dropped: below fp32
    eh, em = rel_l2(hm[..., :128], h_ref), rel_l2(m[kept], m_ref[kept])
    print(f"\n[cp-state-pass] h={eh:.2e} M={em:.2e} (M skipped on {int(skipped.sum())} of {skipped.numel()})")
    assert eh <= TOL and em <= TOL, (eh, em)


@pytest.mark.parametrize(("rev", "block_v"), [(1, 64), (2, 64), (2, 32), (3, 64), (3, 32)])
def test_combine_kernel_matches_the_host_walk(rev, block_v):
    """fwd/cp_combine.py (one launch, each revision) against cp.combine (the host walk) on a real state pass's
    [h | M]."""
    from qla_kernels.gdn.api import _combine_kernel
    from qla_kernels.gdn.cp import combine
    from qla_kernels.gdn.cp_plan import CPDecision, build_cp_plan

    (q, k, v, g, beta), s0 = make_inputs(1, 2048, 2, 8, seed=9, n=2)
    cu_host = [0, 700, 2048]
    cp = build_cp_plan(cu_host, CPDecision(4, 64, 0.0, 0.0), "cuda")
    g_cumsum, a0 = chunk_kkt_solve(k, g, beta, cu_seqlens=torch.tensor(cu_host, dtype=torch.int32, device="cuda"))
    hm = torch.empty(cp.num_pieces, 8, 128, 256, dtype=torch.float32, device="cuda")
    fused_fwd_ws_kernel(128, 128, 128**-0.5, "bfloat16", False, False, 128, False, 5, True)(
        q, k, v, g_cumsum, beta, a0, cp.cu_seqlens, hm
    )
    for h0 in (s0, None):
        host, kern = combine(cp, hm, h0), _combine_kernel(cp, hm, h0, rev, block_v)
        torch.cuda.synchronize()
        err = rel_l2(kern, host.double().cpu())
        print(f"\n[cp-combine-kernel] rev {rev} block_v {block_v} h0={h0 is not None}: vs host walk {err:.2e}")
        assert err < 1e-5, err  # 3xTF32 products: fp32 level


@pytest.mark.parametrize(
    ("combine_impl", "impl"),
    [("views", "ws5"), ("kernel", "ws5"), ("kernel", "ws10"), ("kernel", "ws11"), ("kernel", "ws12")],
)
@pytest.mark.parametrize("name", list(CASES))
def test_cp_forward_matches_reference(name, combine_impl, impl, monkeypatch):
    monkeypatch.setenv("QLA_CP_COMBINE", combine_impl)
    q, k, v, g, beta, s0, cu, piece = _case(name)
    ref_o, ref_s = chunk_gated_delta_rule_ref(
        q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), initial_state=s0.cpu(), output_final_state=True,
        cu_seqlens=None if cu is None else cu.cpu(),
    )
    out = chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu, fused_impl=impl, cp=True,
                                     cp_piece=piece, need_a0=False)  # ws10: its state pass and walk (rev 7)
    plain = chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu, fused_impl=impl, cp=False,
                                       need_a0=False)
    torch.cuda.synchronize()
    eo, es = rel_l2(out.o, ref_o), rel_l2(out.final_state, ref_s)
    worst = max(rel_l2(out.o[:, :, h], ref_o[:, :, h]) for h in range(v.shape[2]))
    d_o = rel_l2(out.o, plain.o)
    print(f"\n[cp {combine_impl} {impl}] {name}: o={eo:.2e} state={es:.2e} worst_head_o={worst:.2e} "
          f"| vs plain o={d_o:.1e}")
    assert eo <= TOL and es <= TOL, (eo, es)
    assert worst <= 2 * TOL, worst
    assert d_o < 5e-3


TIMING = [(2, 8), (4, 16), (8, 32), (16, 32)]  # (h_qk, h_v) on one 32768-token sequence
PIECES = (16, 32, 64)


def test_time_cp():
    flusher = L2Flusher(torch.device("cuda"))
    rows = []
    for h_qk, h_v in TIMING:
        (q, k, v, g, beta), s0 = make_inputs(1, 32768, h_qk, h_v, seed=0)
        cu = torch.tensor([0, 32768], dtype=torch.int32, device="cuda")
        row = {"h_qk": h_qk, "h_v": h_v, "seqs": "1x32768"}

        def timed(args=(q, k, v, g, beta), s0=s0, cu=cu, **kw):
            fn = lambda: chunk_gated_delta_rule_fwd(*args, initial_state=s0, cu_seqlens=cu, **kw)  # noqa: E731
            return statistics.median(time_cuda_events(fn, 30, flusher).samples_ms)

        row["plain_auto"] = timed(cp=False)
        row["plain_ws5"] = timed(fused_impl="ws5", cp=False)
        for piece in PIECES:
            row[f"cp{piece}_ws5"] = timed(fused_impl="ws5", cp=True, cp_piece=piece)
        rows.append(row)
        print(f"[cp-timing] {h_qk}/{h_v} 1x32768: " + " ".join(
            f"{c}={row[c]:.4f}" for c in row if c not in ("h_qk", "h_v", "seqs")), flush=True)
    out_dir = os.environ.get("OUT") or "out"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "cp_timing.json"), "w") as fh:
        json.dump({"timer": "cuda-events, L2 flushed, median of 30, whole forward",
                   "device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)


# qwen35-fwd's configs where FlashQLA (CP on) led after session 8: uneven two-sequence mixes and single long
# sequences; their timings refit the CP model in session 10 (tests/kernels/test_cp_plan.py holds them)
MIX_TIMING = [(16, 48, [4096, 28672]), (8, 24, [4096, 28672]), (16, 64, [28672, 4096]), (4, 16, [8192, 24576]),
              (16, 16, [8192, 24576]), (8, 24, [8192, 24576]), (8, 24, [28672, 4096]), (16, 48, [28672, 4096]),
              (16, 64, [4096, 28672]), (4, 16, [4096, 28672]), (2, 8, [8192]), (16, 16, [8192]), (2, 8, [16384]),
              (2, 8, [32768]), (4, 16, [32768]), (8, 24, [32768]), (16, 64, [32768])]  # fmt: skip
MIX_PIECES = (16, 32, 64, 128)


def _mixes() -> list[tuple[int, int, list[int]]]:
    """MIX_TIMING, or the mixes $QLA_CP_MIXES names ("2/8:1024+7168,4/16:8192": a measurement's subset)."""
    spec = os.environ.get("QLA_CP_MIXES", "").strip()
    if not spec:
        return MIX_TIMING
    mixes = []
    for item in spec.split(","):
        heads, _, lens = item.partition(":")
        h_qk, _, h_v = heads.partition("/")
        try:
            mixes.append((int(h_qk), int(h_v), [int(n) for n in lens.split("+")]))
        except ValueError:
            raise ValueError(f"$QLA_CP_MIXES: {item!r} is not 'H_QK/H_V:LEN+LEN...'") from None
    return mixes


@pytest.mark.parametrize("gates", ["tests", "harness"])
def test_time_cp_mixes(gates):
    """The default forward (CP as the model decides), no CP, and forced piece lengths; $OUT/cp_mix_timing.json.
    gates="tests": make_inputs' gates (one g = 0 head, one strong, the rest spread); "harness": qwen35-fwd's
    recipe (logsigmoid(randn) / 16 with 25 % of the heads at g = 0), whose exact transitions M the state
    pass must compute for a quarter of the heads (session 9 timed only the first)."""
    import itertools

    from qla_bench.inputs import make_gate
    from qla_kernels.gdn.api import _cp_plan, _num_sms, _plan
    from qla_kernels.gdn.cp_plan import plan_block_v

    flusher = L2Flusher(torch.device("cuda"))
    rows = []
    for h_qk, h_v, lens in _mixes():
        (q, k, v, g, beta), s0 = make_inputs(1, sum(lens), h_qk, h_v, seed=0, n=len(lens))
        if gates == "harness":
            g = make_gate("flashqla", sum(lens), h_v, 0.25, torch.Generator().manual_seed(0)).cuda()
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
        cpp = _cp_plan(_plan(q, cu), h_v, _num_sms(q.device), True, None)
        row = {"h_qk": h_qk, "h_v": h_v, "seqs": "+".join(map(str, lens)), "gates": gates,
               "model_piece": cpp.decision.piece_chunks if cpp else None,
               # the plain walk's width by the cost model for these lengths (session 14), checked below
               "model_bv": plan_block_v(_plan(q, cu), h_v, _num_sms(q.device))}  # fmt: skip

        def timed(args=(q, k, v, g, beta), s0=s0, cu=cu, **kw):
            fn = lambda: chunk_gated_delta_rule_fwd(*args, initial_state=s0, cu_seqlens=cu, **kw)  # noqa: E731
            return statistics.median(time_cuda_events(fn, 30, flusher).samples_ms)

        row["default"] = timed()
        row["no_cp"] = timed(cp=False)
        for bv in (32, 64, 128):  # the plain walk at each width: does best_block_v pick the fastest?
            row[f"no_cp_bv{bv}"] = timed(cp=False, block_v=bv)
        for piece in MIX_PIECES:
            row[f"cp{piece}"] = timed(cp=True, cp_piece=piece)
        rows.append(row)
        labels = ("h_qk", "h_v", "seqs", "gates", "model_piece", "model_bv")
        print(f"[cp-mix-timing] {gates} gates {h_qk}/{h_v} {row['seqs']} model piece {row['model_piece']} "
              f"width {row['model_bv']}: " + " ".join(f"{c}={row[c]:.4f}" for c in row if c not in labels),
              flush=True)  # fmt: skip
    out_dir = os.environ.get("OUT") or "out"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"cp_mix_timing_{gates}.json"), "w") as fh:
        json.dump({"timer": "cuda-events, L2 flushed, median of 30, whole forward",
                   "device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
