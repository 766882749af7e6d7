"""The one-kernel CP combine (gdn/fwd/cp_combine.py) on the CPU through TileLang's C backend, every revision,
against float64 and against cp.combine (the host walk it replaces)."""

import pytest
import torch

tilelang = pytest.importorskip("tilelang")

from qla_kernels.gdn.cp import combine  # noqa: E402
from qla_kernels.gdn.cp_plan import CPDecision, build_cp_plan  # noqa: E402
from qla_kernels.gdn.fwd.cp_combine import BLOCK_V, PASS_CONFIGS, REV, THREADS, cp_combine_program  # noqa: E402

D = 128


@pytest.fixture(scope="module")
def kernels():
    """Built on first use, memoised per (use_h0, rev)."""
    cfg = {**PASS_CONFIGS, tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True}
    built = {}

    def get(use_h0: bool, rev: int, block_v: int):
        if (use_h0, rev, block_v) not in built:
            built[use_h0, rev, block_v] = tilelang.compile(
                cp_combine_program(D, D, block_v, use_h0, cpu_debug=True, rev=rev), target="c", pass_configs=cfg
            )
        return built[use_h0, rev, block_v]

    return get


def test_defaults_are_the_measured_fastest():
    """rev 2 at 32-column slices: the fastest link of profile_cp --combine on the H100 (NOTES.md, session 18)."""
    assert (REV, BLOCK_V, THREADS) == (2, 32, 128)


@pytest.mark.parametrize(("rev", "block_v"), [(1, 64), (2, 64), (2, 32), (3, 64), (3, 32)])
@pytest.mark.parametrize("with_h0", [True, False])
def test_combine_kernel_matches_float64_and_the_host_walk(kernels, with_h0, rev, block_v):
    # three sequences: split in 3, not split, split in 2 (ragged last pieces)
    cp = build_cp_plan([0, 64 * 5, 64 * 6, 64 * 9 + 3], CPDecision(2, 64, 0.0, 0.0), "cpu")
    h_v = 2
    gen = torch.Generator().manual_seed(3)
    hm = torch.randn(cp.num_pieces, h_v, D, 2 * D, generator=gen)
    hm[..., D:] /= D**0.5  # transitions of moderate norm, as decaying pieces give
    h0 = torch.randn(3, h_v, D, D, generator=gen)
    init = torch.full((cp.num_pieces, h_v, D, D), 7.0)  # sentinel: every piece's state must be written
    kernels(with_h0, rev, block_v)(hm, h0, cp.seq_first_piece, init)
    ref = torch.zeros(cp.num_pieces, h_v, D, D, dtype=torch.float64)
    first = cp.seq_first_piece.tolist()
    for s in range(3):
        st = h0[s].double() if with_h0 else torch.zeros(h_v, D, D, dtype=torch.float64)
        for p in range(first[s], first[s + 1]):
            ref[p] = st
            st = hm[p, :, :, D:].double() @ st + hm[p, :, :, :D].double()
    assert ((init.double() - ref).norm() / ref.norm()).item() < 1e-5  # 3xTF32: fp32-level products
    host = combine(cp, hm, h0 if with_h0 else None)
    assert torch.allclose(init, host, rtol=1e-4, atol=1e-4)
