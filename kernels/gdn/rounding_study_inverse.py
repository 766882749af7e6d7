"""How precise a FlashInfer-style gated inverse in fp16 would be: a float64 emulation, before any kernel is written.

The one-kernel forward's auxiliary warpgroup (fused_fwd_vs, vs3: ~12.6 K cycles a chunk on an H100) has to reach
the state chain's ~5.4 K. FlashInfer's auxiliary warpgroup does the same work in ~5-6 K (session 26's reading of
its source, NOTES.md) with a different inverse:
- the gate and beta's rows go in before the inverse, L' = StrictLower(diag(beta) (Gamma o K K^T)), which is exact
  algebra: Gamma o M = E M E^-1 with E = diag(e^g), so (I + Gamma o L)^-1 = Gamma o (I + L)^-1; beta's columns
  after it, Agb = (I + L')^-1 diag(beta);
- L' rounded to fp16, the 8 x 8 diagonal blocks solved in fp32 (from the fp16 values) and stored as fp16, then
  three doublings 8 -> 16 -> 32 -> 64, X21 = -(D^-1 C) A^-1, each product fp16 x fp16 with fp32 accumulation, the
  intermediate -D^-1 C rounded to fp16, the result stored as fp16 (at the last level as two split-K halves added
  in fp16); the output bf16.
Ours (kkt v4t, chunk_inverse): A0 = (I + L)^-1 ungated, 16 x 16 diagonal blocks in fp32, two levels of tf32
products on fp32 operands (mma.sync truncates the low 13 mantissa bits), then Agb = Gamma o A0 diag(beta) in fp32,
rounded to bf16 once.

This module emulates both (and the gated inverse in fp32, then bf16, FLA's order) on the harness's kinds of inputs
and reports Agb's relative L2 error against float64, and the error a 4-chunk walk's o and final state take from
Agb alone (every other operation in float64), so the fp16 form's cost can be set against the bound of issue 4
(1.1x FLA's error) before a kernel is built.

    python -m qla_kernels.gdn.rounding_study_inverse [TRIALS]
"""

from __future__ import annotations

import statistics
import sys

import torch

from .rounding_study import _bf

C = 64
HEAD_DIM = 128
F64 = torch.float64


def _f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(F64)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).to(F64)


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """What mma.sync .tf32 reads from an fp32 register: the low 13 mantissa bits dropped (toward zero)."""
    bits = x.to(torch.float32).view(torch.int32) & ~0x1FFF
    return bits.view(torch.float32).to(F64)


def _mm(a: torch.Tensor, b: torch.Tensor, operand) -> torch.Tensor:
    """A tensor-core product: operands as the unit reads them, exact products, the sum rounded to fp32."""
    return _f32(operand(a) @ operand(b))


def _substitute(lb: torch.Tensor) -> torch.Tensor:
    """(I + lb)^-1 for a strictly lower block by forward substitution in fp32."""
    n = lb.shape[0]
    x = torch.zeros(n, n, dtype=F64)
    for i in range(n):
        row = torch.zeros(n, dtype=F64)
        row[i] = 1.0
        for j in range(i):
            row = _f32(row - _f32(lb[i, j] * x[j]))
        x[i] = row
    return x


def inverse_v4t(l_strict: torch.Tensor) -> torch.Tensor:
    """kkt v4t's (I + L)^-1 in fp32: 16 x 16 diagonal blocks by substitution, then 16 -> 32 -> 64 with one tf32
    product per block product (X21 = -X22 (L21 X11))."""
    x = torch.zeros(C, C, dtype=F64)
    for b in range(0, C, 16):
        x[b:b + 16, b:b + 16] = _substitute(_f32(l_strict[b:b + 16, b:b + 16]))
    for size in (16, 32):
        for a in range(0, C, 2 * size):
            lo, hi = slice(a, a + size), slice(a + size, a + 2 * size)
            t = _mm(_f32(l_strict[hi, lo]), x[lo, lo], _tf32)
            x[hi, lo] = -_mm(x[hi, hi], t, _tf32)
    return x


def inverse_fp16(l_strict: torch.Tensor) -> torch.Tensor:
    """FlashInfer's (I + L)^-1: L in fp16, 8 x 8 diagonal blocks in fp32 stored as fp16, then 8 -> 16 -> 32 -> 64
    with X21 = -(D^-1 C) A^-1 in fp16 products (fp32 sums, the intermediate rounded to fp16); at 64 the second
    product's two K halves are added in fp16, as its split-K reduction through shared memory does."""
    lh = _f16(l_strict)
    x = torch.zeros(C, C, dtype=F64)
    for b in range(0, C, 8):
        x[b:b + 8, b:b + 8] = _f16(_substitute(lh[b:b + 8, b:b + 8]))
    for size in (8, 16, 32):
        for a in range(0, C, 2 * size):
            lo, hi = slice(a, a + size), slice(a + size, a + 2 * size)
            p = _f16(-_mm(x[hi, hi], lh[hi, lo], _f16))
            if size == 32:
                halves = [_f16(_mm(p[:, h:h + 16], x[lo, lo][h:h + 16, :], _f16)) for h in (0, 16)]
                x[hi, lo] = _f16(halves[0] + halves[1])
            else:
                x[hi, lo] = _f16(_mm(p, x[lo, lo], _f16))
    return x


def partner_mask(size: int) -> torch.Tensor:
    """Where the doubling from blocks of `size` to 2 size writes: row in the second half of a 2 size block, column
    in its first half."""
    i = torch.arange(C)[:, None]
    j = torch.arange(C)[None, :]
    return (i // (2 * size) == j // (2 * size)) & ((i // size) % 2 == 1) & ((j // size) % 2 == 0)


def inverse_fp16_full(l_strict: torch.Tensor) -> torch.Tensor:
    """kkt v10's (I + L)^-1 (fwd/kkt_solve_v10.py): FlashInfer's roundings, its doublings as whole 64 x 64 products
    on the tensor cores with masks instead of per-block products. X holds the level's block-diagonal inverse (zero
    elsewhere); P = X L masked to the partner blocks and negated is -D C; Y = P X is -D C A = X21, added where P
    was nonzero. All operands fp16, sums fp32, P and Y rounded to fp16."""
    lh = _f16(l_strict)
    x = torch.zeros(C, C, dtype=F64)
    for b in range(0, C, 8):
        x[b:b + 8, b:b + 8] = _f16(_substitute(lh[b:b + 8, b:b + 8]))
    for size in (8, 16, 32):
        mask = partner_mask(size)
        p = _f16(torch.where(mask, -_mm(x, lh, _f16), 0.0))
        y = _mm(p, x, _f16)
        x = torch.where(mask, _f16(y), x)
    return x


def agb_variants(k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> dict[str, torch.Tensor]:
    """One chunk's Agb = Gamma o (I + L)^-1 diag(beta) by each method, as the fused kernel would read it (bf16)."""
    gc = torch.cumsum(g, 0)
    gam = torch.tril(torch.exp(torch.tril(gc[:, None] - gc[None, :])))
    kk = k @ k.T
    l_plain = torch.tril(beta[:, None] * kk, -1)
    l_gated = gam * l_plain
    eye = torch.eye(C, dtype=F64)
    exact = torch.linalg.inv(eye + l_gated) * beta[None, :]
    a0 = inverse_v4t(_f32(kk) * _f32(beta)[:, None] * torch.tril(torch.ones(C, C, dtype=F64), -1))
    return {
        "exact": exact,
        "v4t": _bf(_f32(gam * a0 * beta[None, :])),
        "fp32 gated inverse": _bf(_f32(torch.linalg.inv(eye + _f32(l_gated))) * beta[None, :]),
        "gated tf32 (v4t's blocks after gating)": _bf(_f32(inverse_v4t(_f32(l_gated)) * beta[None, :])),
        "fp16 (FlashInfer's)": _bf(_f32(inverse_fp16(_f32(l_gated)) * beta[None, :])),
        "fp16 whole-tile doublings (kkt v10)": _bf(_f32(inverse_fp16_full(_f32(l_gated)) * beta[None, :])),
    }


def _inputs(seed: int, chunks: int, gate: str, correlated: bool):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    t = chunks * C
    q = _bf(torch.nn.functional.normalize(randn(t, HEAD_DIM), dim=-1))
    k = _bf(torch.nn.functional.normalize(randn(t, HEAD_DIM) + (1.5 * randn(1, HEAD_DIM) if correlated else 0.0),
                                          dim=-1))  # fmt: skip
    v = _bf(randn(t, HEAD_DIM))
    x = randn(t)
    if gate == "flashqla":
        g = torch.nn.functional.logsigmoid(x) / 16
    elif gate == "strong":
        g = -8.0 * torch.nn.functional.softplus(x)
    elif gate == "zero":
        g = torch.zeros(t, dtype=F64)
    else:
        raise ValueError(f"gate must be one of 'flashqla', 'strong', 'zero', got {gate!r}")
    beta = _f32(torch.sigmoid(randn(t)))
    return q, k, v, _f32(g), beta


def walk_errors(seed: int, chunks: int = 4, gate: str = "flashqla", correlated: bool = False) -> dict[str, dict]:
    """Per method: Agb's relative L2 error over the chunks, and the o and final-state errors of a walk in which
    only Agb is rounded (zero initial state, every other operation in float64)."""
    q, k, v, g, beta = _inputs(seed, chunks, gate, correlated)
    scale = HEAD_DIM**-0.5
    per_method: dict[str, list] = {}
    for c0 in range(0, chunks * C, C):
        sl = slice(c0, c0 + C)
        for name, agb in agb_variants(k[sl], g[sl], beta[sl]).items():
            per_method.setdefault(name, []).append(agb)
    out, ref = {}, {}
    for name, agbs in per_method.items():
        s = torch.zeros(HEAD_DIM, HEAD_DIM, dtype=F64)
        o = []
        for i, c0 in enumerate(range(0, chunks * C, C)):
            sl = slice(c0, c0 + C)
            gc = torch.cumsum(g[sl], 0)
            e, gl, er = torch.exp(gc), torch.exp(gc[-1]), torch.exp(gc[-1] - gc)
            gam = torch.tril(torch.exp(torch.tril(gc[:, None] - gc[None, :])))
            vn = agbs[i] @ (v[sl] - (e[:, None] * k[sl]) @ s)
            o.append(scale * (e[:, None] * q[sl]) @ s + (scale * torch.tril(q[sl] @ k[sl].T) * gam) @ vn)
            s = gl * s + k[sl].T @ (er[:, None] * vn)
        o = torch.cat(o)
        if name == "exact":
            ref = {"agb": torch.cat(agbs), "o": o, "state": s}
            continue
        rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
        out[name] = {"agb": rel(torch.cat(agbs), ref["agb"]), "o": rel(o, ref["o"]), "state": rel(s, ref["state"])}
    return out


def summary(trials: int = 12, chunks: int = 4) -> dict[str, dict[str, dict[str, float]]]:
    """Mean errors per (gate, keys) case and method over `trials` seeds."""
    cases = {}
    for gate in ("flashqla", "strong", "zero"):
        for correlated in (False, True):
            runs = [walk_errors(seed, chunks, gate, correlated) for seed in range(trials)]
            cases[f"{gate} gate, {'correlated' if correlated else 'random'} keys"] = {
                m: {q: statistics.mean(r[m][q] for r in runs) for q in ("agb", "o", "state")} for m in runs[0]
            }
    return cases


def main(argv: list[str]) -> None:
    trials = int(argv[0]) if argv else 12
    for case, methods in summary(trials).items():
        print(case)
        fla = methods["fp32 gated inverse"]
        for name, e in methods.items():
            print(f"  {name:42s} Agb {e['agb']:.2e}  o {e['o']:.2e} ({e['o'] / fla['o']:.2f}x)  "
                  f"state {e['state']:.2e} ({e['state'] / fla['state']:.2f}x)")


if __name__ == "__main__":
    main(sys.argv[1:])
