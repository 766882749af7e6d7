"""Where the context-parallel forward (cp.py) spends its time, step by step, on the GPU.

Session 4 measured CP slower than the plain forward, and slower the shorter its pieces (2/8 x 32768:
0.97 ms at 64-chunk pieces, 3.5 ms at 16), the opposite of the cost model. This times each step on its
own (kkt, state pass, combine, fused walk over the pieces) and the combine's host time, so the cause
(kernel time or launch-bound host code) is measured rather than guessed. A development tool: its
numbers go to NOTES.md.

    python -m qla_kernels.gdn.profile_cp OUT.json
    python -m qla_kernels.gdn.profile_cp --combine OUT.json   # the combine kernel's revisions only
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import os
import sys
import time

import torch

from .api import (
    _TL_DTYPE,
    CP_COMBINE_ENV,
    _combine_kernel,
    _cp_plan,
    _fused_kernel,
    _launch_kkt,
    _num_sms,
    _plan,
    chunk_gated_delta_rule_fwd,
    pack_tokens,
)
from .checks import HEAD_DIM
from .cp import combine
from .cp_plan import CPDecision, build_cp_plan
from .plan import choose_block_v_ws
from .profile_fwd import median_event_ms


def _host_ms(fn, reps: int = 20) -> float:
    """Host time per call with the GPU never waited on inside the loop (launch cost)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t) * 1e3 / reps
    torch.cuda.synchronize()
    return host


def cp_breakdown(h_qk: int, h_v: int, lens: list[int], pieces: list[int], seed: int = 0) -> dict:
    """ms per step of the CP forward at each piece length (chunks), and the plain forward's."""
    t = sum(lens)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(1, t, h_qk, HEAD_DIM, device="cuda", generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, t, h_qk, HEAD_DIM, device="cuda", generator=gen), dim=-1)
    v = torch.randn(1, t, h_v, HEAD_DIM, device="cuda", generator=gen)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(1, t, h_v, device="cuda", generator=gen))
    beta = torch.sigmoid(torch.randn(1, t, h_v, device="cuda", generator=gen))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    plan = _plan(q, cu)
    qf, kf, vf, gf, bf = (pack_tokens(x) for x in (q, k, v, g, beta))
    nsm = _num_sms(q.device)
    g_cumsum, a0 = _launch_kkt("v4", kf, gf, bf, plan)
    row: dict = {
        "h_qk": h_qk,
        "h_v": h_v,
        "seqs": "+".join(map(str, lens)),
        "plain_fwd": median_event_ms(lambda: chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_seqlens=cu)),
        "kkt": median_event_ms(lambda: _launch_kkt("v4", kf, gf, bf, plan)),
    }
    for piece in pieces:
        cpp = _cp_plan(plan, h_v, nsm, True, piece)
        if cpp is not None:
            row[f"p{piece}"] = _piece_times(cpp, piece, (qf, kf, vf, g_cumsum, bf, a0), (q, k, v, g, beta, cu), nsm)
    return row


def _piece_times(cpp, piece: int, packed: tuple, inputs: tuple, nsm: int) -> dict:
    """ms of each CP step at one piece length (cpp: the api's CPPlan for it)."""
    from .fwd.fused_fwd_ws import fused_fwd_ws_kernel

    qf, kf, vf, g_cumsum, bf, a0 = packed
    q, k, v, g, beta, cu = inputs
    h_v, scale, dt = g.shape[-1], HEAD_DIM**-0.5, _TL_DTYPE[q.dtype]
    n = cpp.num_pieces
    hm = torch.empty(n, h_v, HEAD_DIM, 2 * HEAD_DIM, dtype=torch.float32, device="cuda")
    bv_sp = choose_block_v_ws(2 * n, h_v, nsm)
    sp = fused_fwd_ws_kernel(HEAD_DIM, HEAD_DIM, scale, dt, False, False, bv_sp, False, 5, True)
    bv_f = choose_block_v_ws(n, h_v, nsm)
    fused = _fused_kernel("ws6", scale, dt, True, False, bv_f)
    o = torch.empty_like(vf)
    ht = torch.empty(n, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device="cuda")
    sp(qf, kf, vf, g_cumsum, bf, a0, cpp.cu_seqlens, hm)
    init = combine(cpp, hm, None)
    return {
        "pieces": n, "links": len(cpp.links), "state_pass_bv": bv_sp, "fused_bv": bv_f,
        "state_pass": median_event_ms(lambda: sp(qf, kf, vf, g_cumsum, bf, a0, cpp.cu_seqlens, hm)),
        "combine": median_event_ms(lambda: combine(cpp, hm, None)),
        "combine_host": _host_ms(lambda: combine(cpp, hm, None)),
        "combine_index": median_event_ms(lambda: combine(cpp, hm, None, max_view_links=0)),  # session 4's form
        "combine_index_host": _host_ms(lambda: combine(cpp, hm, None, max_view_links=0)),
        "combine_kernel": median_event_ms(lambda: _combine_kernel(cpp, hm, None)),  # fwd/cp_combine.py
        "fused_over_pieces": median_event_ms(lambda: fused(qf, kf, vf, g_cumsum, bf, a0, init, cpp.cu_seqlens, o, ht,
                                                                 cpp.piece_order)),
        "cp_fwd": median_event_ms(lambda: chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_seqlens=cu, cp=True,
                                                                cp_piece=piece)),
        "cp_fwd_kernel_combine": _with_env(CP_COMBINE_ENV, "kernel", lambda: median_event_ms(
            lambda: chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_seqlens=cu, cp=True, cp_piece=piece))),
    }  # fmt: skip


def _with_env(name: str, value: str, fn):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn()
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def combine_revisions(
    h_v: int, lens: list[int], piece: int, revs=("1", "2", "2bv32", "3bv32", "2bv32t256"), seed: int = 0
) -> dict:
    """us per launch of fwd/cp_combine.py at each revision on random [h | M] (transitions of moderate norm),
    per link of the longest sequence, and each revision's relative error against the host walk."""
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]
    cpp = build_cp_plan(cu, CPDecision(piece, 64, 0.0, 0.0), "cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hm = torch.randn(cpp.num_pieces, h_v, HEAD_DIM, 2 * HEAD_DIM, device="cuda", generator=gen)
    hm[..., HEAD_DIM:] /= HEAD_DIM**0.5
    first = cpp.seq_first_piece.tolist()
    links = max(b - a - 1 for a, b in itertools.pairwise(first))
    host = combine(cpp, hm, None).double()
    row: dict = {
        "h_v": h_v,
        "seqs": "+".join(map(str, lens)),
        "piece_chunks": piece,
        "pieces": cpp.num_pieces,
        "longest_links": links,
    }
    for rev in revs:  # "R[bvN][tM]": revision R at N-column V-slices (default 64), M threads (default 128)
        rest, _, t_text = rev.partition("t")
        r_text, _, bv_text = rest.partition("bv")
        r, bv, th = int(r_text), int(bv_text or 64), int(t_text or 128)
        out = _combine_kernel(cpp, hm, None, r, bv, th)
        us = median_event_ms(lambda: _combine_kernel(cpp, hm, None, r, bv, th), reps=50) * 1e3  # noqa: B023
        row[f"rev{rev}_us"] = round(us, 2)
        row[f"rev{rev}_us_per_link"] = round(us / max(links, 1), 2)
        row[f"rev{rev}_err"] = float((out.double() - host).norm() / host.norm())
    return row


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--combine":
        path = argv[1] if len(argv) > 1 else "cp_combine_revs.json"
        rows = [combine_revisions(h_v, lens, piece) for h_v, lens, piece in
                ((8, [32768], 128), (8, [32768], 64), (8, [32768], 32), (8, [32768], 16), (16, [32768], 64),
                 (8, [4096, 28672], 64), (32, [16384], 32))]  # fmt: skip
        with open(path, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "timer": "cuda events, no L2 flush, median of 50",
                    "versions": {"torch": torch.__version__, "tilelang": importlib.metadata.version("tilelang")},
                    "rows": rows,
                },
                f,
                indent=1,
            )
        for r in rows:
            print(json.dumps(r))
        return
    path = argv[0] if argv else "cp_breakdown.json"
    rows = [
        cp_breakdown(2, 8, [32768], [16, 32, 64, 128]),
        cp_breakdown(4, 16, [32768], [32, 64]),
        cp_breakdown(2, 8, [4096, 28672], [64]),
    ]
    with open(path, "w") as f:
        json.dump(
            {"device": torch.cuda.get_device_name(), "timer": "cuda events, no L2 flush, median of 20", "rows": rows},
            f,
            indent=1,
        )
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main(sys.argv[1:])
