"""The v7 kkt_solve algorithm (gdn/fwd/kkt_solve_v7.py), emulated in torch on the CPU, against float64.

Checks the algebra (A0 = (Q - N Q) X with N = X L_off, Q = I + N^2) and the precision plan (every product
over bf16 hi/lo splits, three bf16 GEMMs with fp32 sums), not TileLang's code generation: that is the
GPU test's job (tests/gpu/test_qla_kkt_v3.py runs every kkt implementation against float64).
"""

import importlib.util
from pathlib import Path

import pytest
import torch

# v3's emulation and inputs, loaded by path: tests/kernels is not importable as "kernels" (the package
# kernels/ at the repository root takes that name)
_spec = importlib.util.spec_from_file_location("kkt_v3_algorithm", Path(__file__).with_name("test_kkt_v3_algorithm.py"))
_v3 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_v3)
chunk, emulate_kkt_v3, exact_inverse, rel = _v3.chunk, _v3.emulate_kkt_v3, _v3.exact_inverse, _v3.rel

C, BLK = 64, 16


def bf16_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's split: hi = bf16(x), lo = bf16(x - hi), both returned as fp32 values."""
    hi = x.float().to(torch.bfloat16).float()
    return hi, (x.float() - hi).to(torch.bfloat16).float()


def product3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """mm3: A_lo B_hi + A_hi B_lo + A_hi B_hi on bf16 values (exact products), fp32 result."""
    ah, al = bf16_split(a)
    bh, bl = bf16_split(b)
    return (al.double() @ bh.double() + ah.double() @ bl.double() + ah.double() @ bh.double()).float()


def diagonal_inverses(L: torch.Tensor) -> torch.Tensor:
    """X = blockdiag((I + L_bb)^-1), from v3's emulation of the per-thread forward substitution."""
    return torch.block_diag(*_v3.diagonal_inverses(L).split(BLK))


def emulate_kkt_v7(k: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """A0 (fp32, before the output cast) for one chunk: k [64, 128] (bf16 values), beta [64] (0 past end)."""
    kk = (k.double() @ k.double().T).float()
    L = torch.tril(kk * beta.float()[:, None], -1)
    X = diagonal_inverses(L)
    blk = torch.arange(C) // BLK
    l_off = torch.where(blk[:, None] > blk[None, :], L, torch.zeros(()))
    n = product3(X, l_off)
    q = product3(n, n) + torch.eye(C)
    p = q - product3(n, q)
    return product3(p, X)


@pytest.mark.parametrize("correlated", [False, True])
def test_v7_close_to_float64(correlated):
    for seed in range(3):
        k, beta = chunk(seed, correlated)
        err = rel(emulate_kkt_v7(k, beta), exact_inverse(k, beta))
        assert err < 3e-5, err  # ~2^-16: 60x below the bf16 output cast (~2e-3)


def test_v7_after_the_output_cast_matches_v4():
    """What the forward reads is A0 in bf16: v7's and v4's casts agree with float64's to the same error."""
    for seed in range(3):
        k, beta = chunk(seed, correlated=True)
        ex = exact_inverse(k, beta)
        cast = rel(ex.float().to(torch.bfloat16).float(), ex)
        v7 = rel(emulate_kkt_v7(k, beta).to(torch.bfloat16).float(), ex)
        v4 = rel(emulate_kkt_v3(k, beta).to(torch.bfloat16).float(), ex)
        assert v7 < 1.02 * cast and v4 < 1.02 * cast, (v7, v4, cast)


def test_v7_without_the_low_parts_fails():
    """One bf16 product per step (no lo terms) is ~100x worse: the split is what the precision rests on."""
    k, beta = chunk(5, correlated=True)

    def plain(a, b):
        return (a.to(torch.bfloat16).double() @ b.to(torch.bfloat16).double()).float()

    L = torch.tril((k.double() @ k.double().T).float() * beta[:, None], -1)
    X = diagonal_inverses(L)
    blk = torch.arange(C) // BLK
    n = plain(X, torch.where(blk[:, None] > blk[None, :], L, torch.zeros(())))
    q = plain(n, n) + torch.eye(C)
    a0 = plain(q - plain(n, q), X)
    assert rel(a0, exact_inverse(k, beta)) > 3e-4


def test_v7_ragged_tail():
    k, beta = chunk(7, correlated=True, valid=37)
    a = emulate_kkt_v7(k, beta)
    m = torch.eye(37, dtype=torch.float64) + torch.tril(
        beta[:37].double()[:, None] * (k[:37].double() @ k[:37].double().T), -1
    )
    assert rel(a[:37, :37], torch.linalg.inv(m)) < 3e-5
    assert a[:37, 37:].abs().max() == 0
    assert torch.equal(a[37:, :], torch.eye(C)[37:, :])
