"""Lower the forward kernels with TileLang and compile them for sm_90a with nvcc (no GPU needed).

Also guards the resource budget: no register spills, and shared memory within an H200 SM (227 KiB).
"""

import importlib.util

import pytest

pytestmark = pytest.mark.compile

if importlib.util.find_spec("tilelang") is None:
    pytest.skip("tilelang is not installed", allow_module_level=True)

from qla_kernels.gdn.build import build_sm90a, nvcc_available  # noqa: E402

if nvcc_available() is None:
    pytest.skip("nvcc is not on PATH", allow_module_level=True)

SMEM_LIMIT = 227 * 1024


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kkt_solve_compiles(dtype):
    from qla_kernels.gdn.fwd.kkt_solve import PASS_CONFIGS, kkt_solve_program

    rep = build_sm90a(kkt_solve_program(128, dtype), PASS_CONFIGS)
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()


@pytest.mark.parametrize(
    ("dtype", "use_h0", "v_first", "block_v"),
    [("bfloat16", True, False, 64), ("float16", False, False, 64), ("bfloat16", True, True, 64),
     ("bfloat16", True, False, 32)],
)
def test_fused_fwd_compiles(dtype, use_h0, v_first, block_v):
    from qla_kernels.gdn.fwd.fused_fwd import PASS_CONFIGS, fused_fwd_program

    prog = fused_fwd_program(128, 128, 128**-0.5, dtype, use_h0, v_first, block_v)
    rep = build_sm90a(prog, PASS_CONFIGS)
    assert "wgmma" in rep.source, "expected Hopper wgmma instructions in the generated CUDA"
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
