"""Where stage 2 of the backward (bwd/chunk_grads.py) spends its time, measured by the kernel itself.

Runs the forward, stage 0 and stage 1 for one config, then the profile build of stage 2
(bwd_chunk_grads_program(profile=True)), whose CTAs stamp clock64 at PROFILE_STAMPS. Returns the mean
cycles of each phase over all CTAs and the mean CTA length, so the serial chain of one CTA (stage 2
runs ~one CTA per SM) can be split into loads, GEMM chains, reductions and the dg tail. A development
tool: the stamps add a barrier each, so its numbers go to NOTES.md, never into results.

    python -m qla_kernels.gdn.profile_bwd OUT.json [rev1,rev2,...: bwd_api.GRADS_FLAGS keys]
    python -m qla_kernels.gdn.profile_bwd --kernels OUT.json   # every kernel of one whole backward
    python -m qla_kernels.gdn.profile_bwd --fused OUT.json     # the fused walk's step by phase ($QLA_BWD_FUSED)
    python -m qla_kernels.gdn.profile_bwd --ws OUT.json [ws,ws2,ws3]  # the warp-specialised walk's roles by phase
"""

from __future__ import annotations

import json
import sys

import torch

from . import bwd_api
from .api import _TL_DTYPE, _plan, chunk_gated_delta_rule_fwd, pack_tokens
from .checks import HEAD_DIM


def profile_chunk_grads(h_qk: int, h_v: int, seqlens: list[int], seed: int = 0, rev: str = "rev1") -> dict:
    from .bwd.chunk_grads import PROFILE_STAMPS, bwd_chunk_grads_kernel

    t = sum(seqlens)
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    q = torch.nn.functional.normalize(rnd(1, t, h_qk, HEAD_DIM), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(rnd(1, t, h_qk, HEAD_DIM), dim=-1).bfloat16()
    v, do = rnd(1, t, h_v, HEAD_DIM).bfloat16(), rnd(1, t, h_v, HEAD_DIM).bfloat16()
    g = -torch.rand(1, t, h_v, device="cuda", generator=gen) * 0.1
    beta = torch.rand(1, t, h_v, device="cuda", generator=gen)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    fwd = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_seqlens=cu)
    scale = HEAD_DIM**-0.5
    plan = _plan(q, cu)
    qf, kf, vf, af, dof = (pack_tokens(x) for x in (q, k, v, fwd.a0, do))
    gf, bf = (pack_tokens(x).float() for x in (fwd.g_cumsum, beta))
    states = bwd_api.chunk_states(qf, kf, vf, gf, bf, af, None, plan, scale)
    ds_next = bwd_api._dstate_packed(qf, kf, gf, bf, af, dof, None, plan, scale, None).ds_next
    nt = t
    dq = torch.empty(1, nt, h_v, HEAD_DIM, dtype=torch.float32, device="cuda")
    dk = torch.empty_like(dq)
    dbeta = torch.empty(1, nt, h_v, dtype=torch.float32, device="cuda")
    dg = torch.empty_like(dbeta)
    ctas = plan.num_chunks * h_v
    prof = torch.zeros(ctas, len(PROFILE_STAMPS), dtype=torch.int64, device="cuda")
    threads, *flags = bwd_api.GRADS_FLAGS[rev]
    kernel = bwd_chunk_grads_kernel(HEAD_DIM, HEAD_DIM, scale, _TL_DTYPE[q.dtype], threads, False, True, *flags)
    args = (qf, kf, vf, gf, bf, af, dof, states, ds_next, plan.cu_seqlens, plan.chunk_indices, dq, dk, dbeta, dg, prof)
    kernel(*args)  # first launch loads the module
    kernel(*args)
    torch.cuda.synchronize()
    cycles = prof.double().diff(dim=1).mean(0)
    phases = {f"{PROFILE_STAMPS[i]} -> {PROFILE_STAMPS[i + 1]}": round(cycles[i].item(), 1) for i in range(len(cycles))}
    return {
        "config": {"h_qk": h_qk, "h_v": h_v, "seqlens": seqlens, "ctas": ctas, "rev": rev},
        "mean_cycles_per_phase": phases,
        "mean_cta_cycles": round(cycles.sum().item(), 1),
        "clock_note": "clock64 cycles of thread 0 after a barrier; SM clock ~1.98 GHz on the H200 under load",
    }


def _walk_inputs(h_qk: int, h_v: int, seqlens: list[int], seed: int) -> tuple:
    """Random bf16 inputs, the forward, stage 0's states and the walk's outputs for one config: (plan, scale, dtype,
    walk arguments before ds_slots, outputs after chunk_offsets, CTAs). Shared by the two fused walks' profiles."""
    t = sum(seqlens)
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    q = torch.nn.functional.normalize(rnd(1, t, h_qk, HEAD_DIM), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(rnd(1, t, h_qk, HEAD_DIM), dim=-1).bfloat16()
    v, do = rnd(1, t, h_v, HEAD_DIM).bfloat16(), rnd(1, t, h_v, HEAD_DIM).bfloat16()
    g = -torch.rand(1, t, h_v, device="cuda", generator=gen) * 0.1
    beta = torch.rand(1, t, h_v, device="cuda", generator=gen)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    fwd = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_seqlens=cu)
    scale = HEAD_DIM**-0.5
    plan = _plan(q, cu)
    qf, kf, vf, af, dof = (pack_tokens(x) for x in (q, k, v, fwd.a0, do))
    gf, bf = (pack_tokens(x).float() for x in (fwd.g_cumsum, beta))
    states = bwd_api.chunk_states(qf, kf, vf, gf, bf, af, None, plan, scale)
    dq = torch.empty(1, t, h_v, HEAD_DIM, dtype=torch.float32, device="cuda")
    dk, dv = torch.empty_like(dq), torch.empty_like(vf)
    dbeta = torch.empty(1, t, h_v, dtype=torch.float32, device="cuda")
    dg = torch.empty_like(dbeta)
    return (plan, scale, _TL_DTYPE[q.dtype], (qf, kf, vf, gf, bf, af, dof, states), (dq, dk, dbeta, dg, dv),
            plan.num_seqs * h_v)  # fmt: skip


def profile_fused_walk(h_qk: int, h_v: int, seqlens: list[int], seed: int = 0) -> dict:
    """The fused walk's profile build ($QLA_BWD_FUSED=1's kernel with clock64 stamps): the mean cycles per chunk
    of each phase of its step (FUSED_PROFILE_STAMPS), over every CTA (one per sequence and value head, no CP)."""
    from .bwd.chunk_grads import FUSED_PROFILE_STAMPS, bwd_chunk_grads_kernel

    plan, scale, dt, walk_in, walk_out, ctas = _walk_inputs(h_qk, h_v, seqlens, seed)
    threads, tile, hoist, tma, dw_beta, gamma_frag, _ds_tma, scan = bwd_api.GRADS_FLAGS["rev8"]
    kernel = bwd_chunk_grads_kernel(HEAD_DIM, HEAD_DIM, scale, dt, threads, False, True, tile, hoist, tma, dw_beta,
                                    gamma_frag, False, scan, True, lean=True, fused=True)  # fmt: skip
    for _ in range(2):  # the first launch loads the module
        slots = torch.zeros(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device="cuda")
        prof = torch.zeros(ctas, len(FUSED_PROFILE_STAMPS) - 1, dtype=torch.int64, device="cuda")
        kernel(*walk_in, slots, plan.cu_seqlens, plan.chunk_offsets, *walk_out, prof)
    torch.cuda.synchronize()
    cycles = prof.double().mean(0) * ctas / plan.num_chunks / h_v  # per chunk step
    names = FUSED_PROFILE_STAMPS
    return {
        "config": {"h_qk": h_qk, "h_v": h_v, "seqlens": seqlens, "ctas": ctas, "kernel": "fused walk (rev 12 math)"},
        "mean_cycles_per_chunk_phase": {
            f"{names[i]} -> {names[i + 1]}": round(c.item(), 1) for i, c in enumerate(cycles)
        },
        "mean_cycles_per_chunk": round(cycles.sum().item(), 1),
        "clock_note": "clock64 cycles of thread 0 after a barrier, summed over each CTA's chunks; each stamp adds a "
        "barrier, so the phases are upper bounds of an undisturbed step",
    }


def profile_fused_ws(
    h_qk: int, h_v: int, seqlens: list[int], seed: int = 0, dq_aside: bool = False, early_release: bool = False
) -> dict:
    """The warp-specialised walk's profile build ($QLA_BWD_FUSED=ws's kernel, bwd/fused_ws.py): the mean cycles
    per chunk of each phase of each consumer warpgroup (fused_ws.PHASES), over every CTA (no CP). The roles run
    concurrently, so a chunk step is each role's sum, not the sum over roles; the waits say who waits for whom.
    dq_aside: $QLA_BWD_FUSED=ws2's kernel; early_release: ws3's."""
    from .bwd.fused_ws import NUM_PHASES, bwd_fused_ws_kernel, phases

    plan, scale, dt, walk_in, walk_out, ctas = _walk_inputs(h_qk, h_v, seqlens, seed)
    if early_release:
        kernel = bwd_fused_ws_kernel(HEAD_DIM, HEAD_DIM, scale, dt, profile=True, early_release=True)
    else:
        kernel = bwd_fused_ws_kernel(HEAD_DIM, HEAD_DIM, scale, dt, profile=True, dq_aside=dq_aside)
    width = NUM_PHASES
    names = phases(dq_aside, early_release)
    for _ in range(2):  # the first launch loads the module
        slots = torch.zeros(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device="cuda")
        prof = torch.zeros(ctas, 3, width, dtype=torch.int64, device="cuda")
        kernel(*walk_in, slots, plan.cu_seqlens, plan.chunk_offsets, *walk_out, prof)
    torch.cuda.synchronize()
    cycles = prof.double().mean(0) * ctas / plan.num_chunks / h_v  # per chunk step
    roles = ("chain (WG0)", "K side (WG1)", "A side (WG2)")
    return {
        "config": {
            "h_qk": h_qk,
            "h_v": h_v,
            "seqlens": seqlens,
            "ctas": ctas,
            "kernel": f"fused ws{'3' if early_release else '2' if dq_aside else ''} (rev 12 math)",
        },
        "mean_cycles_per_chunk_phase": {
            role: {name: round(cycles[r, i].item(), 1) for i, name in enumerate(names[r])}
            for r, role in enumerate(roles)
        },
        "mean_cycles_per_chunk": {role: round(cycles[r].sum().item(), 1) for r, role in enumerate(roles)},
        "clock_note": "clock64 cycles of each warpgroup's first thread, summed over each CTA's chunks; no barrier "
        "added (the profile build spills ~240 B of its phase sums: an upper bound of the plain build's step)",
    }


def kernel_breakdown(h_qk: int, h_v: int, seqlens: list[int], seed: int = 0, reps: int = 5) -> dict:
    """GPU time of every kernel one whole backward (bwd_api.chunk_gated_delta_rule_bwd, the defaults) launches,
    from torch.profiler's CUDA activity, averaged over reps calls: the stages, and what runs between them
    (the GVA group sums, dtype casts, the CP combine) that the stage timings do not show."""
    from torch.profiler import ProfilerActivity, profile

    t = sum(seqlens)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(1, t, h_qk, HEAD_DIM, device="cuda", generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, t, h_qk, HEAD_DIM, device="cuda", generator=gen), dim=-1)
    q, k = q.bfloat16(), k.bfloat16()
    v = torch.randn(1, t, h_v, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    do = torch.randn(1, t, h_v, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    g = -torch.rand(1, t, h_v, device="cuda", generator=gen) * 0.1
    beta = torch.rand(1, t, h_v, device="cuda", generator=gen)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    fwd = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_seqlens=cu)

    def call():
        return bwd_api.chunk_gated_delta_rule_bwd(q, k, v, fwd.g_cumsum, beta, fwd.a0, do, cu_seqlens=cu)

    call()  # loads every module
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA" and ev.device_time > 0:
            kernels.setdefault(ev.name[:90], []).append(ev.device_time)
    rows = sorted(((name, sum(ts) / reps, len(ts) // reps) for name, ts in kernels.items()), key=lambda r: -r[1])
    return {
        "config": {"h_qk": h_qk, "h_v": h_v, "seqlens": seqlens, "reps": reps},
        "kernels_us": [{"kernel": n, "us_per_call": round(us, 1), "launches_per_call": c} for n, us, c in rows],
        "sum_us": round(sum(us for _, us, _ in rows), 1),
    }


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--kernels":
        path = argv[1] if len(argv) > 1 else "bwd_kernels.json"
        results = [
            kernel_breakdown(hq, hv, lens)
            for hq, hv, lens in (
                (16, 32, [32768]),
                (16, 32, [8192]),
                (16, 32, [2048] * 4),
                (4, 8, [8192] * 4),
                (2, 4, [32768]),
            )
        ]
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "timer": "torch.profiler CUDA activity, no L2 flush",
                       "results": results}, f, indent=1)  # fmt: skip
        for r in results:
            print(r["config"], "sum of kernels", r["sum_us"], "us")
            for k in r["kernels_us"]:
                print(f"  {k['us_per_call']:9.1f} us  x{k['launches_per_call']}  {k['kernel']}")
        return
    if argv and argv[0] == "--ws":
        path = argv[1] if len(argv) > 1 else "bwd_ws_phases.json"
        variants = [v for v in (argv[2] if len(argv) > 2 else "ws,ws3").split(",") if v]
        results = [profile_fused_ws(16, 32, lens, dq_aside=v == "ws2", early_release=v == "ws3") for v in variants
                   for lens in ([8192] * 4, [2048] * 4)]  # fmt: skip
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
        for r in results:
            print(r["config"], "mean cycles per chunk", r["mean_cycles_per_chunk"])
            for role, phases in r["mean_cycles_per_chunk_phase"].items():
                print(f"  {role}: " + ", ".join(f"{n} {c:.0f}" for n, c in phases.items()))
        return
    if argv and argv[0] == "--fused":
        path = argv[1] if len(argv) > 1 else "bwd_fused_phases.json"
        results = [profile_fused_walk(16, 32, lens) for lens in ([8192] * 4, [2048] * 4)]
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        for r in results:
            print(r["config"], "mean cycles per chunk", r["mean_cycles_per_chunk"])
            for name, c in r["mean_cycles_per_chunk_phase"].items():
                print(f"  {c:10.1f}  {name}")
        return
    path = argv[0] if argv else "bwd_stage2_phases.json"
    revs = argv[1].split(",") if len(argv) > 1 else list(bwd_api.GRADS_FLAGS)
    results = [profile_chunk_grads(16, 32, [8192], rev=r) for r in revs]
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    for r in results:
        print(r["config"], "mean CTA cycles", r["mean_cta_cycles"])
        for name, c in r["mean_cycles_per_phase"].items():
            print(f"  {c:10.1f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
