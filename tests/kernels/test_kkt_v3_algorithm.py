"""The v3 kkt_solve block algorithm, emulated buffer by buffer in torch (CPU), against float64.

This checks the algebra and the precision plan of gdn/fwd/kkt_solve_v3.py, not TileLang's code
generation (that is checked on the GPU by tests/gpu/test_qla_kkt_v3.py): the same 16 -> 32 -> 64
recursion, the same stacked operands (A1 = blockdiag(L10, L32), B1 = [X0; X2], A2 = blockdiag(X1, X3)),
and tf32 products emulated as the hardware does them (operand mantissas cut to 10 bits, fp32 sums).
"""

import pytest
import torch
import torch.nn.functional as F

C, BLK, HALF = 64, 16, 32


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """The kernel's _tf32_hi: add half an ulp of tf32, clear the low 13 bits (fp32 in, fp32 out)."""
    b = x.float().contiguous().view(torch.int32)
    return ((b + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_trunc(x: torch.Tensor) -> torch.Tensor:
    """What mma.sync .tf32 reads from an fp32 register: the low 13 mantissa bits ignored."""
    return (x.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def mma_tf32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (tf32_trunc(a).double() @ tf32_trunc(b).double()).float()


def product(a: torch.Tensor, b: torch.Tensor, precise: bool) -> torch.Tensor:
    """mm() of the kernel: 3xTF32 (lo*hi + hi*lo + hi*hi) or one truncated tf32 product."""
    if not precise:
        return mma_tf32(a, b)
    ah, bh = tf32_round(a), tf32_round(b)
    al, bl = a.float() - ah, b.float() - bh
    return mma_tf32(al, bh) + mma_tf32(ah, bl) + mma_tf32(ah, bh)


def diagonal_inverses(L: torch.Tensor) -> torch.Tensor:
    """(I + L_bb)^-1 of the four diagonal 16x16 blocks, stacked [64, 16]: the kernels' per-thread forward
    substitution, one column per thread, in fp32 (v3 and v7 share it)."""
    dx = torch.zeros(C, BLK)
    for b in range(4):
        lb = L[b * BLK:(b + 1) * BLK, b * BLK:(b + 1) * BLK]
        for c in range(BLK):
            col = torch.zeros(BLK)
            for i in range(BLK):
                col[i] = (1.0 if i == c else 0.0) - (lb[i, :i] * col[:i]).sum()
            dx[b * BLK:(b + 1) * BLK, c] = col
    return dx


def emulate_kkt_v3(k: torch.Tensor, beta: torch.Tensor, precise: bool = True) -> torch.Tensor:
    """A0 (fp32, before the output cast) for one chunk: k [64, 128] (bf16 values), beta [64] (0 past end)."""
    kk = (k.double() @ k.double().T).float()
    L = torch.tril(kk * beta.float()[:, None], -1)
    dx = diagonal_inverses(L)
    X = [dx[b * BLK:(b + 1) * BLK] for b in range(4)]
    z = torch.zeros(BLK, BLK)
    # level 1: both pairs as one 32-row product each
    a1 = torch.cat([torch.cat([L[16:32, 0:16], z], 1), torch.cat([z, L[48:64, 32:48]], 1)], 0)
    b1 = torch.cat([X[0], X[2]], 0)
    a2 = torch.cat([torch.cat([X[1], z], 1), torch.cat([z, X[3]], 1)], 0)
    u1 = product(a2, product(a1, b1, precise), precise)
    x11 = torch.cat([torch.cat([X[0], z], 1), torch.cat([-u1[:BLK], X[1]], 1)], 0)
    x22 = torch.cat([torch.cat([X[2], z], 1), torch.cat([-u1[BLK:], X[3]], 1)], 0)
    # level 2
    u2 = product(x22, product(L[HALF:, :HALF], x11, precise), precise)
    out = torch.zeros(C, C)
    out[:HALF, :HALF], out[HALF:, HALF:], out[HALF:, :HALF] = x11, x22, -u2
    return out


def chunk(seed: int, correlated: bool, valid: int = C):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(C, 128, generator=gen)
    if correlated:  # real keys share directions: larger |k_i . k_j|, harder inverse
        k = k + 1.5 * torch.randn(1, 128, generator=gen)
    k = F.normalize(k, dim=-1).to(torch.bfloat16).float()
    beta = torch.sigmoid(torch.randn(C, generator=gen))
    beta[valid:] = 0.0
    return k, beta


def exact_inverse(k, beta):
    m = torch.eye(C, dtype=torch.float64) + torch.tril(beta.double()[:, None] * (k.double() @ k.double().T), -1)
    return torch.linalg.inv(m)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("correlated", [False, True])
def test_precise_matches_fp32(correlated):
    for seed in range(3):
        k, beta = chunk(seed, correlated)
        ex = exact_inverse(k, beta)
        err = rel(emulate_kkt_v3(k, beta, precise=True), ex)
        assert err < 2e-6, err  # fp32 level: the bf16 output cast (~1e-3) dominates by far


def test_plain_tf32_is_worse_but_bounded():
    k, beta = chunk(5, correlated=True)
    ex = exact_inverse(k, beta)
    plain = rel(emulate_kkt_v3(k, beta, precise=False), ex)
    precise = rel(emulate_kkt_v3(k, beta, precise=True), ex)
    assert precise < plain < 5e-3


def test_ragged_tail_rows_do_not_touch_valid_rows():
    k, beta = chunk(7, correlated=True, valid=37)
    a = emulate_kkt_v3(k, beta)
    m = torch.eye(37, dtype=torch.float64) + torch.tril(
        beta[:37].double()[:, None] * (k[:37].double() @ k[:37].double().T), -1)
    assert rel(a[:37, :37], torch.linalg.inv(m)) < 2e-6
    assert a[:37, 37:].abs().max() == 0  # upper part stays exactly zero
    # rows past the end: beta = 0 zeroes their L rows, so they are unit rows of the inverse
    assert torch.equal(a[37:, :], torch.eye(C)[37:, :])


def test_tf32_round_is_nearest():
    x = torch.tensor([1.0 + 2**-11, 1.0 + 2**-10 + 2**-11 + 2**-13, -3.0000002])
    r = tf32_round(x)
    assert r[0].item() == 1.0 + 2**-10  # ties round away from zero in magnitude
    assert r[1].item() == 1.0 + 2**-9
    assert abs(r[2].item() + 3.0) < 2**-8
    assert torch.equal(tf32_round(r), r)
