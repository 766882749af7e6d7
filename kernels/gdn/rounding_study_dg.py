"""Which bf16 rounding sets dg's error: a float64 emulation of stage 2's gate-gradient path.

On qwen35-bwd (sessions 9-10) qla's dg error is 1.10-1.19x FLA's on five configs, the last gradient over
issue 6's "no worse than 1.1x FLA". dg comes from stage 2 (gdn/bwd/chunk_grads.py rev6) given the chunk's
start state S (stored by stage 0 in bf16) and dS' (stage 1, fp32, rounded to bf16 as a GEMM operand). This
runs one sequence's forward and backward chains exactly in float64, then stage 2's dg per chunk with each of
the kernel's roundings switchable, and prints dg's relative L2 error against the unrounded path for: every
rounding (rev6), and each rounding removed on its own. Same method as rounding_study_bwd (which found rev4).

The kernel's dg terms (D = diag(e^g), D_r = diag(e^(gamma - g)), Gamma_ij = e^(g_i - g_j) on i >= j):
    row_a = scale <dO, Q bf(S)>,  row_b = <bf(D dW), K bf(S)>,  x = <K bf(dS'), bf(D_r Vn)>,
    pairs = bf(P) o (dO bf(Vn)^T) + (bf(dVn) bf(W)^T) o A0 o beta_j o Gamma,
    dgc = D row_a - row_b - x + rowsum(pairs) - colsum(pairs), plus dgamma = sum x + e^gamma <bf(S), dS'>
with W = bf(V - D K bf(S)), Vn = bf(Ag) W (Ag = A0 o Gamma o beta_j), dVn = bf(P)^T dO + D_r K bf(dS'),
dW = beta (bf(A0 o Gamma)^T bf(dVn)).

    python -m qla_kernels.gdn.rounding_study_dg [TOKENS]

Session 10 (one qk head, four value heads): no single rounding is the gap. Removed on its own, the stored
states' rounding gives 0.46x rev6's error at 4096 tokens but 0.84x at 2048 (and 1.17x at 512 with two
heads), dS' 0.79x and 1.12x, D_r Vn 0.97x and 0.86x: dg's error is a sum of comparable terms whose balance
changes with the sample (a few large dg values dominate its norm), unlike dh0's single operand.
"""

from __future__ import annotations

import sys

import torch

from .plan import CHUNK
from .rounding_study_bwd import HEAD_DIM, _bf
from .rounding_study_bwd import make_inputs as _stage1_inputs

ROUNDINGS = ("s", "ds", "w", "ag", "vn", "vnr", "p", "dvn", "ag2", "dwd")
VARIANTS = (
    {"rev6 (every rounding)": ()}
    | {f"{r} unrounded": (r,) for r in ROUNDINGS}
    | {"S unrounded in <S, dS'> only": ("s_dot",), "S unrounded in the GEMMs only": ("s_gemm",)}
)


def make_inputs(tokens: int, h_v: int = 4, seed: int = 1) -> dict[str, torch.Tensor]:
    """rounding_study_bwd's inputs (harness gates, one head of four at g = 0) plus v and the exact chains."""
    x = _stage1_inputs(tokens, h_v, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x["v"] = _bf(torch.randn(tokens, h_v, HEAD_DIM, generator=gen, dtype=torch.float64))
    x["s0"] = 0.1 * torch.randn(h_v, HEAD_DIM, HEAD_DIM, generator=gen, dtype=torch.float64)
    x["a0"] = _bf(x["a0"])  # the forward's output is bf16
    x["states"], x["ds_next"] = _exact_chains(x)
    return x


def _chunk_consts(x, sl, h):
    gc, bc = x["gc"][sl, h], x["beta"][sl, h]
    n = gc.shape[0]
    gamma = torch.tril(torch.exp(gc[:, None] - gc[None, :]))
    return gc, bc, n, torch.exp(gc), torch.exp(gc[-1] - gc), torch.exp(gc[-1]), gamma, x["a0"][sl, h, :n]


def _exact_chains(x):
    """The state at every chunk's start and the gradient of the state after every chunk, float64."""
    tokens, h_v = x["gc"].shape
    starts = list(range(0, tokens, CHUNK))
    states = torch.zeros(len(starts), h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float64)
    ds_next = torch.zeros_like(states)
    scale = HEAD_DIM**-0.5
    for h in range(h_v):
        s = x["s0"][h].clone()
        for i, c0 in enumerate(starts):
            sl = slice(c0, min(c0 + CHUNK, tokens))
            _, bc, _n, d, dr, egam, gamma, a0 = _chunk_consts(x, sl, h)
            kc, vc = x["k"][sl], x["v"][sl, h]
            states[i, h] = s
            vn = (a0 * gamma * bc[None, :]) @ (vc - d[:, None] * (kc @ s))
            s = egam * s + kc.T @ (dr[:, None] * vn)
        ds = x["dht"][h].clone()
        for i in reversed(range(len(starts))):
            sl = slice(starts[i], min(starts[i] + CHUNK, tokens))
            _, bc, _n, d, dr, egam, gamma, a0 = _chunk_consts(x, sl, h)
            qc, kc, doc = x["q"][sl], x["k"][sl], x["do"][sl, h]
            ds_next[i, h] = ds
            p = scale * gamma * (qc @ kc.T)
            dvn = p.T @ doc + dr[:, None] * (kc @ ds)
            dw = bc[:, None] * ((a0 * gamma).T @ dvn)
            ds = egam * ds + scale * qc.T @ (d[:, None] * doc) - kc.T @ (d[:, None] * dw)
    return states, ds_next


FORMS = ("rev6", "i2", "i2x")


def dg(x: dict[str, torch.Tensor], skip: tuple[str, ...] = (), exact: bool = False, form: str = "rev6") -> torch.Tensor:
    """dg [tokens, h_v] of the emulated stage 2; `skip` names the roundings left out, exact=True all.

    form="rev6" is the kernel's formula (module docstring). form="i2" is the fused kernel's candidate (session
    22): dgc_i = D_i row_a_i + rowsum(P o dO Vn^T)_i - <V, dv>_i and dgamma = <S', dS'> with S' the state after
    the chunk (the next chunk's stored bf16 state; the forward's fp32 final state after a sequence's last
    chunk). The x terms cancel in it, so it needs no K dS' o D_r Vn, no <D dW, K S> and no column sums.
    form="i2x" is i2 with rev6's dgamma = sum_i x_i + e^gamma <S, dS'> (what stage 2 rev 12 computes: it has no S')."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")

    def rnd(name: str, t: torch.Tensor) -> torch.Tensor:
        return t if exact or name in skip else _bf(t)

    scale = HEAD_DIM**-0.5
    tokens, h_v = x["gc"].shape
    out = torch.zeros(tokens, h_v, dtype=torch.float64)
    for h in range(h_v):
        for i, c0 in enumerate(range(0, tokens, CHUNK)):
            sl = slice(c0, min(c0 + CHUNK, tokens))
            _, bc, n, d, dr, egam, gamma, a0 = _chunk_consts(x, sl, h)
            qc, kc, vc, doc = x["q"][sl], x["k"][sl], x["v"][sl, h], x["do"][sl, h]
            s_exact, dsn = x["states"][i, h], x["ds_next"][i, h]
            s = s_exact if "s_gemm" in skip else rnd("s", s_exact)  # S as the K S, Q S operand
            s_dot = s_exact if "s_dot" in skip else rnd("s", s_exact)  # S in dgamma's <S, dS'>
            ds_op = rnd("ds", dsn)
            ks = kc @ s
            w = rnd("w", vc - d[:, None] * ks)
            vn = rnd("ag", a0 * gamma * bc[None, :]) @ w
            vn_b, vnr_b = rnd("vn", vn), rnd("vnr", dr[:, None] * vn)
            p = rnd("p", scale * gamma * (qc @ kc.T))
            kds = kc @ ds_op
            xs = (kds * vnr_b).sum(-1)
            dvn = rnd("dvn", dr[:, None] * kds + p.T @ doc)
            dw = bc[:, None] * (rnd("ag2", a0 * gamma).T @ dvn)
            row_b = (ks * rnd("dwd", d[:, None] * dw)).sum(-1)
            row_a = scale * ((qc @ s) * doc).sum(-1)
            if form == "i2x":
                dgc = d * row_a + (p * (doc @ vn_b.T)).sum(-1) - (vc * dw).sum(-1)
                dgc[-1] = dgc[-1] + xs.sum() + egam * (s_dot * dsn).sum()
            elif form == "i2":
                if i + 1 < x["states"].shape[0]:
                    s_after = rnd("s", x["states"][i + 1, h])  # stored by stage 0 in bf16
                else:  # the forward's final state, fp32
                    vn_e = (a0 * gamma * bc[None, :]) @ (vc - d[:, None] * (kc @ s_exact))
                    s_after = egam * s_exact + kc.T @ (dr[:, None] * vn_e)
                dgc = d * row_a + (p * (doc @ vn_b.T)).sum(-1) - (vc * dw).sum(-1)
                dgc[-1] = dgc[-1] + (s_after * dsn).sum()
            else:
                low = torch.tril(torch.ones(n, n, dtype=torch.float64))
                pairs = p * (doc @ vn_b.T) + ((dvn @ w.T) * low) * a0 * bc[None, :] * gamma
                dgc = d * row_a - row_b - xs + pairs.sum(-1) - pairs.sum(-2)
                dgc[-1] = dgc[-1] + xs.sum() + egam * (s_dot * dsn).sum()
            out[sl, h] = torch.flip(torch.cumsum(torch.flip(dgc, [0]), 0), [0])
    return out


def errors(tokens: int = 4096) -> dict[str, float]:
    x = make_inputs(tokens)
    ref = dg(x, exact=True)
    return {name: ((dg(x, skip) - ref).norm() / ref.norm()).item() for name, skip in VARIANTS.items()}


def form_errors(tokens: int = 4096, seeds: tuple[int, ...] = (1, 2, 3), h_v: int = 4) -> dict[str, list[float]]:
    """dg's relative L2 error of each form, every rounding in, per seed (the same inputs for both forms)."""
    out: dict[str, list[float]] = {f: [] for f in FORMS}
    for seed in seeds:
        x = make_inputs(tokens, h_v, seed)
        ref = dg(x, exact=True)
        for f in FORMS:
            out[f].append(((dg(x, form=f) - ref).norm() / ref.norm()).item())
    return out


def main(argv: list[str]) -> None:
    tokens = int(argv[0]) if argv else 4096
    errs = errors(tokens)
    base = errs["rev6 (every rounding)"]
    for name, e in errs.items():
        print(f"{name}: {e:.3e} ({e / base:.2f}x rev6's)")
    forms = form_errors(tokens)
    for f, es in forms.items():
        ratios = " ".join(f"{e / b:.2f}" for e, b in zip(es, forms["rev6"], strict=True))
        print(f"form {f}: " + " ".join(f"{e:.3e}" for e in es) + f" (x rev6 per seed: {ratios})")


if __name__ == "__main__":
    main(sys.argv[1:])
