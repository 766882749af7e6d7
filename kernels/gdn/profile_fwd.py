"""Where the warp-specialised fused kernel spends its time, measured on the GPU by the kernel itself.

Runs stage 1 and then the profile build of fused_fwd_ws (fused_fwd_ws_program(profile=True)), whose
consumer warpgroups add up clock64 cycles per phase. Returns, per warpgroup and phase, the mean cycles
per chunk over all CTAs, so waits (a warpgroup starved by another) and work (GEMMs, element-wise
passes) can be told apart without a profiler on the host. A development tool: its timings include
the clock reads and are never reported as kernel times.
"""

from __future__ import annotations

import statistics

import torch

from .api import _TL_DTYPE, _launch_kkt, _plan, pack_tokens, resolve_kkt_impl
from .checks import HEAD_DIM, check_fwd_args


def median_event_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median of per-call CUDA-event times, each call waited on (no L2 flush): the development profilers'
    timer (the harness's own is qla_bench.timing)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop))
    return statistics.median(out)


def _fused_args(q, k, v, g, beta, initial_state, cu_seqlens, emit_agb: bool = False):
    """(h_v, plan, use_h0, the fused kernels' arguments up to ht) after running stage 1 (the default kkt;
    emit_agb: its output for the rev 7 kernel)."""
    h_v = check_fwd_args(q, k, v, g, beta, initial_state, cu_seqlens, False).h_v
    plan = _plan(q, cu_seqlens)
    qf, kf, vf, gf, bf = (pack_tokens(x) for x in (q, k, v, g, beta))
    g_cumsum, a0 = _launch_kkt(resolve_kkt_impl(None, emit_agb), kf, gf, bf, plan, emit_agb)
    use_h0 = initial_state is not None
    h0 = initial_state.contiguous() if use_h0 else torch.zeros(1, h_v, HEAD_DIM, HEAD_DIM, device=q.device)
    o = torch.empty_like(vf)
    ht = torch.empty(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=q.device)
    return h_v, plan, use_h0, (qf, kf, vf, g_cumsum, bf, a0, h0, plan.cu_seqlens, o, ht)


def profile_fused_ws(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    block_v: int,
    rev: int = 4,
) -> dict[str, dict[str, float]]:
    """{warpgroup: {phase: mean cycles per chunk}} for one launch of the ws kernel (revision rev) at
    V-slice block_v."""
    from .fwd.fused_fwd_ws import NUM_PHASES, fused_fwd_ws_kernel, phases

    h_v, plan, use_h0, args = _fused_args(q, k, v, g, beta, initial_state, cu_seqlens, rev >= 7)
    ctas = plan.num_seqs * h_v * (HEAD_DIM // block_v)
    prof = torch.zeros(ctas, 3, NUM_PHASES, dtype=torch.int64, device=q.device)
    kernel = fused_fwd_ws_kernel(HEAD_DIM, HEAD_DIM, HEAD_DIM**-0.5, _TL_DTYPE[q.dtype], use_h0, False, block_v,
                                 True, rev)
    kernel(*args, prof)
    torch.cuda.synchronize()
    total = prof.double().sum(0) / (plan.num_chunks * h_v * (HEAD_DIM // block_v))  # per chunk-step
    names = phases(rev)
    return {f"WG{w}": {name: round(total[w, i].item(), 1) for i, name in enumerate(names[w])} for w in range(3)}


def profile_fused_ws7(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    overlap: bool = True,
    lean_prep: bool = False,
) -> dict[str, dict[str, float]]:
    """{warpgroup: {phase: mean cycles per chunk}} for one launch of fused_fwd_ws7's profile build (rev 7,
    overlap: rev 8, overlap and lean_prep: rev 9); WG3 is the load warp."""
    from .fwd.fused_fwd_ws7 import BLOCK_V, NUM_PHASES, PHASES, fused_fwd_ws7_kernel

    h_v, plan, use_h0, args = _fused_args(q, k, v, g, beta, initial_state, cu_seqlens)
    slices = HEAD_DIM // BLOCK_V
    prof = torch.zeros(plan.num_seqs * h_v * slices, 4, NUM_PHASES, dtype=torch.int64, device=q.device)
    kernel = fused_fwd_ws7_kernel(HEAD_DIM, HEAD_DIM, HEAD_DIM**-0.5, _TL_DTYPE[q.dtype], use_h0, False, overlap,
                                  True, lean_prep)
    kernel(*args, prof)
    torch.cuda.synchronize()
    total = prof.double().sum(0) / (plan.num_chunks * h_v * slices)  # per chunk-step
    return {f"WG{w}": {name: round(total[w, i].item(), 1) for i, name in enumerate(PHASES[w])} for w in range(4)}


def profile_fused_vs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    precise: bool = False,
    fast_gates: bool = False,
    fp16_inverse: bool = False,
) -> dict[str, dict[str, float]]:
    """{warpgroup: {phase: mean cycles per chunk}} for one launch of the profile build of fused_fwd_vs with
    stage 1 inside (vs2, precise: vs2p, fast_gates: vs3, with fp16_inverse: vs4): WG1 (a state warpgroup) and WG3
    (Pg and the inverse). The launch's o and final state are checked against the plain build's, so a profile of a
    broken build cannot pass."""
    from .fwd.fused_fwd_vs import NUM_PHASES, PHASES, PHASES_FAST_GATES, PHASES_FP16_INVERSE, fused_fwd_vs_kernel

    h_v = check_fwd_args(q, k, v, g, beta, initial_state, cu_seqlens, False).h_v
    plan = _plan(q, cu_seqlens)
    qf, kf, vf, gf, bf = (pack_tokens(x) for x in (q, k, v, g, beta))
    use_h0 = initial_state is not None
    h0 = initial_state.contiguous() if use_h0 else torch.zeros(1, h_v, HEAD_DIM, HEAD_DIM, device=q.device)
    dt, scale = _TL_DTYPE[q.dtype], HEAD_DIM**-0.5
    outs = []
    for profile in (False, True):
        o, g_cumsum = torch.empty_like(vf), torch.empty_like(gf)
        ht = torch.empty(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=q.device)
        args = [qf, kf, vf, gf, bf, h0, plan.cu_seqlens, o, ht, g_cumsum]
        if profile:
            prof = torch.zeros(plan.num_seqs * h_v, 2, NUM_PHASES, dtype=torch.int64, device=q.device)
            args.append(prof)
        build = {"profile": True} if profile else {}  # the plain build as the api compiles it (its cache entry)
        if fast_gates:
            build["fast_gates"] = True
        if fp16_inverse:
            build["fp16_inverse"] = True
        fused_fwd_vs_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_h0, True, precise, **build)(*args)
        outs.append((o, ht))
    torch.cuda.synchronize()
    if not (torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])):
        raise RuntimeError("fused_fwd_vs's profile build computed another o or final state than its plain build")
    total = prof.double().sum(0) / (plan.num_chunks * h_v)  # per chunk-step
    names = PHASES_FP16_INVERSE if fp16_inverse else PHASES_FAST_GATES if fast_gates else PHASES
    return {wg: {name: round(total[w, i].item(), 1) for i, name in enumerate(names[w])}
            for w, wg in enumerate(("WG1", "WG3"))}


def _kkt_phases(kernel, stamps, impl: str, emit_agb: bool, k, g, beta, cu_seqlens) -> dict:
    """Run a kkt profile build (one more argument: the clock64 stamps per CTA) and read it: mean cycles per phase
    over all CTAs, the mean CTA length, the plain build's time (CUDA events, median of 20), and whether the two
    builds write the same output. The caller gets how many CTAs overlap on an SM from these:
    mean CTA cycles x CTAs / (SMs x kernel time x clock)."""
    h_v = g.shape[-1]
    plan = _plan(k, cu_seqlens)
    kf, gf, bf = (pack_tokens(x) for x in (k, g, beta))
    g_cumsum = torch.empty_like(gf)
    out = torch.empty(1, kf.shape[1], h_v, 64, dtype=k.dtype, device=k.device)
    ctas = plan.num_chunks * h_v
    prof = torch.zeros(ctas, len(stamps), dtype=torch.int64, device=k.device)
    for _ in range(2):  # the first launch loads the module
        kernel(kf, gf, bf, plan.cu_seqlens, plan.chunk_indices, g_cumsum, out, prof)
    torch.cuda.synchronize()
    plain_gc, plain_out = _launch_kkt(impl, kf, gf, bf, plan, emit_agb)  # the profile build must compute the same
    cycles = prof.double().diff(dim=1).mean(0)
    return {
        "ctas": ctas,
        "mean_cycles_per_phase": {f"{a} -> {b}": round(c, 1) for a, b, c in zip(stamps, stamps[1:], cycles.tolist())},
        "mean_cta_cycles": round(cycles.sum().item(), 1),
        "impl": impl,
        "kernel_ms": median_event_ms(lambda: _launch_kkt(impl, kf, gf, bf, plan, emit_agb)),
        "same_as_plain_build": bool(torch.equal(out, plain_out) and torch.equal(g_cumsum, plain_gc)),
    }


def profile_kkt(
    k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor | None, impl: str = "v3h"
) -> dict:
    """_kkt_phases for a v3-family kkt_solve (its A0 build's profile twin)."""
    from .api import KKT_IMPLS
    from .fwd.kkt_solve_v3 import PROFILE_STAMPS, kkt_solve_v3_kernel

    version, extra = KKT_IMPLS[impl]
    assert version == "v3", impl
    args = list(extra) + [False] * (8 - len(extra))  # (precise, min_blocks, cpu_debug, hoist, profile, ...)
    args[4] = True
    kernel = kkt_solve_v3_kernel(HEAD_DIM, _TL_DTYPE[k.dtype], *args)
    return _kkt_phases(kernel, PROFILE_STAMPS, impl, False, k, g, beta, cu_seqlens)


def profile_kkt_v10(k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor | None) -> dict:
    """_kkt_phases for kkt v10 (fwd/kkt_solve_v10.py's profile build, Agb out)."""
    from .fwd.kkt_solve_v10 import PROFILE_STAMPS, kkt_solve_v10_kernel

    kernel = kkt_solve_v10_kernel(HEAD_DIM, _TL_DTYPE[k.dtype], profile=True)
    return _kkt_phases(kernel, PROFILE_STAMPS, "v10", True, k, g, beta, cu_seqlens)
