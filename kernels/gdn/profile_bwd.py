"""Where stage 2 of the backward (bwd/chunk_grads.py) spends its time, measured by the kernel itself.

Runs the forward, stage 0 and stage 1 for one config, then the profile build of stage 2
(bwd_chunk_grads_program(profile=True)), whose CTAs stamp clock64 at PROFILE_STAMPS. Returns the mean
cycles of each phase over all CTAs and the mean CTA length, so the serial chain of one CTA (stage 2
runs ~one CTA per SM) can be split into loads, GEMM chains, reductions and the dg tail. A development
tool: the stamps add a barrier each, so its numbers go to NOTES.md, never into results.

    python -m qla_kernels.gdn.profile_bwd OUT.json [rev1,rev2,...: bwd_api.GRADS_FLAGS keys]
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


def main(argv: list[str]) -> None:
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
