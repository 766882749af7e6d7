"""Where the forward's bf16 roundings cost accuracy: a float64 emulation of one token's state update.

At T = 1 (results/H200/numerics/edge-check-fwd.jsonl, session 6) qla's final state was 1.14-1.25x FLA's
error against float64. One token's update is S' = e^g S + k^T (beta (v - e^g k S)); the kernels round
to bf16 where their GEMM operands are formed. This emulates three orders of those roundings on random
inputs and prints each one's mean relative L2 error:
- ws5 (rev 5): W = bf(v - e^g k bf(S)), Ag = bf(beta) (Gamma o A0 o beta at T = 1), Vd = bf(Ag W);
- ws6 (rev 6): beta applied to W before it is rounded, W' = bf(beta (v - e^g k bf(S))), Vd = bf(W');
- FLA: u = bf(beta v), w = bf(beta e^g k), Vd = bf(u - w bf(S));
- ws10 (rev 7, session 12): beta rounded into stage 1's Gamma o A0 diag(beta): U = bf(beta) v,
  Wk = bf(bf(bf(beta) e^g) k), Vd = bf(U - Wk bf(S));
- ws10-exact-u: rev 7 with stage 1's Gamma o A0 (1 at T = 1) and beta applied in fp32, U = beta v exactly (its
  operand split hi + lo), Wk = bf(bf(beta e^g) k) (built and measured in session 12, commit 91ac1a6: 1.27x slower);
- ws11 (rev 8): rev 7 with Agb's diagonal (beta) unrounded in both products: U = beta v, Wk = bf(bf(beta e^g) k),
  the same roundings as ws10-exact-u at T = 1 (in longer chunks only the diagonal is exact). ws12 (rev 9, auto's
  kernel since session 13) rounds exactly as ws11 (it only reorders WG1's work), so "ws11" stands for both; the
  H200 edge check read both at <= 1.011x FLA's error on o and <= 0.952x on the final state (session 13).
- one-kernel (the single-kernel design of NOTES.md session 14; vs1 forms it): W = k bf(S) in fp32, its operand
  bf(e^g W), Agb's diagonal bf(beta), with and without the fp32 fix (beta - bf(beta)) (v - e^g W).
chunk_errors() walks whole 64-token chunks with ws12's and vs1's roundings (o and the final state).
Rounding beta on its own puts one relative error into a token's whole update, which no sum averages out.

    python -m qla_kernels.gdn.rounding_study [TRIALS]
"""

from __future__ import annotations

import statistics
import sys

import torch

HEAD_DIM = 128


def _bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float64)


def one_token_errors(seed: int, h_v: int = 8) -> dict[str, float]:
    """Relative L2 error of the updated state against float64, per rounding order, for one random draw."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    k = _bf(torch.nn.functional.normalize(randn(h_v, HEAD_DIM), dim=-1))
    v = _bf(randn(h_v, HEAD_DIM))
    eg = torch.exp(torch.nn.functional.logsigmoid(randn(h_v)).float().double())
    beta = torch.sigmoid(randn(h_v)).float().double()
    s = randn(h_v, HEAD_DIM, HEAD_DIM).float().double()

    def update(vd: torch.Tensor) -> torch.Tensor:
        return eg[:, None, None] * s + k[:, :, None] * vd[:, None, :]

    exact = update(beta[:, None] * (v - eg[:, None] * torch.einsum("hk,hkv->hv", k, s)))
    ks = torch.einsum("hk,hkv->hv", k, _bf(s))
    w = _bf(v - eg[:, None] * ks)
    variants = {
        "ws5": update(_bf(_bf(beta)[:, None] * w)),
        "ws6": update(_bf(_bf(beta[:, None] * (v - eg[:, None] * ks)))),
        "fla": update(_bf(_bf(beta[:, None] * v) - torch.einsum("hk,hkv->hv", _bf((beta * eg)[:, None] * k), _bf(s)))),
        "ws10": update(_bf(_bf(beta)[:, None] * v
                           - torch.einsum("hk,hkv->hv", _bf(_bf(_bf(beta) * eg)[:, None] * k), _bf(s)))),
        "ws10-exact-u": update(_bf(beta[:, None] * v
                                   - torch.einsum("hk,hkv->hv", _bf(_bf(beta * eg)[:, None] * k), _bf(s)))),
        # U's diagonal term bf(beta) v plus the fp32 fix (beta - bf(beta)) v; Wk's diagonal operand -beta e^g
        "ws11": update(_bf(_bf(beta)[:, None] * v + (beta - _bf(beta))[:, None] * v
                           - torch.einsum("hk,hkv->hv", _bf(_bf(beta * eg)[:, None] * k), _bf(s)))),
        # the one-kernel design (NOTES.md session 14, not built): W = k bf(S) in fp32, its A operand bf(e^g W),
        # Agb's diagonal bf(beta) in both products, the fix (beta - bf(beta)) (v - e^g W) in fp32, Vnew rounded
        "one-kernel": update(_bf(_bf(beta)[:, None] * v - _bf(beta)[:, None] * _bf(eg[:, None] * ks)
                                 + (beta - _bf(beta))[:, None] * (v - eg[:, None] * ks))),
        "one-kernel-no-fix": update(_bf(_bf(beta)[:, None] * v - _bf(beta)[:, None] * _bf(eg[:, None] * ks))),
    }
    return {name: ((x - exact).norm() / exact.norm()).item() for name, x in variants.items()}


def chunk_errors(seed: int, chunks: int = 4, correlated: bool = False) -> dict[str, tuple[float, float]]:
    """(o, final state) relative L2 errors against float64 of a chunks x 64-token sequence (one head, zero initial
    state, inverse exact), for ws12's roundings (as fused_fwd_ws rev 9 forms them) and vs1's (fused_fwd_vs.py):
    whether moving the state into registers as S^T changes the error of a whole chunk walk, not only a token's."""
    c, d = 64, HEAD_DIM
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    t = chunks * c
    q = _bf(torch.nn.functional.normalize(randn(t, d), dim=-1))
    k = _bf(torch.nn.functional.normalize(randn(t, d) + (1.5 * randn(1, d) if correlated else 0.0), dim=-1))
    v = _bf(randn(t, d))
    g = torch.nn.functional.logsigmoid(randn(t)) / 16
    beta = torch.sigmoid(randn(t)).float().double()
    scale = d**-0.5
    out = {}
    for name in ("exact", "ws12", "vs1"):
        s = torch.zeros(d, d, dtype=torch.float64)
        o = []
        for c0 in range(0, t, c):
            kc, vc, qc, bc = k[c0:c0 + c], v[c0:c0 + c], q[c0:c0 + c], beta[c0:c0 + c]
            gc = torch.cumsum(g[c0:c0 + c], 0)
            e, gl, er = torch.exp(gc), torch.exp(gc[-1]), torch.exp(gc[-1] - gc)
            gam = torch.tril(torch.exp(torch.tril(gc[:, None] - gc[None, :])))
            a0 = torch.linalg.inv(torch.eye(c, dtype=torch.float64) + torch.tril(bc[:, None] * (kc @ kc.T), -1))
            p = torch.tril((qc @ kc.T) * gam) * scale
            if name == "exact":
                agb = gam * a0 * bc[None, :]
                vn = agb @ vc - agb @ (e[:, None] * kc) @ s
                o.append(scale * (qc * e[:, None]) @ s + p @ vn)
                s = gl * s + kc.T @ (er[:, None] * vn)
                continue
            agb, rb = _bf(gam * a0 * bc[None, :]), bc - _bf(bc)
            if name == "ws12":  # -Agb D with the diagonal -beta e^g unrounded, rounded once; U with the fix; S as bf16
                agd = torch.where(torch.eye(c, dtype=torch.bool), (-bc * e)[None, :].expand(c, c), -agb * e[None, :])
                vn = rb[:, None] * vc + agb @ vc + _bf(_bf(agd) @ kc) @ _bf(s)
                o.append(scale * e[:, None] * (qc @ _bf(s)) + _bf(p) @ _bf(vn))
            else:  # vs1: X = bf(S); W = K X in fp32, bf(-D W) the register operand; the fix from it
                x = _bf(s)
                wb = _bf(-e[:, None] * (kc @ x))
                vn = rb[:, None] * (vc + wb) + agb @ vc + agb @ wb
                o.append(scale * e[:, None] * (qc @ x) + _bf(p) @ _bf(vn))
            s = gl * s + kc.T @ _bf(er[:, None] * vn)
        out[name] = (torch.cat(o), s)
    ex_o, ex_s = out.pop("exact")
    return {n: (((o_ - ex_o).norm() / ex_o.norm()).item(), ((s_ - ex_s).norm() / ex_s.norm()).item())
            for n, (o_, s_) in out.items()}


def main(argv: list[str]) -> None:
    trials = int(argv[0]) if argv else 200
    runs = [one_token_errors(seed) for seed in range(trials)]
    mean = {name: statistics.mean(r[name] for r in runs) for name in runs[0]}
    for name, e in mean.items():
        print(f"{name}: {e:.3e} ({e / mean['fla']:.2f}x FLA's)")


if __name__ == "__main__":
    main(sys.argv[1:])
