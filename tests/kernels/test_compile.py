"""Lower the forward kernels with TileLang and compile them for sm_90a with nvcc (no GPU needed).

Also guards the resource budget: no register spills, and shared memory within an H200 SM (227 KiB).
"""

import importlib.util
import re

import pytest

pytestmark = pytest.mark.compile

if importlib.util.find_spec("tilelang") is None:
    pytest.skip("tilelang is not installed", allow_module_level=True)

from qla_kernels.gdn.build import build_sm90a, nvcc_available  # noqa: E402

if nvcc_available() is None:
    pytest.skip("nvcc is not on PATH", allow_module_level=True)

SMEM_LIMIT = 227 * 1024


@pytest.mark.parametrize(("dtype", "parallel_cumsum"), [("bfloat16", False), ("float16", False), ("bfloat16", True)])
def test_kkt_solve_compiles(dtype, parallel_cumsum):
    from qla_kernels.gdn.fwd.kkt_solve import PASS_CONFIGS, kkt_solve_program

    rep = build_sm90a(kkt_solve_program(128, dtype, parallel_cumsum), PASS_CONFIGS)
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


@pytest.mark.parametrize(
    ("dtype", "precise", "min_blocks"),
    [("bfloat16", True, 6), ("float16", True, 0), ("bfloat16", False, 6)],
)
def test_kkt_solve_v3_compiles(dtype, precise, min_blocks):
    from qla_kernels.gdn.fwd.kkt_solve_v3 import PASS_CONFIGS, kkt_solve_v3_program

    rep = build_sm90a(kkt_solve_v3_program(128, dtype, precise, min_blocks), PASS_CONFIGS)
    assert "wgmma" in rep.source, "K K^T should be a Hopper wgmma"
    assert "kTensorFloat32" in rep.source, "the block products should be tf32 tensor-core mma"
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    # budget: 6 CTAs per SM (6 x (smem + 1 KiB reserved) <= 228 KiB) and the register cap that implies
    assert 0 < rep.dyn_smem_bytes <= 36 * 1024, rep.line()
    if min_blocks:
        assert f"__launch_bounds__(128, {min_blocks})" in rep.source
        assert rep.registers <= 65536 // (128 * min_blocks), rep.line()


@pytest.mark.parametrize(
    ("rev", "block_v", "profile"),
    [(4, 128, False), (5, 128, False), (5, 64, False), (5, 32, False), (5, 128, True), (6, 32, False),
     (7, 128, False), (7, 64, False), (7, 32, False), (7, 128, True), (8, 128, False), (8, 32, False),
     (9, 128, False), (9, 32, False)],
)
def test_fused_fwd_ws_compiles(rev, block_v, profile):
    from qla_kernels.gdn.fwd.fused_fwd_ws import PASS_CONFIGS, fused_fwd_ws_program

    prog = fused_fwd_ws_program(128, 128, 128**-0.5, "bfloat16", True, False, block_v, profile, rev)
    rep = build_sm90a(prog, PASS_CONFIGS)
    assert "wgmma" in rep.source and "warpgroup_reg_alloc" in rep.source, "expected the warp-specialised form"
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    if rev >= 5:
        assert "tma_store" in rep.source, "rev 5 stores O with TMA"
        assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
        assert not rep.wgmma_serialized, rep.line()
    if profile:
        assert "clock64" in rep.source
    if rev >= 7:
        assert "wgmma_rs" in rep.source, "rev 7's chain GEMM takes -Wk as wgmma's register operand"
    if rev >= 9:
        assert "wait_wgmma<0>" in rep.source, "rev 9 waits once for -Wk's and U's GEMMs"
        for stage in ("o_sh0", "o_sh1"):  # O's staging by stmatrix, not 4-byte stores (session 13)
            assert f"ptx_stmatrix_m8n8_x4((&(((bfloat16_t*){stage})" in rep.source, stage


@pytest.mark.parametrize("use_h0", [True, False])
def test_fused_fwd_vs_compiles(use_h0):
    """vs1 (session 14; passed its GPU checks on an H100 in session 15): both state warpgroups' five chain and
    output GEMMs take the state
    or the new values as wgmma's register operand (4 rs of N = 64 and 1 of N = 128 each), V^T Agb^T reads V
    transposed from shared memory, Q K^T is WG3's; 24 + 192 + 192 + 104 registers, nothing spilled or
    serialised."""
    from qla_kernels.gdn.fwd.fused_fwd_vs import PASS_CONFIGS, fused_fwd_vs_program

    rep = build_sm90a(fused_fwd_vs_program(128, 128, 128**-0.5, "bfloat16", use_h0), PASS_CONFIGS)
    rs64 = "wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 64, 16"
    rs128 = "wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 128, 16"
    ss_t = "wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 64, 16, true"
    assert rep.source.count(rs64) == 8 and rep.source.count(rs128) == 2, rep.line()
    assert rep.source.count(ss_t) == 2, "V^T Agb^T, V transposed from shared memory, once per state warpgroup"
    assert rep.source.count("wait_wgmma<0>") == 4, "O1/W and Vnew's two GEMMs each under one wait, per warpgroup"
    for n in ("warpgroup_reg_alloc<192>", "warpgroup_reg_dealloc<104>", "warpgroup_reg_dealloc<24>"):
        assert rep.source.count(n) == (2 if n.endswith("<192>") else 1), n
    assert "tma_store" in rep.source
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert not rep.wgmma_serialized, rep.line()


@pytest.mark.parametrize(("precise", "fast_gates"), [(False, False), (True, False), (False, True)])
def test_fused_fwd_vs_solve_in_kernel_compiles(precise, fast_gates):
    """vs2 / vs2p (session 15; correct on an H100, not yet fast): vs1's state warpgroups unchanged (the same
    register-operand GEMMs), no Agb load (stage 1 is inside: no a0 argument, g_cumsum written), the auxiliary
    warpgroup's Q K^T and K K^T on wgmma and the inverse's block products on tf32 mma.sync, named barriers only
    inside the warpgroups' loops. The auxiliary warpgroup spills ~18 loop-invariant words at 104 registers
    (bounded here; at 184 / 120 the state warpgroups would spill instead). vs3 (fast_gates, session 25): the gate's
    scan by warp shuffles in every warp of the auxiliary warpgroup (none in a branch), no per-thread prefix sums,
    Q K^T's wgmma issued before the scan and waited for after it."""
    from qla_kernels.gdn.fwd.fused_fwd_vs import PASS_CONFIGS, fused_fwd_vs_program

    rep = build_sm90a(fused_fwd_vs_program(128, 128, 128**-0.5, "bfloat16", True, True, precise,
                                           fast_gates=fast_gates), PASS_CONFIGS)  # fmt: skip
    rs64 = "wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 64, 16"
    rs128 = "wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 128, 16"
    ss = "wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 64, 16, false"
    assert rep.source.count(rs64) == 8 and rep.source.count(rs128) == 2, rep.line()
    assert rep.source.count(ss) == 2, "Q K^T and K K^T, the auxiliary warpgroup's"
    assert "a0_desc" not in rep.source and "g_cumsum[" in rep.source
    tf32 = "mma_sync<tl::DataType::kTensorFloat32"
    assert rep.source.count(tf32) >= (12 if precise else 4), "the inverse's block products"
    assert rep.source.count("__syncthreads()") == 1, "only the barrier-init one: the warpgroups sync by name"
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    # session 16: vs2p's lo/hi operand writes, 116 / 140 B; session 25: vs3 100-116 / 132-148 B (the hoisted gate
    # values and the scan's registers)
    limit = 160 if precise or fast_gates else 128
    assert rep.spill_stores <= limit and rep.spill_loads <= limit, rep.line()
    assert not rep.wgmma_serialized, rep.line()
    # session 16's lean auxiliary warpgroup: one barrier phase per step of the inverse, not ~25
    aux = rep.source[rep.source.index("warpgroup_reg_dealloc<104>"):]
    assert aux.count("__sync_thread_partial") <= 14, aux.count("__sync_thread_partial")
    if fast_gates:
        assert aux.count("__shfl_up_sync") == 2 and aux.count("__shfl_sync(") == 2
        assert "part[" not in aux, "vs2's per-thread prefix sums"
        scan = aux.index("__shfl_up_sync")
        # Q K^T (the first wgmma of the loop) is committed before the scan and waited for after it
        assert aux.rindex("warpgroup_commit_batch", 0, scan) < scan < aux.index("wait_wgmma<0>", scan)
        # no shuffle inside a thread-index branch: the scan runs in every warp
        assert "threadIdx.x) < 416" not in aux[aux.rindex("for (int c_", 0, scan):scan]
        # the first warp's gs writes, then WG3's named barrier (TileLang's, id 4), then Pg's reads: correctness rests
        # on TileLang inserting it, so it is checked here
        waited = aux.index("wait_wgmma<0>", scan)
        assert "((float*)gs)[" in aux[scan:waited]
        assert "__sync_thread_partial(4, 128)" in aux[waited:aux.index("exp2f", waited)]


@pytest.mark.parametrize("fast_gates", [False, True])
def test_fused_fwd_vs_profile_build_compiles(fast_gates):
    """vs2's (vs3's) profile build: clock64 reads in WG1 and WG3, the prof argument last, the same GEMMs."""
    from qla_kernels.gdn.fwd.fused_fwd_vs import (
        NUM_PHASES,
        PASS_CONFIGS,
        PHASES,
        PHASES_FAST_GATES,
        fused_fwd_vs_program,
    )

    assert NUM_PHASES == max(len(p) for p in PHASES) == 8
    assert [len(p) for p in PHASES_FAST_GATES] == [len(p) for p in PHASES]
    rep = build_sm90a(fused_fwd_vs_program(128, 128, 128**-0.5, "bfloat16", True, True, False, True, fast_gates),
                      PASS_CONFIGS)
    assert "clock64" in rep.source and "prof[" in rep.source
    assert rep.source.count("mma_sync<tl::DataType::kTensorFloat32") >= 4
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()


@pytest.mark.parametrize("profile", [False, True])
def test_fused_fwd_vs4_compiles(profile):
    """vs4: vs3 with kkt v10's inverse in WG3: six fp16 wgmma products and no tf32 mma.sync, no CTA-wide barrier past
    the setup (WG3's own are named), fewer spills and less shared memory than vs3 (112-116 / 144-148 B, 179.3 KiB)."""
    from qla_kernels.gdn.fwd.fused_fwd_vs import PASS_CONFIGS, PHASES, PHASES_FP16_INVERSE, fused_fwd_vs_program

    assert [len(p) for p in PHASES_FP16_INVERSE] == [len(p) for p in PHASES]
    rep = build_sm90a(fused_fwd_vs_program(128, 128, 128**-0.5, "bfloat16", True, True, False, profile, True, True),
                      PASS_CONFIGS)  # fmt: skip
    assert rep.source.count("wgmma_ss<tl::DataType::kFloat16, tl::DataType::kFloat16") == 6, rep.line()
    assert "kTensorFloat32" not in rep.source
    assert rep.source.count("__syncthreads()") == 1, "only the barrier after the setup: the warpgroups diverge"
    if not profile:  # (the profile build's clock locals spill a few more words: 124 / 140 B)
        assert rep.spill_stores <= 112 and rep.spill_loads <= 144, rep.line()
    assert 0 < rep.dyn_smem_bytes <= 179.3 * 1024, rep.line()
    assert ("clock64" in rep.source) == profile


@pytest.mark.parametrize(("use_h0", "overlap"), [(True, False), (False, False), (True, True)])
def test_fused_fwd_ws7_compiles(use_h0, overlap):
    """Rev 7's chain GEMMs take the state and the new values from registers (wgmma's rs form); rev 8
    (overlap) waits for its first two only after the state publish."""
    from qla_kernels.gdn.fwd.fused_fwd_ws7 import PASS_CONFIGS, fused_fwd_ws7_program

    rep = build_sm90a(fused_fwd_ws7_program(128, 128, 128**-0.5, "bfloat16", use_h0, False, overlap), PASS_CONFIGS)
    assert ("wait_wgmma<0>" in rep.source) == overlap
    assert rep.source.count("wgmma_rs<") == 2, "the chain's two register-operand GEMMs"
    assert "warpgroup_reg_alloc" in rep.source and "tma_store" in rep.source
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()


def test_kkt_solve_v3_hoisted_compiles():
    from qla_kernels.gdn.fwd.kkt_solve_v3 import PASS_CONFIGS, kkt_solve_v3_program

    rep = build_sm90a(kkt_solve_v3_program(128, "bfloat16", True, 6, hoist_index=True), PASS_CONFIGS)
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert rep.registers <= 65536 // (128 * 6), rep.line()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kkt_solve_v10_compiles(dtype):
    # the forward-only stage 1 with fp16 whole-tile doublings: eight CTAs an SM by registers and shared memory
    # (v4t: six), six fp16 wgmma products after K K^T, and no per-iteration barrier in its store loops
    from qla_kernels.gdn.fwd.kkt_solve_v10 import PASS_CONFIGS, kkt_solve_v10_program

    rep = build_sm90a(kkt_solve_v10_program(128, dtype), PASS_CONFIGS)
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert rep.registers <= 64, rep.line()
    assert 0 < rep.dyn_smem_bytes <= 27 * 1024, rep.line()
    fp16_products = 6 + (dtype == "float16")  # K K^T too when K is fp16
    assert rep.source.count("wgmma_ss<tl::DataType::kFloat16, tl::DataType::kFloat16") == fp16_products, rep.line()
    assert rep.source.count("__syncthreads()") <= 24, rep.line()
    assert "exp2" in rep.source, "the gate goes into L before the inverse"
    # L' leaves the accumulator as paired fp16 stores (session 27: the select form stored 2 bytes at a time and
    # was the CTA's longest phase)
    assert not re.search(r"\(\(half_t\*\)l_sh\)\[[^\n]*\] = ", rep.source), "scalar stores into L'"


@pytest.mark.parametrize(("impl", "dtype"), [("v4", "bfloat16"), ("v4", "float16"), ("v4t", "bfloat16")])
def test_kkt_solve_v4_emit_ab_compiles(impl, dtype):
    # ws10-ws12's stage 1: v4 (v4t: one tf32 product per block product) writing Gamma o A0 diag(beta) in A0's
    # place; held to v4's budget (80 registers for six CTAs/SM, v4's 38.8 KiB of shared memory)
    from qla_kernels.gdn.api import agb_kkt_args
    from qla_kernels.gdn.fwd.kkt_solve_v3 import PASS_CONFIGS, kkt_solve_v3_program

    rep = build_sm90a(kkt_solve_v3_program(128, dtype, *agb_kkt_args(impl)), PASS_CONFIGS)
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert rep.registers <= 65536 // (128 * 6), rep.line()
    assert 0 < rep.dyn_smem_bytes <= 38.8 * 1024, rep.line()
    assert "exp2" in rep.source, "Gamma should be applied in the kernel"
    # the four block products lower to 12 tf32 mma_sync call sites per pass; v4 runs three passes (3xTF32),
    # v4t one
    assert rep.source.count("kTensorFloat32") == (36 if impl == "v4" else 12), rep.line()


@pytest.mark.parametrize(("rev", "block_v"), [(1, 64), (2, 64), (2, 32), (3, 64), (3, 32)])
@pytest.mark.parametrize("use_h0", [True, False])
def test_cp_combine_kernel_compiles(use_h0, rev, block_v):
    from qla_kernels.gdn.fwd.cp_combine import PASS_CONFIGS, cp_combine_program

    rep = build_sm90a(cp_combine_program(128, 128, block_v, use_h0, rev=rev), PASS_CONFIGS)
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    # the 3xTF32 products on tensor cores: rev 1 on mma.sync, rev 2+ on wgmma (tfloat32 operands)
    if rev == 1:
        assert "mma_sync" in rep.source and "wgmma" not in rep.source
    else:
        assert rep.source.count("wgmma_ss<tl::DataType::kTensorFloat32") == 3, rep.line()
    if rev >= 2:  # M_p staged through registers with 16-byte loads, not 128 scalar ones
        assert "float4*)(m_rows" in rep.source


@pytest.mark.parametrize(("block_v", "rev"), [(128, 5), (64, 5), (128, 7), (32, 7), (128, 8), (128, 9)])
def test_cp_state_pass_compiles(block_v, rev):
    from qla_kernels.gdn.fwd.fused_fwd_ws import PASS_CONFIGS, fused_fwd_ws_program

    prog = fused_fwd_ws_program(128, 128, 128**-0.5, "bfloat16", False, False, block_v, False, rev, True)
    rep = build_sm90a(prog, PASS_CONFIGS)
    assert rep.name.startswith("cp_state_pass"), rep.name
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()


@pytest.mark.parametrize(("block_v", "use_dht"), [(64, True), (128, False), (32, True)])
def test_bwd_dstate_chain_compiles(block_v, use_dht):
    from qla_kernels.gdn.bwd.dstate_chain import PASS_CONFIGS, bwd_dstate_program

    rep = build_sm90a(bwd_dstate_program(128, 128, 128**-0.5, "bfloat16", use_dht, block_v), PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()


@pytest.mark.parametrize("block_v", [32, 64])
def test_bwd_dstate_chain_rev4_compiles(block_v):
    """Stage 1 rev4 ($QLA_BWD_DSTATE=rev4): rev3's chain plus the low part of scale D dO and its GEMM, no spills."""
    from qla_kernels.gdn.bwd.dstate_chain import PASS_CONFIGS, bwd_dstate_program

    prog = bwd_dstate_program(128, 128, 128**-0.5, "bfloat16", True, block_v, 256, False, True, 2, True, True)
    rep = build_sm90a(prog, PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert rep.source.count("wgmma") > 0


@pytest.mark.parametrize("block_v", [32, 64])
def test_bwd_dstate_chain_rev5_compiles(block_v):
    """Stage 1 rev5: rev4 with the two Q^T products in flight over dVn's pass, waited for at the step's end; their
    Q operand a consumer-owned copy, and every pipeline stage released only after a read that has completed
    (session 20's first GPU run: q's stage went back to the TMA producer while the products still read it)."""
    from qla_kernels.gdn.bwd.dstate_chain import PASS_CONFIGS, bwd_dstate_program

    prog = bwd_dstate_program(128, 128, 128**-0.5, "bfloat16", True, block_v, 256, False, True, 2, True, True, True)
    rep = build_sm90a(prog, PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    body = rep.source[rep.source.index("wgmma_ss"):]
    q_products = body.index("q2_sh)[0]")  # the Q^T products read the copy
    assert "q_sh)[0]" not in body[: body.index("wait_wgmma<0>")].replace("q2_sh)[0]", "")
    assert body.index("warpgroup_wait<0>") < q_products < body.index("wait_wgmma<0>")  # K dS' waited first


@pytest.mark.parametrize("rev", ["rev1", "rev4", "rev5", "rev6", "rev7", "rev8"])
def test_bwd_chunk_grads_compiles(rev):
    from qla_kernels.gdn.bwd.chunk_grads import MERGED_PASS_CONFIGS, PASS_CONFIGS, bwd_chunk_grads_program
    from qla_kernels.gdn.bwd_api import GRADS_FLAGS

    threads, *flags = GRADS_FLAGS[rev]
    prog = bwd_chunk_grads_program(128, 128, 128**-0.5, "bfloat16", threads, False, False, *flags)
    rep = build_sm90a(prog, MERGED_PASS_CONFIGS if flags[5] else PASS_CONFIGS)  # ds_tma: the merged build
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert f"__launch_bounds__({threads}, 1)" in rep.source
    if flags[2]:  # rev 4+: six bulk copies (S and the 128-wide tiles in 64-column boxes) on two mbarriers
        assert rep.source.count("tl::tma_load(") >= 6 and "expect_transaction" in rep.source
    if flags[5]:  # rev 7: dS' by TMA too (seven copies), none of it loaded by the threads from global memory
        assert rep.source.count("tl::tma_load(") >= 7 and "tl::tma_load(ds_next_desc" in rep.source
        assert "float* __restrict__ ds_next" not in rep.source, "dS' read by the threads"
    if flags[6]:  # rev 8: the dg tail's suffix sums as scans, not a serial 64-step loop per row
        assert "CumSum" in rep.source or "cumsum" in rep.source
    if flags[4]:  # rev 7: Gamma's exp2 once per element of the CTA's fragment (rev 6's source has 9 exp2 sites)
        assert rep.source.count("exp2") <= 4, rep.source.count("exp2")


@pytest.mark.parametrize(("rev", "dtype", "fewer"), [("rev12", "bfloat16", 3), ("rev13", "bfloat16", 4),
                                                    ("rev12", "float16", 3)])  # fmt: skip
def test_bwd_chunk_grads_lean_compiles(rev, dtype, fewer):
    """Stage 2 rev 12 / rev 13 (rev 8's flags with lean / and dg_i2, writing dv as the backward runs it): no
    spills, within shared memory (rev 13 keeps V resident to dv), and 3 / 4 GEMMs fewer than rev 8's same build
    (each wgmma GEMM appears three times in the generated source), in less code."""
    from qla_kernels.gdn.bwd.chunk_grads import MERGED_PASS_CONFIGS, bwd_chunk_grads_program
    from qla_kernels.gdn.bwd_api import GRADS_FLAGS, LEAN_GRADS_REVS

    base, extra = LEAN_GRADS_REVS[rev]
    threads, *flags = GRADS_FLAGS[base]
    reps = {}
    for lean in (False, True):
        prog = bwd_chunk_grads_program(128, 128, 128**-0.5, dtype, threads, False, False, *flags, True,
                                       **(extra if lean else {}))  # fmt: skip
        reps[lean] = build_sm90a(prog, MERGED_PASS_CONFIGS)
        print(reps[lean].line())
    rep = reps[True]
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert reps[False].source.count("wgmma") - rep.source.count("wgmma") == fewer * 3
    assert rep.code_bytes < reps[False].code_bytes


@pytest.mark.parametrize("prefetch", [False, True], ids=["walk", "walk-prefetch"])
def test_bwd_fused_walk_compiles(prefetch):
    """The fused backward's walk ($QLA_BWD_FUSED 1 and 2, as bwd_api._fused_walk builds it): no spills, within shared
    memory with the merged plan, and the dS' cast without a barrier in each unrolled step (one pass put 32 there)."""
    import itertools
    import re

    from qla_kernels.gdn.bwd.chunk_grads import MERGED_PASS_CONFIGS, bwd_chunk_grads_program
    from qla_kernels.gdn.bwd_api import GRADS_FLAGS

    threads, tile, hoist, tma, dw_beta, gamma_frag, _ds_tma, scan = GRADS_FLAGS["rev8"]
    prog = bwd_chunk_grads_program(128, 128, 128**-0.5, "bfloat16", threads, False, False, tile, hoist, tma, dw_beta,
                                   gamma_frag, False, scan, True, lean=True, fused=True, prefetch=prefetch)  # fmt: skip
    rep = build_sm90a(prog, MERGED_PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert "bwd_fused_kernel" in rep.source
    barrier_per_step = r"#pragma unroll\n\s*for \(int \w+ = 0; \w+ < 32; \+\+\w+\) \{\n\s*__syncthreads\(\);"
    assert not re.findall(barrier_per_step, rep.source)
    # prefetch: the next chunk's K, S, Q and dO are issued inside the walk (the first chunk's before it)
    assert rep.source.count("tma_load(") == (10 if prefetch else 6), rep.source.count("tma_load(")
    if prefetch:  # those four tiles are loaded while the dg tail and the next step's first passes run: the merged
        # plan must give their bytes to no other buffer (it sees a straight body, not the loop that carries them)
        offsets = {name: int(off) for name, off in
                   re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\)", rep.source)}
        tiles = {"k_sh": 16384, "q_sh": 16384, "do_sh": 16384, "s_sh": 32768}
        spans = sorted((offsets[name], offsets[name] + size) for name, size in tiles.items())
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
        end = spans[-1][1]
        assert all(off >= end for name, off in offsets.items() if name not in tiles), offsets


def test_bwd_fused_walk_profile_compiles():
    """The fused walk's profile build (profile_bwd --fused): the walk's code plus one clock read at each of its 12
    stamps, every phase summed into prof by thread 0; no spills, still within shared memory."""
    from qla_kernels.gdn.bwd.chunk_grads import FUSED_PROFILE_STAMPS, MERGED_PASS_CONFIGS, bwd_chunk_grads_program
    from qla_kernels.gdn.bwd_api import GRADS_FLAGS

    threads, tile, hoist, tma, dw_beta, gamma_frag, _ds_tma, scan = GRADS_FLAGS["rev8"]
    prog = bwd_chunk_grads_program(128, 128, 128**-0.5, "bfloat16", threads, False, True, tile, hoist, tma, dw_beta,
                                   gamma_frag, False, scan, True, lean=True, fused=True)  # fmt: skip
    rep = build_sm90a(prog, MERGED_PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert "bwd_fused_profile_kernel" in rep.source
    assert rep.source.count("clock64") == len(FUSED_PROFILE_STAMPS)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bwd_chunk_grads_rev11_compiles(dtype):
    # rev 11 (bwd/chunk_grads_ws.py): two warpgroups at once; TileLang's cross-warp reductions sync on named
    # barriers 1 and 2 with a fixed count, so only warpgroup Y (threads 128-255) may reduce across warps, and the
    # warpgroups' own barriers are 3 (X) and 4 (Y)
    import re

    from qla_kernels.gdn.bwd.chunk_grads_ws import PASS_CONFIGS, bwd_chunk_grads_ws_program

    rep = build_sm90a(bwd_chunk_grads_ws_program(128, 128, 128**-0.5, dtype), PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert "__launch_bounds__(256, 1)" in rep.source
    found = re.findall(r"AllReduce<tl::SumOp, (\d+), (\d+), (\d+),", rep.source)
    reductions = [tuple(int(x) for x in m) for m in found]
    assert reductions and {offset for _, _, offset in reductions} == {0, 128}
    for threads, scale, offset in reductions:
        assert offset == 128 or threads <= 32, (threads, scale, offset)  # X reduces within a warp only
    assert any(offset == 128 and threads > 32 for threads, _, offset in reductions)  # Y's column sums
    partial = set(re.findall(r"__sync_thread_partial\((\d+), (\d+)\)", rep.source))
    assert partial == {("3", "128"), ("4", "128")}, partial
    assert rep.source.count("tl::tma_load(") >= 6 and rep.source.count(".init(128)") == 3
    assert rep.code_bytes > 0 and rep.code_bytes % 16 == 0, rep.code_bytes  # SASS: 16-byte instructions


@pytest.mark.parametrize(("ratio", "early"), [(1, False), (2, False), (2, True)])
def test_bwd_chunk_grads_rev9_compiles(ratio, early):
    # rev 9 (bwd_api's default path at h_v / h_qk = 1, 2): dq and dk leave stage 2 as the GVA group's sums in
    # bf16; at r = 2 the pair of value-head CTAs is a 2-CTA cluster exchanging one fp32 tile each way by DSMEM
    from qla_kernels.gdn.bwd.chunk_grads import MERGED_PASS_CONFIGS, bwd_chunk_grads_program
    from qla_kernels.gdn.bwd_api import GRADS_FLAGS

    threads, *flags = GRADS_FLAGS["rev9"]
    prog = bwd_chunk_grads_program(128, 128, 128**-0.5, "bfloat16", threads, False, False, *flags, True, True, ratio,
                                   pair_early=early)  # rev10: dk first, one hand-off on the pair's path
    rep = build_sm90a(prog, MERGED_PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()
    assert "bfloat16_t* __restrict__ dq_v" in rep.source and "float* __restrict__ dq_v" not in rep.source
    if ratio == 2:  # one bulk SM-to-SM copy each way (dq to rank 0, dk to rank 1), the split barrier at the end
        assert rep.source.count("tl::tma_store_cluster(") == 2, rep.source.count("tl::tma_store_cluster(")
        assert "tl::cluster_arrive()" in rep.source and "tl::cluster_wait()" in rep.source
    else:
        assert "cluster" not in rep.source.split("extern \"C\"")[-1]


@pytest.mark.parametrize(("rev", "use_h0", "block_v"), [(5, True, 128), (5, False, 32), (9, True, 128), (9, False, 32)])
def test_fused_fwd_ws5_state_store_compiles(rev, use_h0, block_v):
    # bwd_api.chunk_states with $QLA_BWD_STATES=ws5 (rev 5) or ws12 (rev 9): WG0 TMA-stores the bf16 state of
    # every chunk
    from qla_kernels.gdn.fwd.fused_fwd_ws import PASS_CONFIGS, fused_fwd_ws_program

    prog = fused_fwd_ws_program(128, 128, 128**-0.5, "bfloat16", use_h0, False, block_v, False, rev, False, True)
    rep = build_sm90a(prog, PASS_CONFIGS)
    print(rep.line())
    assert "tl::tma_store(states_desc" in rep.source and "tma_store_wait" in rep.source
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()


def test_bwd_agb_compiles():
    # bwd/agb.py ($QLA_BWD_STATES=ws12's Agb from A0): an element-wise pass, its indices hoisted (no 64-bit
    # divisions per element: 89 KiB of code before, ~30 after)
    from qla_kernels.gdn.bwd.agb import agb_from_a0_program
    from qla_kernels.gdn.fwd.fused_fwd import PASS_CONFIGS

    rep = build_sm90a(agb_from_a0_program("bfloat16"), PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert rep.code_bytes < 48 * 1024, rep.line()


@pytest.mark.parametrize("use_h0", [True, False])
def test_fused_fwd_state_store_compiles(use_h0):
    # the V-slice bwd_api.chunk_states uses (at 64 the kernel spills 12-20 B past 128 registers)
    from qla_kernels.gdn.fwd.fused_fwd import PASS_CONFIGS, fused_fwd_program

    prog = fused_fwd_program(128, 128, 128**-0.5, "bfloat16", use_h0, False, 32, store_states=True)
    rep = build_sm90a(prog, PASS_CONFIGS)
    print(rep.line())
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT, rep.line()


@pytest.mark.parametrize(
    ("dtype", "one_wait", "lean_x"),
    [("bfloat16", False, False), ("float16", False, False), ("bfloat16", True, False), ("bfloat16", True, True)],
)
def test_kkt_solve_v7_compiles(dtype, one_wait, lean_x):
    """v7: K K^T and the four split products on wgmma, no spills, four CTAs per SM by shared memory."""
    from qla_kernels.gdn.fwd.kkt_solve_v7 import PASS_CONFIGS, kkt_solve_v7_program

    rep = build_sm90a(kkt_solve_v7_program(128, dtype, 0, one_wait, lean_x), PASS_CONFIGS)
    assert rep.source.count("warpgroup_wait<") == (1 if one_wait else 13), "v7a: only K K^T's implicit wait"
    assert rep.source.count("wgmma_ss<") == 13, "K K^T plus 4 products x 3 split GEMMs, all wgmma"
    assert "kTensorFloat32" not in rep.source, "no tf32 mma.sync left"
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.dyn_smem_bytes <= 56 * 1024, rep.line()  # 4 x (smem + 1 KiB reserved) <= 228 KiB


@pytest.mark.parametrize(("dtype", "right_looking"), [("bfloat16", False), ("float16", False), ("bfloat16", True)])
def test_kkt_solve_v8_compiles(dtype, right_looking):
    """v8: K K^T on wgmma, then the column substitutions fully unrolled in registers (no spills) with L read
    by 16-byte shared loads, and a register count that leaves four CTAs per SM."""
    from qla_kernels.gdn.fwd.kkt_solve_v8 import PASS_CONFIGS, kkt_solve_v8_program

    rep = build_sm90a(kkt_solve_v8_program(128, dtype, right_looking), PASS_CONFIGS)
    assert rep.source.count("wgmma_ss<") == 1, "only K K^T on tensor cores"
    assert "qla_lds_f32x4" in rep.source, "L's rows should be read by the 16-byte load helper"
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.registers <= 65536 // (128 * 4), rep.line()
    assert 0 < rep.dyn_smem_bytes <= 40 * 1024, rep.line()


@pytest.mark.parametrize("lean", [False, True])
def test_kkt_solve_v9_compiles(lean):
    """v9: K K^T on wgmma, the two diagonal solves and the two block products in fp32 registers (no spills),
    four CTAs per SM by registers and shared memory."""
    from qla_kernels.gdn.fwd.kkt_solve_v9 import PASS_CONFIGS, kkt_solve_v9_program

    rep = build_sm90a(kkt_solve_v9_program(128, "bfloat16", lean), PASS_CONFIGS)
    assert rep.source.count("wgmma_ss<") == 1, "only K K^T on tensor cores"
    assert "__launch_bounds__(128, 4)" in rep.source
    assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.line()
    assert 0 < rep.registers <= 65536 // (128 * 4), rep.line()
    assert 0 < rep.dyn_smem_bytes <= 227 * 1024 // 4 - 1024, rep.line()


@pytest.mark.parametrize("early_release", [False, True], ids=["ws", "ws3"])
def test_bwd_fused_ws_compiles(early_release):
    """The warp-specialised fused backward ($QLA_BWD_FUSED=ws, and ws3 on the early-release schedule): within shared
    memory with every tile single-buffered (no merged plan), wgmma in every role, eight mbarriers (twelve for ws3), no
    cross-warp reduction (its bar.sync ids 1 and 2 would meet the roles' own named barriers), unserialised wgmma and
    spills of at most 256 B (session 28: 172/216 B, mostly WG2's around its first products)."""
    from qla_kernels.gdn.bwd.fused_ws import BAR_ASIDE, BAR_CHAIN, BAR_KSIDE, PASS_CONFIGS, bwd_fused_ws_program

    program = bwd_fused_ws_program(128, 128, 128**-0.5, "bfloat16", early_release=early_release)
    rep = build_sm90a(program, PASS_CONFIGS)
    print(rep.line())
    # the mbarriers are static shared memory, padded to 1 KiB by the dynamic buffer's 1024-byte alignment: over
    # 231424 B of dynamic memory, cudaFuncSetAttribute refuses the launch (session 28's review, on an H100)
    assert 0 < rep.dyn_smem_bytes <= SMEM_LIMIT - 1024, rep.line()
    assert rep.spill_stores <= 256 and rep.spill_loads <= 256, rep.line()
    assert rep.registers == 128, rep.line()  # 4 x 128 threads x the setmaxnreg budgets fill the register file
    assert not rep.wgmma_serialized, rep.line()
    assert rep.source.count("uint64_t") >= (12 if early_release else 8)
    assert "wgmma_rs" in rep.source and "wgmma_ss" in rep.source
    assert "workspace" not in rep.source, "a cross-warp reduction came back"
    # every named barrier id belongs to one role: the roles' own (wg_sync) each in their own chunk loop, and none
    # of them among the ids TileLang picks for its syncs
    from qla_kernels.gdn.sass_stats import chunk_loops

    lines = rep.source.splitlines()
    uses: dict[int, set[int]] = {}
    for n, text in enumerate(lines, 1):
        for bar_id, _count in re.findall(r"__sync_thread_partial\((\d+), (\d+)\)", text):
            uses.setdefault(int(bar_id), set()).add(n)
    loops = chunk_loops(rep.source)
    ours = (BAR_CHAIN, BAR_KSIDE, BAR_ASIDE)
    homes = []
    for bar_id in ours:
        assert uses.get(bar_id), f"named barrier {bar_id} is not used"
        home = {i for i, (a, b) in enumerate(loops) for n in uses[bar_id] if a <= n <= b}
        assert len(home) == 1 and all(any(a <= n <= b for a, b in loops) for n in uses[bar_id]), (bar_id, home)
        homes.append(home.pop())
    assert len(set(homes)) == 3
    tilelang_ids = set(uses) - set(ours)
    assert tilelang_ids and tilelang_ids.isdisjoint(ours)
    assert rep.source.count("tma_load(") == 6  # the producer's tiles; the first chunk comes by element loads
    # each role's chunk loop issues the GEMMs and mbarrier operations its macros list (a macro dropped from a role's
    # GPU loop but kept in the CPU order would pass the float64 CPU check: session 29 nearly shipped one).
    # ws3: WG0 Q^T sdo x2, K^T (D dW); mbarrier arrives ds_ready, sdo_free, early_free, inputs_free; waits full,
    # full_b, dwd_ready. WG1 K Q^T; K dS', P^T dO; dW~; P^T dO; dO S^T, dQK K; (D dW) S^T, D_r Vn dS'^T, dQK^T Q;
    # dKKt K, dKKt^T K; arrives pt_ready, dvn_ready, dwd_ready, pt_read, early_free, k_done, inputs_free; waits full,
    # full_b, ds_ready, sdo_free, a_ready, dg_done, dq_ready. WG2 K S, Ag W, dO Vn^T, dVn W^T, A0^T dA0, T A0^T,
    # K K^T; arrives a_ready, dq_ready, early_free, inputs_free, dg_done; waits full, full_b, pt_ready, dvn_ready,
    # pt_read, ds_ready, k_done.
    expected = [(3, 4, 3), (12, 7, 7), (7, 5, 7)] if early_release else [(3, 2, 2), (11, 4, 4), (8, 3, 4)]
    per_role = []
    for a, b in loops:
        body = "\n".join(lines[a - 1 : b])
        per_role.append((len(re.findall(r"tl::wgmma_(?:ss|rs)<", body)), len(re.findall(r"\.arrive\(\)", body)),
                         len(re.findall(r"\.wait\(", body))))  # fmt: skip
    assert per_role == expected, per_role

