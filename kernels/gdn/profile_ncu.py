"""A target program for Nsight Compute: one forward (or forward + backward) of one config, profiled alone.

Why: the clock64 profile builds (profile_fwd, profile_bwd) split a CTA into phases but cannot say why a
phase is slow (issue stalls, shared-memory bank conflicts, occupancy). ncu can on the H200 (the
Firecracker host reads the hardware counters). The first pass compiles and warms every kernel outside the
profiled range; the second runs between cudaProfilerStart and cudaProfilerStop, so

    ncu --clock-control none --profile-from-start off --set full -k regex:'kkt|fused|bwd_' -o REPORT \\
        python -m qla_kernels.gdn.profile_ncu fwd 16 64 8192,8192,8192,8192

records each of our kernels once. A development tool: its readings go to NOTES.md, never into results.
"""

from __future__ import annotations

import sys

import torch

from .api import chunk_gated_delta_rule_fwd
from .bwd_api import chunk_gated_delta_rule_bwd
from .checks import HEAD_DIM


def make_inputs(h_qk: int, h_v: int, seqlens: list[int], seed: int = 0) -> dict:
    """The harness's kind of inputs: L2-normalised q and k, logsigmoid gates / 16 with a quarter of the value
    heads at g = 0, beta in (0, 1)."""
    t = sum(seqlens)
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    g = torch.nn.functional.logsigmoid(rnd(1, t, h_v)) / 16
    g[..., : max(1, h_v // 4)] = 0.0
    return {
        "q": torch.nn.functional.normalize(rnd(1, t, h_qk, HEAD_DIM), dim=-1).bfloat16(),
        "k": torch.nn.functional.normalize(rnd(1, t, h_qk, HEAD_DIM), dim=-1).bfloat16(),
        "v": rnd(1, t, h_v, HEAD_DIM).bfloat16(),
        "g": g,
        "beta": torch.sigmoid(rnd(1, t, h_v)),
        "do": rnd(1, t, h_v, HEAD_DIM).bfloat16(),
        "cu": torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32, device="cuda"),
    }


def run_once(mode: str, x: dict) -> None:
    """The forward, and for mode "bwd" the backward from the forward's own outputs."""
    fwd = chunk_gated_delta_rule_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x["cu"],
                                     need_a0=mode == "bwd")  # inference runs auto's kernel, which forms no A0
    if mode == "bwd":
        chunk_gated_delta_rule_bwd(x["q"], x["k"], x["v"], fwd.g_cumsum, x["beta"], fwd.a0, x["do"], cu_seqlens=x["cu"])


def main(argv: list[str]) -> None:
    if len(argv) != 4 or argv[0] not in ("fwd", "bwd"):
        raise SystemExit("usage: python -m qla_kernels.gdn.profile_ncu {fwd|bwd} H_QK H_V LEN[,LEN...]")
    mode, h_qk, h_v = argv[0], int(argv[1]), int(argv[2])
    x = make_inputs(h_qk, h_v, [int(s) for s in argv[3].split(",")])
    run_once(mode, x)  # compiles and warms outside the profiled range
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run_once(mode, x)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(sys.argv[1:])
