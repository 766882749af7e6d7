"""Python entry points: validate, plan, launch. The TileLang programs live in gdn/fwd/ (one per file).

Fixed-length batches (B > 1) are viewed as B*T packed tokens with cu_seqlens = [0, T, 2T, ...], so the
kernels only know the varlen layout. Kernels are JIT-compiled by TileLang once per (head config,
dtype, scale, flags) and cached on disk.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .checks import HEAD_DIM, check_fwd_args, check_kkt_args
from .cp_plan import CPPlan, plan_block_v, plan_cp
from .envvars import env_text
from .plan import (
    BLOCK_V_CHOICES,
    CHUNK,
    CP_COMBINE_BLOCK_V,
    CP_COMBINE_REV,
    CP_COMBINE_THREADS,
    WS7_BLOCK_V,
    ChunkPlan,
    choose_block_v,
    choose_block_v_ws,
    choose_fused,
    plan_fixed,
    plan_varlen,
)

_TL_DTYPE = {torch.bfloat16: "bfloat16", torch.float16: "float16"}

# kkt_solve implementations: name -> (kernel version, its program's extra positional arguments). "v4" is
# the default: it passed tests/gpu/test_qla_kkt_v3.py on the H200 at 0.82x v3h's time (0.584 against 0.711
# ms at 16/64 x 8192x4; NOTES.md, session 7); v3h was 0.8x v3's and 0.42x v2's (NOTES.md, v5).
KKT_IMPLS: dict[str, tuple[str, tuple]] = {
    "v2": ("v2", ()),
    "v2-scan": ("v2", (True,)),  # v2 with v3's parallel cumsum: for attributing v3's gain only
    "v3": ("v3", (True, 6)),  # 3xTF32 products, 6 CTAs/SM (80 registers)
    "v3-mb0": ("v3", (True, 0)),  # v3 without the register cap (93 registers, 5 CTAs/SM)
    "v3-tf32": ("v3", (False, 6)),  # one tf32 product per block product: timing reference only
    "v3h": ("v3", (True, 6, False, True)),  # v3 with the CTA's indices computed once (NOTES.md v5)
    # v3h with the lean scatter of L (the profile's 11 K of 27 K cycles), without and with the TMA K load
    "v3s": ("v3", (True, 6, False, True, False, True)),
    "v4": ("v3", (True, 6, False, True, False, True, True)),
    # v4 with one tf32 product per block product instead of three (FlashQLA's stage 1 takes one tf32 pass for
    # its 32 -> 64 step; FLA's solve_tril is ieee fp32 by default): v3-tf32 was 0.83x v3's time (session 2), its
    # A0 8-18 % further from float64 after the bf16 cast. Prepared in session 14 (no GPU): adopt it only if the
    # edge check keeps o and the final state within issue 4's 1.1x FLA's error.
    "v4t": ("v3", (False, 6, False, True, False, True, True)),
    # v4 with L's first 16 rows dropped (L00 parked inside): six CTAs per SM instead of five
    "v5": ("v3", (True, 6, False, True, False, True, True, True)),
    # v4 built with TileLang's aggressive shared-memory merge (34.5 KiB instead of 38.8; session 8). On the
    # H200 (session 9) its A0 equals v4's bit for bit at v4's speed (0.589 ms at 16/64 8192x4): shared memory
    # does not limit v4. (Session 8's two- and four-items-per-CTA builds, v6 and v6x4, hung on the H200: the
    # parser rolls the items into a loop whose TMA barrier waits on parity 0 every time; they are not offered.)
    "v4m": ("v3m", (True, 6, False, True, False, True, True, False)),
    # the off-diagonal inverse as four 64x64 products, N = X L_off, N^2, N Q, (Q - N Q) X, on bf16 wgmma
    # over hi/lo splits (gdn/fwd/kkt_solve_v7.py): no LDS-fed tf32 mma.sync, whose shared-memory traffic
    # bounds v4 (Nsight Compute, session 10). On the H200: v7 and v7a 12-14 % slower than v4, v7b 0.5-3 %
    # faster (0.570 against 0.579 ms at 16/64 8192x4), all as accurate as v2.
    "v7": ("v7", ()),
    "v7a": ("v7", (0, True)),  # v7 with one wait per product (its three split GEMMs issued back to back)
    "v7b": ("v7", (0, True, True)),  # v7a with X written by the diagonal solves into its operand
    # the whole inverse by forward substitution in fp32 registers, one thread per column, L read by broadcast
    # 16-byte loads (gdn/fwd/kkt_solve_v8.py): no split products. v8 (left-looking: each row one dependent
    # sum) passed on the H200 but ran 14 % slower than v4 (0.657 against 0.578 ms at 16/64 8192x4);
    # v8r is right-looking (each step's updates independent, one FMA of latency chain per step): 0.670 ms.
    "v8": ("v8", ()),
    "v8r": ("v8", (True,)),
    # two 32x32 diagonal solves (v8r's form) and X10 = X11 (-L10 X00) as fp32 FMAs over all four warps
    # (gdn/fwd/kkt_solve_v9.py): no warp with v8's 2000-FMA column, the heavy warps alternate per CTA.
    # On the H200: v9 0.647 ms, v9b 0.622-0.636 (whole forward sweep 0.988x v4's speed). Every standalone
    # form lands near v4: a CTA's serial load -> solve -> store life bounds them (NOTES.md, session 11).
    "v9": ("v9", ()),
    "v9b": ("v9", (True,)),  # v9 with a register-held g cumsum and X11 stored transposed (vector loads)
}
# the stage-1 implementations that can write emit_agb's output (the v3 family with the lean scatter of L)
AGB_KKT_IMPLS = ("v3s", "v4", "v4t", "v5")
# stage-1 kernels that write only emit_agb's output, no A0 (so only for a forward-only AGB fused kernel): "v10"
# (fwd/kkt_solve_v10.py, session 26; its program checked on the CPU, not yet run on a GPU): the gate and beta's rows
# inside L before the inverse, L in fp16, 8 x 8 diagonal blocks, doublings as whole-tile fp16 products on wgmma,
# 25 KiB and 60 registers
AGB_ONLY_KKT_IMPLS = ("v10",)
KKT_IMPL_ENV = "QLA_KKT_IMPL"
DEFAULT_KKT_IMPL = "v4"
# Stage 1 where it writes Agb for a forward-only AGB fused kernel (ws12, no A0 kept for a backward): v4t.
# Session 16 (H100, commit 0651449): the edge check with v4t kept o within 0.86-1.01x and the final state
# within 0.76-0.95x of FLA's error on all 16 cases (v4: the same to <1 %), and session 15 measured v4t's kkt
# at 0.383 against 0.563 ms (16/64 8192x4), the whole forward 1.05-1.16x faster. Where A0 is kept for a
# backward, v4's 3xTF32 stays (the gradients read A0 again).
DEFAULT_AGB_KKT_IMPL = "v4t"

# fused (stage 2) implementations: "v2" every warp does every step (fused_fwd.py); "ws" four warpgroups, state chain and
# output path concurrent (fused_fwd_ws.py, rev 4); "ws5" its rev 5 (codegen fixes found by the profile build; fastest on
# every config measured on the H200); "ws6" ws5 with beta applied to W before its rounding instead of to Ag (on the
# H200: ws5's speed, and an error at or below FLA's on every edge case, where ws5's one-token final state was 1.14-1.25x
# FLA's); "auto" (plan.choose_fused) runs ws12 (below; ws6 where A0 is needed) with the V-slice width for the
# config; "ws7" keeps the state transposed in one warpgroup's registers so the whole state chain runs there
# (fused_fwd_ws7.py, 64-wide V-slices only); "ws8" is ws7
# with the chain's first GEMMs asynchronous under its state publish and decay; "ws9" is ws8 with a leaner prep warpgroup
# (Kb's gate factor per row, no negation pass); "ws10" is rev 7 of the warp-specialised kernel: stage 1 hands it Gamma o
# A0 diag(beta) (kkt_solve_v3's emit_agb) instead of A0, so the state chain is one GEMM, Vnew = U - Wk S, with U and Wk
# formed ahead of the state (on the H200, session 12: 1.04-1.05x ws6's speed over qwen35-fwd, faster on 161-166 of 171
# configs; errors at FLA's level, not below: its one-token final state was 1.16x FLA's on one edge config, over issue
# 4's 1.1x bound, so auto kept ws6 until ws12). It has no A0 for a backward: the autograd forward (need_a0=True) runs
# ws6 in its place.
FUSED_IMPLS = ("v2", "ws", "ws5", "ws6", "ws7", "ws8", "ws9", "ws10", "ws11", "ws12", "vs1", "vs2", "vs2p", "vs3",
               "vs4", "auto")
# fused_fwd_ws.py's revisions behind the names; "ws11" (rev 8: ws10 with Agb's diagonal, a token's own beta, taken
# unrounded in both of WG1's products; H200, session 13: every edge config at or below 1.01x FLA's error, but 0.957x
# ws10's speed); "ws12" (rev 9: ws11 with WG1's two state-free GEMMs under one wait and the diagonal fix between them,
# O staged for its TMA store by stmatrix; H200, session 13: ws11's errors, 1.026x ws6's speed over qwen35-fwd before
# the stmatrix change, 0.98-1.01x ws10's per config after it; auto's kernel)
WS_REVS = {"ws": 4, "ws5": 5, "ws6": 6, "ws10": 7, "ws11": 8, "ws12": 9}
# "vs1" (fused_fwd_vs.py, session 14; H100, session 15: correct, its fused part at ws12's speed): the state split
# over two warpgroups along V as S^T, every chain GEMM with the state as wgmma's register operand, a third
# warpgroup forming Pg; the whole V per CTA (block_v 128 only), states [N,H_v,K,V] only; step 1 of NOTES.md's
# one-kernel design
VS_IMPLS = ("vs1", "vs2", "vs2p", "vs3", "vs4")
VS_BLOCK_V = 128
# "vs2" / "vs2p" (session 15; H100: correct, but 1.6x slower than kkt + ws12: its auxiliary warpgroup, at ~8 us a
# chunk, sets the step): vs1 with stage 1 inside (fwd/chunk_inverse.py in its auxiliary warpgroup): no kkt
# launch, the raw gate in, g_cumsum out; the inverse's products in one tf32 pass (kkt v4t's) or 3xTF32 (v4's).
# "vs3" (session 25; compiled here, not yet run): vs2 with the auxiliary warpgroup's first phases for latency (the
# gate's scan by warp shuffles under Q K^T's wgmma, gates and beta read once per row and column: fused_fwd_vs's
# fast_gates). name -> (precise, fast_gates). No CP state pass of their own: these run without CP.
# "vs4" (session 26; compiled here, not yet run): vs3 with kkt v10's inverse in its auxiliary warpgroup (the gate
# inside L', fp16 8 x 8 blocks and whole-tile doublings on wgmma: fused_fwd_vs's fp16_inverse). name -> (precise,
# fast_gates, fp16_inverse).
SOLVE_IN_KERNEL_IMPLS = {"vs2": (False, False, False), "vs2p": (True, False, False), "vs3": (False, True, False),
                         "vs4": (False, True, True)}
# fused implementations that take stage 1's emit_agb output instead of A0
AGB_IMPLS = ("ws10", "ws11", "ws12", "vs1", "vs2", "vs2p", "vs3", "vs4")
# the fused_fwd_ws revision whose CP state pass serves each AGB fused kernel (they take the same Agb)
AGB_STATE_PASS_REV = {"ws10": 7, "ws11": 8, "ws12": 9, "vs1": 9}
# what runs instead of an AGB_IMPLS kernel when the caller needs A0 (the autograd forward)
A0_FALLBACK_IMPL = "ws6"
TRANSPOSED_STATE_IMPLS = ("ws7", "ws8", "ws9")
FUSED_IMPL_ENV = "QLA_FUSED_IMPL"
DEFAULT_FUSED_IMPL = "auto"


def _resolve(arg: str | None, arg_name: str, env: str, default: str, choices) -> str:
    """The explicit argument, else $env (blank counts as unset), else the default; checked."""
    name = arg if arg is not None else env_text(env) or default
    if name not in choices:
        src = arg_name if arg is not None else f"${env}"
        raise ValueError(f"{src} must be one of {sorted(choices)}, got {name!r}")
    return name


def resolve_kkt_impl(impl: str | None = None, emit_agb: bool = False) -> str:
    """The kkt_solve implementation to launch: the argument, else $QLA_KKT_IMPL, else DEFAULT_KKT_IMPL
    (DEFAULT_AGB_KKT_IMPL when stage 1 writes Agb for a forward-only fused kernel)."""
    default = DEFAULT_AGB_KKT_IMPL if emit_agb else DEFAULT_KKT_IMPL
    return _resolve(impl, "kkt_impl", KKT_IMPL_ENV, default, (*KKT_IMPLS, *AGB_ONLY_KKT_IMPLS))


def resolve_fused_impl(impl: str | None = None) -> str:
    """The fused kernel to launch: the argument, else $QLA_FUSED_IMPL, else DEFAULT_FUSED_IMPL."""
    return _resolve(impl, "fused_impl", FUSED_IMPL_ENV, DEFAULT_FUSED_IMPL, FUSED_IMPLS)


def launcher(kernel):
    """What to call to launch a compiled TileLang kernel: its TVM-FFI executable when the kernel takes
    every output as an argument (ours all do), else the kernel itself.

    TileLang's per-call Python wrapper only counts the arguments and allocates outputs a kernel
    returns; skipping it saved ~5 us of the ~15 us a launch cost on the H200 host, where the forward
    of a small config is bound by its host time. The executable still checks every argument's shape,
    dtype and device.
    """
    adapter = getattr(kernel, "adapter", None)
    get_executable = getattr(adapter, "_get_executable", None)
    if (
        get_executable is None
        or getattr(adapter, "result_idx", None)
        or getattr(adapter, "_ffi_callee_allocated_output_abi", False)
    ):
        return kernel
    return get_executable()


@functools.cache
def _fused_kernel(impl: str, scale: float, dt: str, use_h0: bool, state_v_first: bool, block_v: int):
    """The launcher of a fused kernel, memoised (TileLang's own lookup cost ~2.5 us per call)."""
    if impl in VS_IMPLS:
        from .fwd.fused_fwd_vs import fused_fwd_vs_kernel

        if impl in SOLVE_IN_KERNEL_IMPLS:
            precise, fast_gates, fp16_inverse = SOLVE_IN_KERNEL_IMPLS[impl]
            extra = {"fp16_inverse": True} if fp16_inverse else {}  # (vs3's call, and its cache key, unchanged)
            return launcher(fused_fwd_vs_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_h0, True, precise,
                                                fast_gates=fast_gates, **extra))
        return launcher(fused_fwd_vs_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_h0))
    if impl in TRANSPOSED_STATE_IMPLS:
        from .fwd.fused_fwd_ws7 import fused_fwd_ws7_kernel

        rev = int(impl[2:])
        return launcher(fused_fwd_ws7_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_h0, state_v_first, rev >= 8, False,
                                             rev >= 9))
    if impl in WS_REVS:
        from .fwd.fused_fwd_ws import fused_fwd_ws_kernel

        return launcher(fused_fwd_ws_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_h0, state_v_first, block_v, False,
                                            WS_REVS[impl]))
    from .fwd.fused_fwd import fused_fwd_kernel

    return launcher(fused_fwd_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_h0, state_v_first, block_v))


# kkt_solve_v3_program's positional flags up to fold_l00; emit_agb follows them
_V3_FLAGS = 8


def agb_kkt_args(impl: str) -> tuple:
    """kkt_solve_v3_program's positional arguments after (dk, dtype) for impl with emit_agb on (v3 family with
    the lean scatter only: AGB_KKT_IMPLS); a ValueError naming the choices for any other impl."""
    version, extra = KKT_IMPLS[impl]
    if version != "v3" or len(extra) < 6 or not extra[5]:
        raise ValueError(f"kkt_impl must be one of {list(AGB_KKT_IMPLS)} with an emit_agb fused kernel "
                         f"({list(AGB_IMPLS)}), got {impl!r}")
    return tuple(extra) + (False,) * (_V3_FLAGS - len(extra)) + (True,)


@functools.cache
def _kkt_kernel(impl: str, dt: str, emit_agb: bool = False):
    """The launcher of a kkt_solve kernel, memoised. emit_agb (agb_kkt_args) writes Gamma o A0 diag(beta)
    instead of A0, for the AGB_IMPLS fused kernels; AGB_ONLY_KKT_IMPLS write nothing else."""
    if impl in AGB_ONLY_KKT_IMPLS:
        if not emit_agb:
            raise ValueError(f"kkt_impl {impl!r} writes only Agb, for the forward-only fused kernels "
                             f"({list(AGB_IMPLS)} with need_a0=False); this call needs A0: choose one of "
                             f"{sorted(KKT_IMPLS)}")  # fmt: skip
        from .fwd.kkt_solve_v10 import kkt_solve_v10_kernel

        return launcher(kkt_solve_v10_kernel(HEAD_DIM, dt))
    version, extra = KKT_IMPLS[impl]
    if emit_agb:
        args = agb_kkt_args(impl)
        from .fwd.kkt_solve_v3 import kkt_solve_v3_kernel

        return launcher(kkt_solve_v3_kernel(HEAD_DIM, dt, *args))
    if version == "v2":
        from .fwd.kkt_solve import kkt_solve_kernel

        return launcher(kkt_solve_kernel(HEAD_DIM, dt, *extra))
    if version == "v7":
        from .fwd.kkt_solve_v7 import kkt_solve_v7_kernel

        return launcher(kkt_solve_v7_kernel(HEAD_DIM, dt, *extra))
    if version == "v9":
        from .fwd.kkt_solve_v9 import kkt_solve_v9_kernel

        return launcher(kkt_solve_v9_kernel(HEAD_DIM, dt, *extra))
    if version == "v8":
        from .fwd.kkt_solve_v8 import kkt_solve_v8_kernel

        return launcher(kkt_solve_v8_kernel(HEAD_DIM, dt, *extra))
    from .fwd.kkt_solve_v3 import kkt_solve_v3_kernel, kkt_solve_v3_merged_kernel

    return launcher((kkt_solve_v3_merged_kernel if version == "v3m" else kkt_solve_v3_kernel)(HEAD_DIM, dt, *extra))


def _launch_kkt(impl: str, kf: torch.Tensor, gf: torch.Tensor, bf: torch.Tensor, plan: ChunkPlan,
                emit_agb: bool = False):
    """Stage 1 on packed [1, B*T, ...] tensors: (g_cumsum fp32 chunk-local, A0 in k's dtype), or with
    emit_agb (g_cumsum, Gamma o A0 diag(beta) in A0's place and layout)."""
    g_cumsum = torch.empty_like(gf)
    a0 = torch.empty(*gf.shape, CHUNK, dtype=kf.dtype, device=kf.device)
    _kkt_kernel(impl, _TL_DTYPE[kf.dtype], emit_agb)(kf, gf, bf, plan.cu_seqlens, plan.chunk_indices, g_cumsum, a0)
    return g_cumsum, a0


class FwdOutput(NamedTuple):
    """o [B,T,H_v,V] (v's dtype); final_state [N,H_v,K,V] fp32 or None; g_cumsum [B,T,H_v] fp32
    (chunk-local); a0 [B,T,H_v,64] (q's dtype), the gate-free WY inverse, or None when an AGB_IMPLS kernel
    ran (need_a0=False). The last two are what a backward needs."""

    o: torch.Tensor
    final_state: torch.Tensor | None
    g_cumsum: torch.Tensor
    a0: torch.Tensor | None


def pack_tokens(x: torch.Tensor) -> torch.Tensor:
    """[B, T, ...] -> contiguous [1, B*T, ...]: the packed varlen layout every kernel takes (a
    contiguous B = 1 tensor is that already, and is returned as it is)."""
    if x.shape[0] == 1 and x.is_contiguous():
        return x
    return x.reshape(1, x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()


def _plan(q: torch.Tensor, cu_seqlens: torch.Tensor | None) -> ChunkPlan:
    b, t = q.shape[:2]
    if cu_seqlens is not None:
        return plan_varlen(cu_seqlens, t)
    return plan_fixed(b, t, q.device)


def chunk_gated_delta_rule_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    output_final_state: bool = True,
    state_v_first: bool = False,
    kkt_impl: str | None = None,
    fused_impl: str | None = None,
    block_v: int | None = None,
    cp: bool | None = None,
    cp_piece: int | None = None,
    need_a0: bool = True,
) -> FwdOutput:
    """GDN chunked-prefill forward (FLA layout). Returns FwdOutput(o, final_state, g_cumsum, a0).

    need_a0=False (inference: nothing will run a backward) lets the fused kernel be an AGB_IMPLS one, which
    never forms A0 (FwdOutput.a0 is then None); with need_a0=True such an impl is replaced by
    A0_FALLBACK_IMPL.

    state_v_first=True reads and writes states as [N,H_v,V,K] instead of [N,H_v,K,V].
    kkt_impl picks the stage-1 kernel (KKT_IMPLS; default $QLA_KKT_IMPL or DEFAULT_KKT_IMPL), fused_impl the
    stage-2 kernel (FUSED_IMPLS; default $QLA_FUSED_IMPL or DEFAULT_FUSED_IMPL); block_v overrides the planned
    V-slice width (for measurements). cp=True (default: on unless $QLA_CP is "0"; session 8: faster on every
    qwen35-fwd config where the cost model splits, NOTES.md) runs long sequences piece-parallel (gdn/cp.py)
    where cp_plan.plan_cp predicts a gain, or always with pieces of cp_piece chunks when that is given;
    state_v_first runs without CP.
    """
    shape = check_fwd_args(q, k, v, g, beta, initial_state, cu_seqlens, state_v_first)
    impl = resolve_kkt_impl(kkt_impl)
    fimpl = resolve_fused_impl(fused_impl)
    if shape.batch * shape.seqlen * shape.h_v >= 2**31:
        # TileLang computes the TMA descriptors' batch stride (tokens x heads) in 32-bit arithmetic
        raise ValueError(f"B*T*H_v must be below 2**31 (TMA descriptor strides), got "
                         f"{shape.batch * shape.seqlen * shape.h_v}")
    if block_v is not None and block_v not in BLOCK_V_CHOICES:
        raise ValueError(f"block_v must be one of {BLOCK_V_CHOICES}, got {block_v!r}")
    if fimpl in TRANSPOSED_STATE_IMPLS and block_v not in (None, WS7_BLOCK_V):
        raise ValueError(f"block_v must be {WS7_BLOCK_V} (or None) with fused_impl={fimpl!r}, got {block_v!r}")
    if fimpl in VS_IMPLS and block_v not in (None, VS_BLOCK_V):
        raise ValueError(f"block_v must be {VS_BLOCK_V} (or None) with fused_impl={fimpl!r}, got {block_v!r}")
    if fimpl in VS_IMPLS and state_v_first:
        raise ValueError(f"state_v_first=True is not supported with fused_impl={fimpl!r} (states [N,H_v,K,V] only)")
    if q.device.type != "cuda":
        raise ValueError(f"qla_kernels runs on CUDA (sm_90a) only; q is on {q.device}")

    scale = HEAD_DIM**-0.5 if scale is None else float(scale)
    plan = _plan(q, cu_seqlens)
    b, t, h_v = shape.batch, shape.seqlen, shape.h_v
    dt = _TL_DTYPE[q.dtype]
    qf, kf, vf, gf, bf = (pack_tokens(x) for x in (q, k, v, g, beta))

    # the kernel that will run (auto's width is planned per launch; its kernel does not depend on the shape)
    fimpl_name = choose_fused(1, h_v, 132)[0] if fimpl == "auto" else fimpl
    if fimpl_name in AGB_IMPLS and need_a0:
        fimpl = fimpl_name = A0_FALLBACK_IMPL
    emit_agb = fimpl_name in AGB_IMPLS
    impl = resolve_kkt_impl(kkt_impl, emit_agb)
    use_h0 = initial_state is not None
    h0 = initial_state.contiguous() if use_h0 else _dummy_state(h_v, q.device)
    if fimpl_name in SOLVE_IN_KERNEL_IMPLS:  # one launch: stage 1 runs inside the fused kernel
        o, ht, g_cumsum = torch.empty_like(vf), torch.empty(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM,
                                                            dtype=torch.float32, device=q.device), torch.empty_like(gf)
        _fused_kernel(fimpl_name, scale, dt, use_h0, False, VS_BLOCK_V)(qf, kf, vf, gf, bf, h0, plan.cu_seqlens, o,
                                                                        ht, g_cumsum)
        if b != 1:
            o, g_cumsum = o.view(b, t, h_v, HEAD_DIM), g_cumsum.view(b, t, h_v)
        return FwdOutput(o=o, final_state=ht if output_final_state else None, g_cumsum=g_cumsum, a0=None)
    g_cumsum, a0 = _launch_kkt(impl, kf, gf, bf, plan, emit_agb)

    nsm = _num_sms(q.device)
    cpp = _cp_plan(plan, h_v, nsm, cp, cp_piece) if not state_v_first else None

    def run_fused(cu: torch.Tensor, n: int, h0_: torch.Tensor, use_h0_: bool, planned_bv: int,
                  order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """planned_bv: the cost model's width for these sequences or pieces (cp_plan.best_block_v); order: the
        order the warp-specialised kernels walk them in (longest first, as that model schedules them)."""
        o_ = torch.empty_like(vf)
        ht_ = torch.empty(n, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=q.device)
        f, bv = fimpl, block_v
        if f == "auto":
            f = choose_fused(n, h_v, nsm)[0]
        if f in TRANSPOSED_STATE_IMPLS:
            bv = WS7_BLOCK_V  # its chain's M: the only width it has
        if f in VS_IMPLS:
            bv = VS_BLOCK_V  # one CTA holds the whole V
        if bv is None:
            bv = choose_block_v(n, h_v, nsm) if f == "v2" else planned_bv  # every ws revision: one rule
        kernel = _fused_kernel(f, scale, dt, use_h0_, state_v_first, bv)
        if f in WS_REVS:
            kernel(qf, kf, vf, g_cumsum, bf, a0, h0_, cu, o_, ht_, _walk_order(order))
        else:
            kernel(qf, kf, vf, g_cumsum, bf, a0, h0_, cu, o_, ht_)
        return o_, ht_

    if cpp is None:
        o, ht = run_fused(plan.cu_seqlens, plan.num_seqs, h0, use_h0, plan_block_v(plan, h_v, nsm), plan.seq_order)
    else:
        from .cp import run_cp

        o, ht = run_cp(cpp, initial_state if use_h0 else None,
                       state_pass_launcher(qf, kf, vf, g_cumsum, bf, a0, cpp, scale, nsm,
                                           AGB_STATE_PASS_REV[fimpl_name] if emit_agb else 5),
                       lambda cu, init: run_fused(cu, cpp.num_pieces, init, True, cpp.decision.block_v,
                                                  cpp.piece_order),
                       _combine_kernel if resolve_cp_combine() == "kernel" else None)
    if emit_agb:
        a0 = None
    if b != 1:  # packed [1, B*T, ...] back to [B, T, ...] (B = 1 is that shape already)
        o, g_cumsum = o.view(b, t, h_v, HEAD_DIM), g_cumsum.view(b, t, h_v)
        a0 = a0.view(b, t, h_v, CHUNK) if a0 is not None else None
    return FwdOutput(o=o, final_state=ht if output_final_state else None, g_cumsum=g_cumsum, a0=a0)


def chunk_kkt_solve(
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    kkt_impl: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 alone (for tests and benchmarks): k [B,T,H_qk,128], g/beta [B,T,H_v] fp32 ->
    (g_cumsum [B,T,H_v] fp32 chunk-local, a0 [B,T,H_v,64] in k's dtype)."""
    shape = check_kkt_args(k, g, beta, cu_seqlens)
    impl = resolve_kkt_impl(kkt_impl)
    if k.device.type != "cuda":
        raise ValueError(f"qla_kernels runs on CUDA (sm_90a) only; k is on {k.device}")
    plan = _plan(k, cu_seqlens)
    b, t, h_v = shape.batch, shape.seqlen, shape.h_v
    g_cumsum, a0 = _launch_kkt(impl, *(pack_tokens(x) for x in (k, g, beta)), plan)
    return g_cumsum.view(b, t, h_v), a0.view(b, t, h_v, CHUNK)


CP_ENV = "QLA_CP"
# "0": the warp-specialised forward walks sequences (or CP pieces) in input order instead of longest first
LONGEST_FIRST_ENV = "QLA_LONGEST_FIRST"
# how CP's combine runs: "kernel" (default; fwd/cp_combine.py, one launch for the whole combine: on the
# H200, session 8, 0.087 ms for 2/8 x 32768 in 8 pieces against the host walk's 0.40, equal to it within
# tests/gpu/test_qla_cp.py's bounds) or "views" (cp.combine's host walk, one batched GEMM launch per link,
# ~40 us of host time a link)
CP_COMBINE_IMPLS = ("views", "kernel")
CP_COMBINE_ENV = "QLA_CP_COMBINE"
DEFAULT_CP_COMBINE = "kernel"
# the one-kernel combine's revision (fwd/cp_combine.py's docstring; default its REV), for A/B runs
CP_COMBINE_REVS = ("1", "2", "3")
CP_COMBINE_REV_ENV = "QLA_CP_COMBINE_REV"
# its V-slice per CTA (default fwd/cp_combine.py's BLOCK_V): 32 halves each CTA's products, not its M work
CP_COMBINE_BLOCK_VS = ("64", "32")
CP_COMBINE_BV_ENV = "QLA_CP_COMBINE_BV"
# its threads per CTA (default fwd/cp_combine.py's THREADS): 256 halves each thread's share of the M split
CP_COMBINE_THREAD_COUNTS = ("128", "256")
CP_COMBINE_THREADS_ENV = "QLA_CP_COMBINE_THREADS"
# the forward's CP pieces forced to this many chunks where a sequence is longer (unset: cp_plan's cost model
# decides), for A/B runs of the model's choice on configs it may misprice (a call's cp_piece wins over it)
CP_PIECE_ENV = "QLA_CP_PIECE"


@functools.cache
def _state_pass_kernel(scale: float, dt: str, block_v: int, rev: int):
    """The state pass's launcher, memoised like the fused kernels' (it ran TileLang's lookup and per-call wrapper,
    ~7 us of host time, on every CP call)."""
    from .fwd.fused_fwd_ws import fused_fwd_ws_kernel

    return launcher(fused_fwd_ws_kernel(HEAD_DIM, HEAD_DIM, scale, dt, False, False, block_v, False, rev, True))


def state_pass_launcher(qf, kf, vf, g_cumsum, bf, a0, cpp: CPPlan, scale: float, num_sms: int, rev: int = 5):
    """CP's state pass on packed inputs (the warp-specialised kernel's state_pass build): piece cu_seqlens ->
    [h | M] [P, H_v, K, 2V] fp32. Shared by the forward and the backward's stage 0 (bwd_api). rev: the
    fused_fwd_ws revision to build (5 takes A0; 7 and 8 take stage 1's emit_agb output as a0)."""
    h_v = vf.shape[2]
    kernel = _state_pass_kernel(scale, _TL_DTYPE[qf.dtype], choose_block_v_ws(2 * cpp.num_pieces, h_v, num_sms), rev)

    def state_pass(cu: torch.Tensor) -> torch.Tensor:
        hm = torch.empty(cpp.num_pieces, h_v, HEAD_DIM, 2 * HEAD_DIM, dtype=torch.float32, device=qf.device)
        kernel(qf, kf, vf, g_cumsum, bf, a0, cu, hm)
        return hm

    return state_pass


def resolve_cp_combine() -> str:
    """$QLA_CP_COMBINE, else DEFAULT_CP_COMBINE."""
    return _resolve(None, "", CP_COMBINE_ENV, DEFAULT_CP_COMBINE, CP_COMBINE_IMPLS)


def resolve_cp_combine_rev() -> int:
    """$QLA_CP_COMBINE_REV, else plan.CP_COMBINE_REV."""
    return int(_resolve(None, "", CP_COMBINE_REV_ENV, str(CP_COMBINE_REV), CP_COMBINE_REVS))


def resolve_cp_combine_block_v() -> int:
    """$QLA_CP_COMBINE_BV, else plan.CP_COMBINE_BLOCK_V."""
    return int(_resolve(None, "", CP_COMBINE_BV_ENV, str(CP_COMBINE_BLOCK_V), CP_COMBINE_BLOCK_VS))


def resolve_cp_combine_threads() -> int:
    """$QLA_CP_COMBINE_THREADS, else plan.CP_COMBINE_THREADS."""
    return int(_resolve(None, "", CP_COMBINE_THREADS_ENV, str(CP_COMBINE_THREADS), CP_COMBINE_THREAD_COUNTS))


@functools.cache
def _combine_launcher(use_h0: bool, rev: int, block_v: int, threads: int):
    """The one-kernel combine's launcher, memoised like the other kernels'."""
    from .fwd.cp_combine import cp_combine_kernel

    return launcher(cp_combine_kernel(HEAD_DIM, HEAD_DIM, block_v, use_h0, False, rev, threads))


def _combine_kernel(
    cpp: CPPlan,
    hm: torch.Tensor,
    h0: torch.Tensor | None,
    rev: int | None = None,
    block_v: int | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """cp.combine's result from one launch of fwd/cp_combine.py (rev, block_v, threads: None resolves
    $QLA_CP_COMBINE_REV, $QLA_CP_COMBINE_BV, $QLA_CP_COMBINE_THREADS)."""
    p, h_v, k, two_v = hm.shape
    init = torch.empty(p, h_v, k, two_v // 2, dtype=torch.float32, device=hm.device)
    h0_ = h0.float().contiguous() if h0 is not None else _dummy_state(h_v, hm.device)
    rev = resolve_cp_combine_rev() if rev is None else rev
    block_v = resolve_cp_combine_block_v() if block_v is None else block_v
    threads = resolve_cp_combine_threads() if threads is None else threads
    _combine_launcher(h0 is not None, rev, block_v, threads)(hm, h0_, cpp.seq_first_piece, init)
    return init


def resolve_cp() -> bool:
    """Context parallelism by default? Yes unless $QLA_CP is "0": with the one-kernel combine and the skip of
    decaying pieces' M, the 18 qwen35-fwd configs the cost model splits ran 1.13-2.01x faster than without CP
    and no other config changed (NOTES.md, session 8)."""
    return env_switch_on(CP_ENV)


def _walk_order(order: torch.Tensor) -> torch.Tensor:
    """The grid order the warp-specialised kernels walk sequences or pieces in: the plan's longest-first
    order, or the input order under $QLA_LONGEST_FIRST=0 (to time what the order gains; the cost model
    prices longest first, so widths and CP are planned for that)."""
    if env_switch_on(LONGEST_FIRST_ENV):
        return order
    return torch.arange(order.numel(), dtype=order.dtype, device=order.device)


def env_switch_on(env: str) -> bool:
    """An on-by-default switch: $env unset or "1" is on, "0" off, anything else a ValueError naming it."""
    value = env_text(env)
    if value not in ("", "0", "1"):
        raise ValueError(f"${env} must be '0' or '1' (or unset: on), got {value!r}")
    return value != "0"


def resolve_cp_piece() -> int | None:
    """$QLA_CP_PIECE as a number of chunks, or None when unset; anything but a positive integer is refused by name."""
    value = env_text(CP_PIECE_ENV)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"${CP_PIECE_ENV} must be a positive number of {CHUNK}-token chunks (or unset: the cost "
                         f"model decides), got {value!r}")  # fmt: skip
    return int(value)


def _cp_plan(plan: ChunkPlan, h_v: int, num_sms: int, cp: bool | None, cp_piece: int | None) -> CPPlan | None:
    """The context-parallel split to run, or None for the plain forward."""
    if cp is None:
        cp = resolve_cp()
    if not cp:
        return None
    if cp_piece is None:
        cp_piece = resolve_cp_piece()
    if cp_piece is not None and cp_piece < 1:
        raise ValueError(f"cp_piece must be a positive number of {CHUNK}-token chunks, got {cp_piece!r}")
    cpp = plan_cp(plan, h_v, num_sms, piece_chunks=cp_piece)  # cached: no host-to-device copy per call
    return cpp if cpp.enabled and cpp.num_pieces > cpp.num_seqs else None


_sms: dict[int | None, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.index not in _sms:
        _sms[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sms[device.index]


_dummies: dict[tuple, torch.Tensor] = {}


def _dummy_state(h_v: int, device: torch.device) -> torch.Tensor:
    """Placeholder for the unused h0 argument (the kernel never reads it when use_initial_state=False)."""
    key = (h_v, device)
    if key not in _dummies:
        _dummies[key] = torch.empty(1, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=device)
    return _dummies[key]


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    head_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FLA-compatible high-level forward -> (o, final_state), differentiable: when grad mode is on and an
    input requires grad, gradients flow to q, k, v, g, beta and initial_state (gdn/autograd.py; the
    backward is the chunk-form torch implementation until the TileLang backward lands).

    use_qk_l2norm_in_kernel normalises q and k with a separate torch op before the kernels.
    """
    if head_first:
        raise ValueError("head_first=True is not supported: pass q, k, v as [B,T,H,D] (head_first=False)")
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    leaves = (q, k, v, g, beta) + ((initial_state,) if initial_state is not None else ())
    if torch.is_grad_enabled() and any(x.requires_grad for x in leaves):
        from .autograd import ChunkGatedDeltaRule

        o, final_state = ChunkGatedDeltaRule.apply(q, k, v, g, beta, scale, initial_state, cu_seqlens)
        return o, final_state if output_final_state else None
    out = chunk_gated_delta_rule_fwd(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
        output_final_state=output_final_state, need_a0=False,
    )
    return out.o, out.final_state
