"""kkt v8's and v9's forward substitutions, emulated in float32 with the kernel's grouping, against a float64 inverse.

The kernel (gdn/fwd/kkt_solve_v8.py) sums each row over whole groups of four k into four partial sums and
relies on the group's extra terms (k >= i) being exact zeros; the second warp starts at row 32. This checks
that arithmetic, on fresh random chunks, without a GPU.
"""

import numpy as np
import pytest

from qla_kernels.gdn.fwd.kkt_solve_v8 import CHUNK, NPART


def _l_matrix(rng, n_valid: int) -> np.ndarray:
    """L = StrictLower(diag(beta) K K^T) in float32 for unit-norm keys; rows past n_valid have beta = 0."""
    k = rng.standard_normal((CHUNK, 128))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    beta = rng.uniform(0.0, 1.0, CHUNK)
    beta[n_valid:] = 0.0
    kk = (k.astype(np.float32).astype(np.float64) @ k.T).astype(np.float32)
    return np.tril(kk * beta[:, None].astype(np.float32), -1).astype(np.float32)


def _emulate_right_looking(lmat: np.ndarray, skip_upper: bool = True) -> np.ndarray:
    """v8r: x = e_j, then for each k every row in the groups of four from k + 1's takes x_i += (-L_ik) x_k;
    skip_upper: columns of the second half start at its first row (v8r's second warp), else at row 0 (v9's
    32x32 diagonal blocks, each solved whole)."""
    n = lmat.shape[0]
    neg_lt = (-lmat.T).astype(np.float32)
    a0 = np.zeros((n, n), np.float32)
    for j in range(n):
        row0 = n // 2 if skip_upper and j >= n // 2 else 0
        x = np.zeros(n, np.float32)
        x[j] = 1.0
        for k in range(row0, n - 1):
            lo = (k + 1) // NPART * NPART
            x[lo:] = (x[lo:] + neg_lt[k, lo:] * x[k]).astype(np.float32)
        a0[:, j] = x
    return a0


def _emulate_blocked(lmat: np.ndarray) -> np.ndarray:
    """v9: the two 32x32 diagonal blocks right-looking, then M = (-L10) X00 and X10 = X11 M in float32."""
    h = CHUNK // 2
    a0 = np.zeros((CHUNK, CHUNK), np.float32)
    for r0 in (0, h):
        a0[r0 : r0 + h, r0 : r0 + h] = _emulate_right_looking(lmat[r0 : r0 + h, r0 : r0 + h], skip_upper=False)
    m = (-lmat[h:, :h]).astype(np.float32) @ a0[:h, :h]
    a0[h:, :h] = (a0[h:, h:] @ m.astype(np.float32)).astype(np.float32)
    return a0


def _emulate(lmat: np.ndarray) -> np.ndarray:
    """A0's columns as the kernel's threads compute them (float32, grouped partial sums)."""
    a0 = np.zeros((CHUNK, CHUNK), np.float32)
    for j in range(CHUNK):
        row0 = 0 if j < CHUNK // 2 else CHUNK // 2
        x = np.zeros(CHUNK, np.float32)
        for i in range(row0, CHUNK):
            part = np.zeros(NPART, np.float32)
            for k4 in range(row0 // NPART, (i + NPART - 1) // NPART):
                for p in range(NPART):
                    part[p] = np.float32(part[p] + lmat[i, k4 * NPART + p] * x[k4 * NPART + p])
            x[i] = np.float32(1.0 if i == j else 0.0) - ((part[0] + part[1]) + (part[2] + part[3]))
        a0[:, j] = x
    return a0


@pytest.mark.parametrize("form", ["v8", "v8r", "v9"])
@pytest.mark.parametrize(("seed", "n_valid"), [(0, 64), (1, 64), (2, 37), (3, 1)])
def test_v8_substitution_matches_float64(seed, n_valid, form):
    lmat = _l_matrix(np.random.default_rng(seed), n_valid)
    ref = np.linalg.inv(np.eye(CHUNK) + lmat.astype(np.float64))
    got = {"v8": _emulate, "v8r": _emulate_right_looking, "v9": _emulate_blocked}[form](lmat).astype(np.float64)
    assert np.array_equal(np.triu(got, 1), np.zeros_like(got)), "A0 must stay lower triangular"
    assert np.allclose(np.diag(got), 1.0)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-5, err  # fp32 arithmetic; the bf16 store (2^-9) is far above this
