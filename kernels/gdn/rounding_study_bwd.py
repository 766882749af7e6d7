"""Which bf16 rounding of stage 1's chain sets dh0's error: a float64 emulation of the reverse chain.

On qwen35-bwd (session 9) qla's dh0 error was 1.24-1.26x FLA's on most configs, with and without context
parallelism. dh0 comes from stage 1 alone (gdn/bwd/dstate_chain.py rev3), whose step is
    dS = e^gamma dS' + Wk^T bf(-(dvl + D_r K bf(dS'))) + Q^T bf(scale D dO)
with Wk = bf(D A0 bf(beta K)) and dvl = bf(P)^T dO. This runs that chain in float64 with each rounding
switchable, on the harness's gate recipe (logsigmoid(randn) / 16, one head of four at g = 0), and prints
dh0's relative L2 error against the unrounded chain for: every rounding (rev3), the Q^T (scale D dO)
operand unrounded (what FLA's dhu kernel gets from its fp32 q e^g, tf32 in the product), that operand as
its rounded high part plus the rounded rest (rev4), each other rounding removed on its own, and the fused walk's
step (session 23: dS = e^gamma dS' + Q^T (hi + lo) - K^T bf(D dW) with stage 2's dW = beta o (bf(Gamma o A0)^T
bf(dVn)), dVn = bf(dvl + D_r K bf(dS'))).

    python -m qla_kernels.gdn.rounding_study_bwd [TOKENS]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from .bwd_chunked import stage1_reference
from .plan import CHUNK

HEAD_DIM = 128
VARIANTS = {  # name -> the roundings it leaves out (or "split": the dod operand as high + low parts)
    "rev3": (),
    "dod unrounded (FLA-like)": ("dod",),
    "dod split (rev4)": ("split",),
    "dS' operand unrounded": ("ds",),
    "-dVn unrounded": ("ndvn",),
    "Wk unrounded": ("wk",),
    "P unrounded": ("p",),
    "fused walk (session 23)": ("fused",),
}


def _bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float64)


def make_inputs(tokens: int, h_v: int = 4, seed: int = 1) -> dict[str, torch.Tensor]:
    """One sequence, one qk head shared by h_v value heads; head 0 has g = 0 (the harness's zero-gate heads)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = _bf(F.normalize(randn(1, tokens, 1, HEAD_DIM), dim=-1))
    k = _bf(F.normalize(randn(1, tokens, 1, HEAD_DIM), dim=-1))
    do = _bf(randn(1, tokens, h_v, HEAD_DIM))
    g = F.logsigmoid(randn(1, tokens, h_v)) / 16
    g[..., 0] = 0.0
    beta = torch.sigmoid(randn(1, tokens, h_v))
    dht = randn(h_v, HEAD_DIM, HEAD_DIM)
    gc, a0 = stage1_reference(k, g, beta, [(0, tokens)])
    return {"q": q[0, :, 0], "k": k[0, :, 0], "do": do[0], "gc": gc[0], "beta": beta[0], "a0": a0[0], "dht": dht}


def dh0(x: dict[str, torch.Tensor], skip: tuple[str, ...] = (), exact: bool = False) -> torch.Tensor:
    """dh0 [h_v, K, V] of the emulated chain; `skip` names the roundings left out, exact=True leaves out all."""

    def rnd(name: str, t: torch.Tensor) -> torch.Tensor:
        return t if exact or name in skip else _bf(t)

    scale = HEAD_DIM**-0.5
    tokens, h_v = x["gc"].shape
    out = []
    for h in range(h_v):
        ds = x["dht"][h].clone()
        a0 = x["a0"][:, h] if exact else _bf(x["a0"][:, h])  # the forward's output is bf16 either way
        for c0 in reversed(range(0, tokens, CHUNK)):
            sl = slice(c0, min(c0 + CHUNK, tokens))
            qc, kc, doc, gc, bc, ac = x["q"][sl], x["k"][sl], x["do"][sl, h], x["gc"][sl, h], x["beta"][sl, h], a0[sl]
            n = gc.shape[0]
            d, dr, egam = torch.exp(gc), torch.exp(gc[-1] - gc), torch.exp(gc[-1])
            gamma = torch.tril(torch.exp(gc[:, None] - gc[None, :]))
            dvl = rnd("p", scale * gamma * (qc @ kc.T)).T @ doc
            dod = scale * d[:, None] * doc
            if "fused" in skip and not exact:  # the fused walk: stage 2 rev 12's dW, its D dW operand, rev 4's split
                dvn = _bf(dvl + dr[:, None] * (kc @ _bf(ds)))
                dw = bc[:, None] * (_bf(gamma * ac[:, :n]).T @ dvn)  # beta applied in fp32 (rev 6)
                hi = _bf(dod)
                ds = egam * ds + qc.T @ hi + qc.T @ _bf(dod - hi) - kc.T @ _bf(d[:, None] * dw)
                continue
            wk = rnd("wk", d[:, None] * (ac[:, :n] @ rnd("wk", bc[:, None] * kc)))
            ndvn = rnd("ndvn", -(dvl + dr[:, None] * (kc @ rnd("ds", ds))))
            if "split" in skip and not exact:
                hi = _bf(dod)
                dod_term = qc.T @ hi + qc.T @ _bf(dod - hi)
            else:
                dod_term = qc.T @ rnd("dod", dod)
            ds = egam * ds + wk.T @ ndvn + dod_term
        out.append(ds)
    return torch.stack(out)


def errors(tokens: int = 8192) -> dict[str, float]:
    x = make_inputs(tokens)
    ref = dh0(x, exact=True)
    return {name: ((dh0(x, skip) - ref).norm() / ref.norm()).item() for name, skip in VARIANTS.items()}


def main(argv: list[str]) -> None:
    errs = errors(int(argv[0]) if argv else 8192)
    for name, e in errs.items():
        print(f"{name}: {e:.3e} ({e / errs['rev3']:.2f}x rev3's)")


if __name__ == "__main__":
    main(sys.argv[1:])
