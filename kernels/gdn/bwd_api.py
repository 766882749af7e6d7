"""The TileLang backward (issue 6): its stages and the whole of it.

0. chunk_states: a forward kernel in state-store mode (the ws5 one by default) recomputes S_c, the state
   at every chunk start (in q's dtype, the operand its GEMMs used), from the forward's g_cumsum and A0.
1. chunk_bwd_dstate (gdn/bwd/dstate_chain.py; rev3 first runs gdn/bwd/dvl_wk.py): the reverse chain of
   state gradients dS' and dh0 (and dv in rev1/rev2).
2. chunk_bwd_grads (gdn/bwd/chunk_grads.py): every chunk's dq, dk, dbeta, dg (and dv after rev3) from
   (S_c, dS'_c).
chunk_gated_delta_rule_bwd runs them; gdn/bwd_chunked.py (torch) is its specification. gdn/autograd.py
uses this on CUDA ($QLA_BWD_IMPL=torch selects the specification instead).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import NamedTuple

import torch

from .api import (
    _TL_DTYPE,
    _combine_kernel,
    _dummy_state,
    _num_sms,
    _plan,
    _resolve,
    env_switch_on,
    launcher,
    pack_tokens,
    resolve_cp_combine,
    state_pass_launcher,
)
from .bwd_chunked import BwdOutput
from .bwd_cp_plan import bwd_piece_chunks, dstate_width, fused_piece_chunks
from .checks import HEAD_DIM, check_fwd_args
from .cp_plan import CPPlan, plan_cp
from .envvars import env_text
from .plan import BLOCK_V_CHOICES, CHUNK, ChunkPlan, choose_block_v, choose_block_v_ws

# Stage 1 revisions (bwd/dstate_chain.py): "rev1" masked element loads; "rev2" whole-tile loads in a
# software pipeline (the forward v2's recipe), 2.4-2.7x rev1's speed. Both checked on the H200 (session 5).
# "rev3": dvl = P^T dO and Wk = Ag D K for every chunk in parallel first (bwd/dvl_wk.py), then a chain of
# three GEMMs per step instead of six; dv then comes from stage 2. On the H200 (session 6) it passes and
# takes 1.56 ms at 2/8 1x32768 (rev2 2.83) and 2.08 at 16/32 1x32768 (rev2 2.66).
# "rev4": rev3 with Q^T (scale D dO) from the operand's rounded high and low parts (one more GEMM a step):
# rev3's single bf16 rounding of it sets dh0's error at 1.24-1.26x FLA's on qwen35-bwd (session 9; a float64
# emulation of the chain's roundings: 2.86e-3 -> 2.22e-3). On the H200 (session 10) it passes the backward
# and CP checks, and on qwen35-bwd dh0's error is 0.96-1.00x FLA's on all 32 configs (rev3 1.24-1.26x on 16)
# for ~2.5 % more backward time: the default since. $QLA_BWD_DSTATE overrides the default.
# "rev5" (session 19): rev4 with the two Q^T (scale D dO) products issued without a wait, off the step's
# dependent chain; the models price it as rev4. On the H100 (session 20) wrong at first (the warp-specialised
# pipeline released Q's and K's stages under in-flight products), then, with a Q copy, right on the plain cases
# but not on the CP ones (bwd/dstate_chain.py): not for use. Its chain was ~3 % faster than rev4's.
DSTATE_REVS = ("rev1", "rev2", "rev3", "rev4", "rev5")
PRECOMPUTED_DSTATE_REVS = ("rev3", "rev4", "rev5")  # the chain over bwd/dvl_wk.py's parts (dv from stage 2)
DSTATE_REV_ENV = "QLA_BWD_DSTATE"
DEFAULT_DSTATE_REV = "rev4"

# Stage 2 revisions (bwd/chunk_grads.py): "rev1" element loads with the row mask (the profile build put
# 41 % of a CTA in them), "rev2" whole-tile vectorised loads, rows past a sequence's end zeroed in shared
# memory (both checked on the H200; rev2 0.86-0.89x rev1's time), "rev3" rev2 with the CTA's indices
# hoisted into registers and a shorter dg tail, "rev4" rev3 with the tiles and S brought in by TMA (GPU
# only: TileLang's C backend has no TMA, so its CPU check is rev3's), "rev5" rev4 at 512 threads (one CTA
# per SM either way: twice the warps for its element-wise passes and reductions). On the H200 (session 6)
# all pass; at 16/32 1x32768 rev2 6.41 ms, rev3 3.58, rev4 3.16, rev5 3.20: rev4 was the default until rev6.
# $QLA_BWD_GRADS overrides the default.
GRADS_FLAGS = {  # revision: (threads, tile_loads, hoist_index, tma_loads, dw_beta_fp32, gamma_frag, ds_tma, scan_dg)
    # of bwd_chunk_grads_program
    "rev1": (256, False, False, False, False, False, False, False),
    "rev2": (256, True, False, False, False, False, False, False),
    "rev3": (256, True, True, False, False, False, False, False),
    "rev4": (256, True, True, True, False, False, False, False),
    "rev5": (512, True, True, True, False, False, False, False),
    "rev6": (256, True, True, True, True, False, False, False),  # rev4 with beta applied to dW in fp32 (dv's rounding)
    "rev7": (256, True, True, True, True, True, True, False),  # rev6, Gamma in a fragment, dS' by TMA (session 19)
    "rev8": (256, True, True, True, True, True, True, True),  # rev7 with the dg tail as two scans (session 19)
    "rev9": (256, True, True, True, True, True, True, True),  # rev8 storing the GVA group's dq, dk (CLUSTER_SUM_REVS)
    "rev10": (256, True, True, True, True, True, True, True),  # rev9 with one hand-off on the pair's path (PAIR_EARLY)
}
# Revisions whose stage 2 writes dq and dk already summed over the GVA group, in q's dtype, at these ratios
# h_v / h_qk (bwd_chunk_grads_program's cluster_sum: a 2-CTA cluster adds the pair's tiles through DSMEM);
# other ratios run the revision's flags per value head and the group sum after. On the H100 (session 20) both
# are bit for bit rev8 + the group-sum kernel and slower: the backward 0.983x (rev9) and 0.992x (rev10) rev8's
# over qwen35-bwd; the cluster launch alone costs nothing, the tile exchange ~4 us a CTA. Not the default.
CLUSTER_SUM_REVS = ("rev9", "rev10")
CLUSTER_SUM_RATIOS = (1, 2)
PAIR_EARLY_REVS = ("rev10",)  # bwd_chunk_grads_program's pair_early at ratio 2 (at ratio 1 rev10 is rev9)
# "rev11" (session 21, bwd/chunk_grads_ws.py): rev 8's math on two warpgroups that run at once, one without dS'
# (P, W, Vn, dP, dq) and one from dS' (dVn, dv, dAg, the A0 path, dk, dbeta, dg), handing over through mbarriers;
# its own program (not bwd_chunk_grads_program's flags), per value head like rev 8, always writing dv. On the
# H100 (session 21) dq, dk, dv equal rev 8's bit for bit and the float64 checks pass, but stage 2 takes 1.7x
# rev 8's time (no-instruction and long-scoreboard stalls: 155 KB of code, dS' read by the threads) and the
# backward 0.829x rev 8's over qwen35-bwd: not the default.
WS_GRADS_REVS = ("rev11",)
# "rev12" (session 22, bwd_chunk_grads_program's lean on rev 8's flags): three GEMMs of rev 8's 21 (10 of its 56
# units) dropped with rev 8's roundings, from the study of FlashQLA's fused backward (<dO, QS> and x from the dq
# and dk accumulators, dbeta's first part as rowsum(W o dW~): NOTES "I1", one GEMM on the symmetrised dKKt).
# "rev13" also takes dg by NOTES "I2" (a fourth GEMM and the pair terms' column sum dropped; its rounding differs:
# rounding_study_dg's form "i2x"). Both checked on the CPU (C backend, fp32, against float64) and built for
# sm_90a; not yet run on a GPU.
LEAN_GRADS_REVS = {  # revision: (the GRADS_FLAGS revision it builds on, bwd_chunk_grads_program's extra flags)
    "rev12": ("rev8", {"lean": True}),
    "rev13": ("rev8", {"lean": True, "dg_i2": True}),
}
GRADS_REVS = (*GRADS_FLAGS, *WS_GRADS_REVS, *LEAN_GRADS_REVS)
# How dq and dk per value head (fp32) become the GVA group's sums in q's dtype: "torch" (an fp32 add that
# rounds on store for r = 2, else a sum then a cast: two passes) or "kernel" (bwd/group_sum.py: both tensors,
# any r, one launch and one pass). $QLA_BWD_GROUP_SUM overrides the default.
# On the H100 (session 19) the kernel took 461 us at 16/32 x 32768 against the torch path's 637 (two adds),
# with dq and dk bit for bit equal at r = 2: the default.
GROUP_SUM_IMPLS = ("torch", "kernel")
GROUP_SUM_ENV = "QLA_BWD_GROUP_SUM"
DEFAULT_GROUP_SUM = "kernel"
GRADS_REV_ENV = "QLA_BWD_GRADS"
# "rev6" (session 7) is rev4 with beta applied to dW in fp32 after the product: on the H200 dv's error
# fell 10 % on every qwen35-bwd config (0.996-1.007x FLA's on the edge configs where rev4 was 1.11-1.16x)
# at 1.7 % more backward time (geomean of 32 configs): the default, for the numerics target, until rev7.
# "rev7" (session 19) is rev6 with Gamma evaluated once per CTA into a register fragment and dS' brought in by
# TMA (a merged shared-memory plan, dO copied once dS' is cast): on the H100 the CTA went from 49.4 K to 37.1 K
# cycles (16/32 x 8192) and stage 2 from 3.51 to 2.86 ms at 16/32 x 32768; with the group-sum kernel the
# whole backward 1.102x faster over qwen35-bwd's 32 configs (1.054-1.137x), every gradient's error equal to
# rev6's. "rev8" is rev7 with dg's tail as two shared-memory scans (the CTA 37.2 K -> 35.1 K cycles, stage 2
# 2.86 -> 2.70 ms at 16/32 x 32768): 1.016x rev7 over the 32 configs, 1.004-1.03x on 30 of them, errors equal
# (H100, session 19, call 5): the default.
DEFAULT_GRADS_REV = "rev8"


# Stage 0 (chunk_states): "v2" the v2 fused forward storing each state by element stores at V-slice 32
# (checked on the H200, 2.2 ms at 16/32 1x32768), "ws5" the warp-specialised rev 5 forward whose state
# warpgroup TMA-stores the bf16 state it publishes anyway, at the forward's V-slice: on the H200 (session 6)
# its states equal v2's bit for bit and it takes 0.86 ms there (0.25-0.43 ms on many sequences), so it is
# the default until session 25. "ws12" (session 24) is the forward's ws12 walk (fused_fwd_ws rev 9) storing its
# states: it forms each chunk's new values as U - Wk bf(S) from Agb (bwd/agb.py forms Agb from the stored A0) instead
# of bf(Ag) bf(W); rounding_study_dg_fla emulates its states at ~25 % less error than ws5's. Measured (H100, session
# 25, qwen35-bwd 2/4 and 4/8, the 16 configs holding all four of ws5's dg errors over issue 6's 1.1x FLA): dg at
# 0.59-1.004x FLA's (ws5: 0.75-1.30x), the other gradients unchanged (<= 1.05x), float64 checks plain and CP passed,
# states equal to v2's within the test's bound; 1.01-1.03x slower on 14 of the 16 (the Agb pass). The default.
# $QLA_BWD_STATES overrides it.
STATES_IMPLS = ("v2", "ws5", "ws12")
STATES_IMPL_ENV = "QLA_BWD_STATES"
DEFAULT_STATES_IMPL = "ws12"


# Context parallelism for stages 0 and 1 (gdn/cp_bwd.py), decided by bwd_cp_plan's model ($QLA_BWD_CP=0: off).
BWD_CP_ENV = "QLA_BWD_CP"

# Stage 0 beside stage 1 (session 22): the state store reads nothing stage 1 writes and stage 1 reads no state,
# and on few sequences or heads each leaves most SMs idle (H200, 16/32 x 32768: stage 0 128 CTAs for 0.86 ms,
# stage 1's chain 128 for 1.67 ms; 4/8 x 32768 in two sequences: 64 and 64). "1" runs stage 0 on a side stream
# forked from the caller's stream and joined before stage 2; "0" runs the stages in turn. Off by default
# (DEFAULT_BWD_OVERLAP) until it has run on a GPU: tests/gpu/test_qla_bwd_cp.py's
# test_stage0_beside_stage1_equals_in_turn (bit equality, eager and from a captured graph) and a qwen35-bwd A/B
# (NOTES.md, session 22) decide the default. Its cost: stage 0's scratch (o, ht) lives in the side stream's cache.
BWD_OVERLAP_ENV = "QLA_BWD_OVERLAP"
DEFAULT_BWD_OVERLAP = False

# The fused backward (session 23, bwd/chunk_grads.py's `fused` on rev 12's math): stage 1's chain and stage 2's
# gradients in one walk per (sequence or CP piece, value head), dS' carried on chip and in an L2-resident fp32 slot
# per CTA instead of 4 bytes a value per chunk through HBM; no dvl_wk and no chain kernel without CP (with CP they
# are pass A, and the walk replaces pass B). "1" runs it, "0" the three stages. Off by default
# (DEFAULT_BWD_FUSED) until measured on a GPU against the stages (NOTES.md, session 23). Pieces by
# bwd_cp_plan.choose_fused_cp. "2" is the walk with the next chunk's K, S, Q and dO loaded during the step's dg
# tail (bwd_chunk_grads_program's prefetch), for an A/B against "1". "ws" (session 28, bwd/fused_ws.py) is the same
# walk and math warp-specialised: the chain, the K side, the A side and a TMA producer in one CTA, concurrently
# (session 28, H100: 1.37-1.45x the stages without CP); "ws2" is "ws" with dq formed by the A side beside the K
# side's dk (slower); "ws3" (session 29) is "ws" on the early-release schedule (fused_ws.py's early_release).
BWD_FUSED_ENV = "QLA_BWD_FUSED"
BWD_FUSED_CHOICES = ("0", "1", "2", "ws", "ws2", "ws3")
DEFAULT_BWD_FUSED = "0"
_side_streams: dict[int, torch.cuda.Stream] = {}


def choose_block_v_dstate(plan: ChunkPlan, h_v: int, num_sms: int) -> int:
    """V-slice of stage 1 rev3: the width with the shorter estimated chain time. One CTA per (sequence, head,
    slice) fits on an SM; the kernel takes the longest sequence's chain, or as many rounds of CTAs as the
    SMs need times the mean chain, whichever is longer. It reproduces the five measured configs to 3 %; the
    pair-count rule of rev1/rev2 picked 64 for one 31905-token sequence next to a short one (2.53 ms
    estimated against 1.48 at 32)."""
    return dstate_width(plan.num_seqs, plan.max_chunks, plan.num_chunks, h_v, num_sms, _step_rev())


def _step_rev() -> str:
    """The stage 1 revision whose measured chain step the width and CP models use (rev3's for rev1/rev2,
    rev4's for rev5 until it is timed)."""
    rev = resolve_dstate_rev()
    if rev == "rev5":
        return "rev4"
    return rev if rev in PRECOMPUTED_DSTATE_REVS else "rev3"


def _chain_flags(rev: str) -> tuple[bool, bool]:
    """(dod_split, async_dod) of bwd_dstate_program for a precomputed-chain revision."""
    return rev in ("rev4", "rev5"), rev == "rev5"


def resolve_states_impl() -> str:
    return _resolve(None, "", STATES_IMPL_ENV, DEFAULT_STATES_IMPL, STATES_IMPLS)


def resolve_dstate_rev() -> str:
    return _resolve(None, "", DSTATE_REV_ENV, DEFAULT_DSTATE_REV, DSTATE_REVS)


def resolve_grads_rev() -> str:
    return _resolve(None, "", GRADS_REV_ENV, DEFAULT_GRADS_REV, GRADS_REVS)


def resolve_group_sum() -> str:
    return _resolve(None, "", GROUP_SUM_ENV, DEFAULT_GROUP_SUM, GROUP_SUM_IMPLS)


class DStateOutput(NamedTuple):
    """ds_next [num_chunks,H_v,K,V] fp32: the gradient of the state after each chunk, chunks of all
    sequences in order; dv [B,T,H_v,V] fp32 (None from rev3, whose chain no longer forms it: stage 2
    writes it); dh0 [N,H_v,K,V] fp32."""

    ds_next: torch.Tensor
    dv: torch.Tensor | None
    dh0: torch.Tensor


def chunk_bwd_dstate(
    q: torch.Tensor,
    k: torch.Tensor,
    g_cumsum: torch.Tensor,
    beta: torch.Tensor,
    A: torch.Tensor,
    do: torch.Tensor,
    dht: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    block_v: int | None = None,
) -> DStateOutput:
    """Stage 1 of the backward on the GPU. g_cumsum [B,T,H_v] (chunk-local) and A [B,T,H_v,64] (the
    gate-free A0) are the forward's outputs; do is like v; dht [N,H_v,K,V] fp32 optional."""
    shape = check_fwd_args(q, k, do, g_cumsum, beta, None, cu_seqlens)
    _check_a0(A, q, shape.h_v)
    if block_v is not None and block_v not in BLOCK_V_CHOICES:
        raise ValueError(f"block_v must be one of {BLOCK_V_CHOICES}, got {block_v!r}")
    if q.device.type != "cuda":
        raise ValueError(f"qla_kernels runs on CUDA (sm_90a) only; q is on {q.device}")
    plan = _plan(q, cu_seqlens)
    _check_state("dht", dht, plan.num_seqs, shape.h_v)
    scale = HEAD_DIM**-0.5 if scale is None else float(scale)
    qf, kf, af, dof = (pack_tokens(x) for x in (q, k, A, do))
    gf, bf = (pack_tokens(x).float() for x in (g_cumsum, beta))
    out = _dstate_packed(qf, kf, gf, bf, af, dof, dht, plan, scale, block_v)
    return out if out.dv is None else out._replace(dv=out.dv.view(*do.shape))


def _check_a0(A: torch.Tensor, q: torch.Tensor, h_v: int) -> None:
    b, t = q.shape[:2]
    if A.shape != (b, t, h_v, CHUNK) or A.dtype != q.dtype:
        raise ValueError(f"A must be [B,T,H_v,{CHUNK}] in q's dtype (the forward's a0), got {tuple(A.shape)} {A.dtype}")


def _check_state(name: str, st: torch.Tensor | None, n: int, h_v: int) -> None:
    if st is not None and (st.shape != (n, h_v, HEAD_DIM, HEAD_DIM) or st.dtype != torch.float32):
        raise ValueError(f"{name} must be [N={n},H_v,K,V] float32, got {tuple(st.shape)} {st.dtype}")


def _dstate_packed(qf, kf, gf, bf, af, dof, dht, plan: ChunkPlan, scale: float, block_v: int | None):
    """Stage 1 on packed [1,T,...] inputs; dv comes back packed [1,T,H_v,V] (None from rev3)."""
    from .bwd.dstate_chain import bwd_dstate_kernel

    n, h_v = plan.num_seqs, dof.shape[2]
    rev = resolve_dstate_rev()
    if block_v is not None:
        bv = block_v
    elif rev in PRECOMPUTED_DSTATE_REVS:
        bv = choose_block_v_dstate(plan, h_v, _num_sms(qf.device))
    else:
        bv = choose_block_v(n, h_v)
    ds_next = torch.empty(plan.num_chunks, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)
    dh0 = torch.empty(n, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)
    use_dht = dht is not None
    dht_ = dht.contiguous() if use_dht else _dummy_state(h_v, qf.device)
    dt = _TL_DTYPE[qf.dtype]
    if bv > 64:  # rev2 spills at 128 (408 B) and rev3 needs 257 KiB of shared memory there: rev1
        rev = "rev1"
    if rev in PRECOMPUTED_DSTATE_REVS:
        dvl, wk = _dvl_wk(qf, kf, gf, bf, af, dof, plan, scale)
        chain = bwd_dstate_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_dht, bv, 256, False, True, 2, True,
                                  *_chain_flags(rev))
        chain(qf, kf, gf, dof, dvl, wk, dht_, plan.cu_seqlens, plan.chunk_offsets, ds_next, dh0)
        return DStateOutput(ds_next=ds_next, dv=None, dh0=dh0)
    dv = torch.empty(*dof.shape, dtype=torch.float32, device=qf.device)
    pipelined = rev == "rev2"
    kernel = bwd_dstate_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_dht, bv, 256, False, pipelined)
    kernel(qf, kf, gf, bf, af, dof, dht_, plan.cu_seqlens, plan.chunk_offsets, dv, ds_next, dh0)
    return DStateOutput(ds_next=ds_next, dv=dv, dh0=dh0)


def _check_stage_inputs(q, k, v, g_cumsum, beta, A, do, cu_seqlens):
    shape = check_fwd_args(q, k, v, g_cumsum, beta, None, cu_seqlens)
    if do.shape != v.shape or do.dtype != v.dtype:
        raise ValueError(f"do must be like v {tuple(v.shape)} {v.dtype}, got {tuple(do.shape)} {do.dtype}")
    _check_a0(A, q, shape.h_v)
    if q.device.type != "cuda":
        raise ValueError(f"qla_kernels runs on CUDA (sm_90a) only; q is on {q.device}")
    return shape


def resolve_bwd_cp() -> bool:
    """Context parallelism for the backward's chains? Yes unless $QLA_BWD_CP is "0" (and only with the
    stage 0 and stage 1 kernels the CP path runs: ws5 or ws12, and rev3 or rev4)."""
    return env_switch_on(BWD_CP_ENV)


def resolve_bwd_overlap() -> bool:
    """Stage 0 on a side stream, beside stage 1? $QLA_BWD_OVERLAP "1" yes, "0" no, unset DEFAULT_BWD_OVERLAP;
    anything else a ValueError naming the choices."""
    value = env_text(BWD_OVERLAP_ENV)
    if value not in ("", "0", "1"):
        raise ValueError(f"${BWD_OVERLAP_ENV} must be '0' or '1' (or unset: {int(DEFAULT_BWD_OVERLAP)}), got {value!r}")
    return DEFAULT_BWD_OVERLAP if value == "" else value == "1"


def resolve_bwd_fused_mode() -> str:
    """$QLA_BWD_FUSED: "0" the staged backward, "1" the fused walk, "2" the fused walk with its loads prefetched,
    "ws" / "ws2" the warp-specialised walk (dq by the K side / the A side), "ws3" the same on the early-release
    schedule; unset DEFAULT_BWD_FUSED; anything else a ValueError naming the choices."""
    value = env_text(BWD_FUSED_ENV) or DEFAULT_BWD_FUSED
    if value not in BWD_FUSED_CHOICES:
        raise ValueError(f"${BWD_FUSED_ENV} must be one of {list(BWD_FUSED_CHOICES)} (or unset: "
                         f"{DEFAULT_BWD_FUSED!r}), got {value!r}")  # fmt: skip
    return value


def _stage0_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The side stream stage 0 runs on (one per device, made once), or None where the overlap is off. torch
    hands it out of its pool of streams: should it be the caller's own stream, the stages run in turn, still
    correct."""
    if not resolve_bwd_overlap():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _side_streams:
        _side_streams[index] = torch.cuda.Stream(device=index)
    return _side_streams[index]


def _fork(side: torch.cuda.Stream | None) -> None:
    """`side` waits for all the caller's stream has queued so far (no-op for None). Taken before stage 1 is
    queued and stage 0 launched on `side` after it: stage 1's first kernel (dvl_wk, every chunk at once) then
    gets the SMs first and stage 0's CTAs take those it leaves, beside the chain. Under CUDA graph capture the
    fork and the join become graph edges."""
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(side.device))


@contextlib.contextmanager
def _on(side: torch.cuda.Stream | None) -> Iterator[None]:
    """Launch the block's kernels on `side` (None: on the caller's stream). Every tensor they touch must stay
    referenced until the join (then the caller's stream orders any reuse of its memory after side's work); what
    the caller reads afterwards (states) is allocated on the caller's stream beforehand, so only the block's own
    scratch lives in the side stream's cache."""
    if side is None:
        yield
        return
    with torch.cuda.stream(side):
        yield


def _join(side: torch.cuda.Stream | None) -> None:
    """The caller's stream waits for all `side` has queued (no-op for None)."""
    if side is not None:
        torch.cuda.current_stream(side.device).wait_stream(side)


def _bwd_cp_plan(
    plan: ChunkPlan, h_v: int, device: torch.device, cp: bool | None, cp_piece: int | None, fused: bool = False
) -> CPPlan | None:
    """The backward's context-parallel split (bwd_cp_plan's choice: choose_bwd_cp for the staged backward,
    choose_fused_cp for the fused one; or cp_piece), or None: no split."""
    if cp_piece is not None and cp_piece < 1:
        raise ValueError(f"cp_piece must be a positive number of {CHUNK}-token chunks, got {cp_piece!r}")
    if not (resolve_bwd_cp() if cp is None else cp):
        return None
    if not fused and (resolve_states_impl() == "v2" or resolve_dstate_rev() not in PRECOMPUTED_DSTATE_REVS):
        return None  # the CP paths store states with a ws walk; the fused one runs its pass A on a precomputed chain
    nsm = _num_sms(device)
    choose = fused_piece_chunks if fused else bwd_piece_chunks
    piece = cp_piece if cp_piece is not None else choose(plan, h_v, nsm, _step_rev())  # cached per plan
    if piece is None:
        return None
    cpp = plan_cp(plan, h_v, nsm, piece_chunks=piece)  # cached per plan
    return cpp if cpp.enabled and cpp.num_pieces > cpp.num_seqs else None


def _dvl_wk(qf, kf, gf, bf, af, dof, plan: ChunkPlan, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 rev3's parallel part: dvl = P^T dO [1,T,H_v,V] fp32 and Wk = Ag D K [1,T,H_v,K], every chunk."""
    from .bwd.dvl_wk import bwd_dvl_wk_kernel

    h_v = dof.shape[2]
    dvl = torch.empty(*dof.shape, dtype=torch.float32, device=qf.device)
    wk = torch.empty(1, kf.shape[1], h_v, HEAD_DIM, dtype=kf.dtype, device=qf.device)
    bwd_dvl_wk_kernel(HEAD_DIM, HEAD_DIM, scale, _TL_DTYPE[qf.dtype])(
        qf, kf, gf, bf, af, dof, plan.cu_seqlens, plan.chunk_indices, dvl, wk
    )
    return dvl, wk


def _states_and_dstate_cp(qf, kf, vf, gf, bf, af, dof, h0, dht, plan: ChunkPlan, cpp: CPPlan, scale: float,
                          side: torch.cuda.Stream | None = None):
    """Stages 0 and 1 over CP's pieces (gdn/cp_bwd.py): (states, DStateOutput), as the plain stages give. With a
    side stream, stage 0's walk over the pieces (after the state pass and combine) runs on it, beside stage 1,
    joined before this returns."""
    from .bwd.dstate_chain import bwd_dstate_kernel
    from .cp_bwd import dstate_cp, states_cp

    h_v, nsm, dt = vf.shape[2], _num_sms(qf.device), _TL_DTYPE[qf.dtype]
    flags = _chain_flags(resolve_dstate_rev())
    combine_fn = _combine_kernel if resolve_cp_combine() == "kernel" else None
    states = torch.empty(plan.num_chunks, h_v, HEAD_DIM, HEAD_DIM, dtype=qf.dtype, device=qf.device)

    walks: list[tuple[torch.Tensor, torch.Tensor]] = []
    a_st, rev = _stage0_operand(af, gf, bf, plan)  # the state pass's and the walk's

    def walk(cu: torch.Tensor, init: torch.Tensor) -> None:
        if side is None:
            _store_states(qf, kf, vf, gf, bf, a_st, init, cu, cpp.chunk_offsets, cpp.num_pieces, scale, states, rev=rev)
        else:  # launched on the side stream once stage 1 is queued
            walks.append((cu, init))

    hm = states_cp(cpp, h0, state_pass_launcher(qf, kf, vf, gf, bf, a_st, cpp, scale, nsm, rev), walk, combine_fn)

    dvl, wk = _dvl_wk(qf, kf, gf, bf, af, dof, plan, scale)
    bv = dstate_width(cpp.num_pieces, cpp.max_piece_chunks, plan.num_chunks, h_v, nsm, _step_rev())
    ds_next = torch.empty(plan.num_chunks, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)

    def chain(ends: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.empty(cpp.num_pieces, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)
        use_ends = ends is not None
        kernel = bwd_dstate_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_ends, bv, 256, False, True, 2, True, *flags)
        ends_ = ends if use_ends else _dummy_state(h_v, qf.device)
        kernel(qf, kf, gf, dof, dvl, wk, ends_, cpp.cu_seqlens, cpp.chunk_offsets, ds_next, starts)
        return ds_next, starts

    _fork(side)  # after the combine (the walk's init) and dvl_wk (every chunk at once: it has the SMs first)
    try:
        ds, dh0 = dstate_cp(cpp, hm, dht.contiguous() if dht is not None else None, chain, combine_fn)
        for cu, init in walks:  # init (the combine's) stays referenced in walks until the join
            with _on(side):
                _store_states(qf, kf, vf, gf, bf, a_st, init, cu, cpp.chunk_offsets, cpp.num_pieces, scale, states,
                              rev=rev)  # fmt: skip
    finally:  # joined even on an error: an unjoined side stream would end a graph capture with its own error
        _join(side)
    return states, DStateOutput(ds_next=ds, dv=None, dh0=dh0)


def _stage0_operand(af, gf, bf, plan: ChunkPlan) -> tuple[torch.Tensor, int]:
    """What stage 0's ws walk multiplies by, and its fused_fwd_ws revision: the stored A0 for ws5 (rev 5), or
    Agb = Gamma o A0 diag(beta) formed from it (bwd/agb.py, one launch) for ws12 (rev 9)."""
    if resolve_states_impl() != "ws12":
        return af, 5
    agb = torch.empty_like(af)
    _agb_launcher(_TL_DTYPE[af.dtype])(af, gf, bf, plan.cu_seqlens, plan.chunk_indices, agb)
    return agb, 9


@functools.cache
def _agb_launcher(dt: str):
    """bwd/agb.py's kernel for the dtype, looked up once (TileLang's own lookup costs microseconds a call)."""
    from .bwd.agb import agb_from_a0_kernel

    return launcher(agb_from_a0_kernel(dt))


def _store_states(qf, kf, vf, gf, bf, af, h0, cu, chunk_offsets, n: int, scale: float, states: torch.Tensor,
                  rev: int = 5) -> None:  # fmt: skip
    """The ws forward in state-store mode over n sequences (or pieces) from h0 (None: zero): writes states. rev 5
    (ws5) takes A0 as af, rev 9 (ws12) Agb (_stage0_operand)."""
    from .fwd.fused_fwd_ws import fused_fwd_ws_kernel

    h_v = vf.shape[2]
    use_h0 = h0 is not None
    o = torch.empty_like(vf)
    ht = torch.empty(n, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)
    h0_ = h0.contiguous() if use_h0 else _dummy_state(h_v, qf.device)
    bv = choose_block_v_ws(n, h_v, _num_sms(qf.device))  # the forward's slice width
    dt = _TL_DTYPE[qf.dtype]
    kernel = launcher(fused_fwd_ws_kernel(HEAD_DIM, HEAD_DIM, scale, dt, use_h0, False, bv, False, rev, False, True))
    kernel(qf, kf, vf, gf, bf, af, h0_, cu, o, ht, chunk_offsets, states)


def chunk_states(qf, kf, vf, gf, bf, af, h0, plan: ChunkPlan, scale: float,
                 states: torch.Tensor | None = None) -> torch.Tensor:
    """States at every chunk start [num_chunks,H_v,K,V] in q's dtype, from packed [1,T,...] inputs (stage 0),
    into `states` when given (allocated by the caller, e.g. on its own stream before a fork)."""
    h_v = vf.shape[2]
    if states is None:
        states = torch.empty(plan.num_chunks, h_v, HEAD_DIM, HEAD_DIM, dtype=qf.dtype, device=qf.device)
    if resolve_states_impl() != "v2":
        a_st, rev = _stage0_operand(af, gf, bf, plan)
        _store_states(qf, kf, vf, gf, bf, a_st, h0, plan.cu_seqlens, plan.chunk_offsets, plan.num_seqs, scale, states,
                      rev=rev)  # fmt: skip
        return states
    from .fwd.fused_fwd import fused_fwd_kernel

    use_h0 = h0 is not None
    o = torch.empty_like(vf)
    ht = torch.empty(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)
    h0_ = h0.contiguous() if use_h0 else _dummy_state(h_v, qf.device)
    # V-slice 32: at 64 the store's addressing pushes the v2 kernel past 128 registers (12-20 B spilled)
    kernel = fused_fwd_kernel(HEAD_DIM, HEAD_DIM, scale, _TL_DTYPE[qf.dtype], use_h0, False, 32, store_states=True)
    kernel(qf, kf, vf, gf, bf, af, h0_, plan.cu_seqlens, o, ht, plan.chunk_offsets, states)
    return states


def fused_walk_program_args(scale: float, dtype: str, prefetch: bool = False) -> tuple[tuple, dict]:
    """bwd_chunk_grads_program's arguments for the fused walk (rev 12's math on rev 8's flags, dS' not by TMA), in
    one place for the launcher here and for sass_stats' build of the same program."""
    threads, tile, hoist, tma, dw_beta, gamma_frag, _ds_tma, scan = GRADS_FLAGS["rev8"]
    args = (HEAD_DIM, HEAD_DIM, scale, dtype, threads, False, False, tile, hoist, tma, dw_beta, gamma_frag, False, scan,
            True)  # fmt: skip
    return args, {"lean": True, "fused": True, "prefetch": prefetch}


def _fused_walk(qf, kf, vf, gf, bf, af, dof, states, slots, cu, chunk_offsets, scale: float, prefetch: bool,
                ws: str = ""):  # fmt: skip
    """The fused walk over the sequences or pieces `cu` (chunk_offsets: their first chunks' indices in states):
    slots [P,H_v,K,V] fp32 holds each piece's end gradient and leaves with its start gradient. Returns dq, dk per
    value head [1,T,H_v,K] fp32, dbeta, dg [1,T,H_v] fp32 and dv [1,T,H_v,V] in the input dtype. ws "ws", "ws2" or
    "ws3": the warp-specialised program (bwd/fused_ws.py; "ws2" its dq_aside build, "ws3" its early_release one),
    same signature."""
    from .bwd.chunk_grads import bwd_chunk_grads_kernel
    from .bwd.fused_ws import bwd_fused_ws_kernel

    nt, h_v = vf.shape[1], vf.shape[2]
    dq = torch.empty(1, nt, h_v, HEAD_DIM, dtype=torch.float32, device=qf.device)
    dk = torch.empty_like(dq)
    dbeta = torch.empty(1, nt, h_v, dtype=torch.float32, device=qf.device)
    dg = torch.empty_like(dbeta)
    dv = torch.empty_like(vf)
    if ws == "ws3":
        kernel = bwd_fused_ws_kernel(HEAD_DIM, HEAD_DIM, scale, _TL_DTYPE[qf.dtype], early_release=True)
    elif ws:
        kernel = bwd_fused_ws_kernel(HEAD_DIM, HEAD_DIM, scale, _TL_DTYPE[qf.dtype], dq_aside=ws == "ws2")
    else:
        args, kwargs = fused_walk_program_args(scale, _TL_DTYPE[qf.dtype], prefetch)
        kernel = bwd_chunk_grads_kernel(*args, **kwargs)
    kernel(qf, kf, vf, gf, bf, af, dof, states, slots, cu, chunk_offsets, dq, dk, dbeta, dg, dv)
    return dq, dk, dbeta, dg, dv


def _bwd_fused(qf, kf, vf, gf, bf, af, dof, h0, dht, plan: ChunkPlan, scale: float, cp: bool | None,
               cp_piece: int | None, prefetch: bool, ws: str = ""):  # fmt: skip
    """The fused backward on packed inputs: (dq, dk per value head, dbeta, dg, dv, dh0); prefetch is
    $QLA_BWD_FUSED=2's walk, ws $QLA_BWD_FUSED=ws's."""
    h_v = vf.shape[2]
    cpp = _bwd_cp_plan(plan, h_v, qf.device, cp, cp_piece, fused=True)
    if cpp is None:
        states = chunk_states(qf, kf, vf, gf, bf, af, h0, plan, scale)
        if dht is not None:
            slots = dht.to(torch.float32, copy=True).contiguous()
        else:
            slots = torch.zeros(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)
        *grads, dv = _fused_walk(qf, kf, vf, gf, bf, af, dof, states, slots, plan.cu_seqlens, plan.chunk_offsets,
                                 scale, prefetch, ws)  # fmt: skip
        return (*grads, dv, slots)
    from .bwd.dstate_chain import bwd_dstate_kernel
    from .cp_bwd import dstate_cp, states_cp

    nsm, dt = _num_sms(qf.device), _TL_DTYPE[qf.dtype]
    combine_fn = _combine_kernel if resolve_cp_combine() == "kernel" else None
    states = torch.empty(plan.num_chunks, h_v, HEAD_DIM, HEAD_DIM, dtype=qf.dtype, device=qf.device)
    a_st, rev = _stage0_operand(af, gf, bf, plan)

    def walk(cu: torch.Tensor, init: torch.Tensor) -> None:
        _store_states(qf, kf, vf, gf, bf, a_st, init, cu, cpp.chunk_offsets, cpp.num_pieces, scale, states, rev=rev)

    hm = states_cp(cpp, h0, state_pass_launcher(qf, kf, vf, gf, bf, a_st, cpp, scale, nsm, rev), walk, combine_fn)
    out: list[torch.Tensor] = []

    def chain(ends: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor]:
        if ends is not None:  # pass B: the fused walk from every piece's exact end gradient
            slots = ends.contiguous()
            out.extend(_fused_walk(qf, kf, vf, gf, bf, af, dof, states, slots, cpp.cu_seqlens, cpp.chunk_offsets,
                                   scale, prefetch, ws))  # fmt: skip
            return None, slots
        # pass A: the chain from zero over the pieces, storing only every piece's start gradient (ds_next is a
        # one-chunk stand-in: the kernel never writes it)
        dvl, wk = _dvl_wk(qf, kf, gf, bf, af, dof, plan, scale)
        bv = dstate_width(cpp.num_pieces, cpp.max_piece_chunks, plan.num_chunks, h_v, nsm, _step_rev())
        unused = torch.empty(1, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)
        starts = torch.empty(cpp.num_pieces, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=qf.device)
        kernel = bwd_dstate_kernel(HEAD_DIM, HEAD_DIM, scale, dt, False, bv, 256, False, True, 2, True,
                                   *_chain_flags(resolve_dstate_rev()), store_ds=False)  # fmt: skip
        kernel(qf, kf, gf, dof, dvl, wk, _dummy_state(h_v, qf.device), cpp.cu_seqlens, cpp.chunk_offsets, unused,
               starts)  # fmt: skip
        return None, starts

    _, dh0 = dstate_cp(cpp, hm, dht.contiguous() if dht is not None else None, chain, combine_fn)
    return (*out, dh0)


def grads_sum_groups(rev: str, ratio: int) -> bool:
    """Whether stage 2 of revision rev writes dq and dk summed over GVA groups of h_v / h_qk = ratio."""
    return rev in CLUSTER_SUM_REVS and ratio in CLUSTER_SUM_RATIOS


def chunk_bwd_grads(qf, kf, vf, gf, bf, af, dof, states, ds_next, plan: ChunkPlan, scale: float, dv=None,
                    sum_groups: bool = False):  # fmt: skip
    """Stage 2 on packed inputs: (dq, dk per value head [1,T,H_v,K] fp32, dbeta, dg [1,T,H_v] fp32). With dv
    ([1,T,H_v,V] in the input dtype) it also writes dv there (stage 1 rev3 does not form it). sum_groups
    (only where grads_sum_groups holds for the revision and ratio) returns dq and dk as the GVA group's sums
    [1,T,H_qk,K] in the input dtype instead."""
    from .bwd.chunk_grads import bwd_chunk_grads_kernel

    nt, h_qk, h_v = vf.shape[1], qf.shape[2], vf.shape[2]
    rev = resolve_grads_rev()
    if sum_groups and not grads_sum_groups(rev, h_v // h_qk):
        raise ValueError(f"sum_groups: stage 2 {rev} does not sum GVA groups of {h_v // h_qk} value heads")
    if sum_groups:
        dq = torch.empty(1, nt, h_qk, HEAD_DIM, dtype=qf.dtype, device=qf.device)
    else:
        dq = torch.empty(1, nt, h_v, HEAD_DIM, dtype=torch.float32, device=qf.device)
    dk = torch.empty_like(dq)
    dbeta = torch.empty(1, nt, h_v, dtype=torch.float32, device=qf.device)
    dg = torch.empty_like(dbeta)
    dt = _TL_DTYPE[qf.dtype]
    args = (qf, kf, vf, gf, bf, af, dof, states, ds_next, plan.cu_seqlens, plan.chunk_indices, dq, dk, dbeta, dg)
    if rev in WS_GRADS_REVS:
        from .bwd.chunk_grads_ws import bwd_chunk_grads_ws_kernel

        dv_out = dv if dv is not None else torch.empty_like(vf)  # rev 11 always writes dv
        bwd_chunk_grads_ws_kernel(HEAD_DIM, HEAD_DIM, scale, dt)(*args, dv_out)
        return dq, dk, dbeta, dg
    base, extra = LEAN_GRADS_REVS.get(rev, (rev, {}))
    threads, *flags = GRADS_FLAGS[base]
    group = {"cluster_sum": True, "gva_ratio": h_v // h_qk} if sum_groups else {}
    group.update(extra)
    if sum_groups and h_v == 2 * h_qk and rev in PAIR_EARLY_REVS:
        group["pair_early"] = True
    if dv is not None:
        bwd_chunk_grads_kernel(HEAD_DIM, HEAD_DIM, scale, dt, threads, False, False, *flags, True, **group)(*args, dv)
    else:
        bwd_chunk_grads_kernel(HEAD_DIM, HEAD_DIM, scale, dt, threads, False, False, *flags, **group)(*args)
    return dq, dk, dbeta, dg


def _group_sums(dq_v: torch.Tensor, dk_v: torch.Tensor, b: int, t: int, h_qk: int, dtype: torch.dtype):
    """dq, dk per value head ([1, T, H_v, K] fp32) -> [B, T, H_qk, K] in dtype: each GVA group summed in fp32,
    rounded once (resolve_group_sum's way)."""
    r = dq_v.shape[2] // h_qk
    if resolve_group_sum() == "kernel":
        from .bwd.group_sum import gva_group_sum_kernel

        dq = torch.empty(b, t, h_qk, HEAD_DIM, dtype=dtype, device=dq_v.device)
        dk = torch.empty_like(dq)
        rows = b * t * h_qk
        launcher(gva_group_sum_kernel(HEAD_DIM, _TL_DTYPE[dtype]))(
            dq_v.view(rows, r, HEAD_DIM), dk_v.view(rows, r, HEAD_DIM), dq.view(rows, HEAD_DIM), dk.view(rows, HEAD_DIM)
        )
        return dq, dk

    def one(x: torch.Tensor) -> torch.Tensor:
        grouped = x.view(b, t, h_qk, r, HEAD_DIM)
        if r == 2:  # one pass: the add runs in fp32 and rounds on store (sum-then-cast is two passes)
            out = x.new_empty(b, t, h_qk, HEAD_DIM, dtype=dtype)
            return torch.add(grouped[:, :, :, 0], grouped[:, :, :, 1], out=out)
        return grouped.sum(3).to(dtype)

    return one(dq_v), one(dk_v)


def chunk_gated_delta_rule_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g_cumsum: torch.Tensor,
    beta: torch.Tensor,
    A: torch.Tensor,
    do: torch.Tensor,
    dht: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    cp: bool | None = None,
    cp_piece: int | None = None,
) -> BwdOutput:
    """The TileLang GDN backward (FLA layout): the gradients of <o, do> + <final_state, dht>.

    g_cumsum [B,T,H_v] fp32 (chunk-local) and A [B,T,H_v,64] are the forward's outputs. Returns
    BwdOutput(dq, dk [B,T,H_qk,K] and dv in q's dtype (dq, dk summed over each GVA group in fp32),
    dbeta, dg [B,T,H_v] fp32 (dg of the raw log gate), dh0 [N,H_v,K,V] fp32 or None without h0).
    cp (default: on unless $QLA_BWD_CP is "0") runs stages 0 and 1 piece-parallel (gdn/cp_bwd.py) where
    bwd_cp_plan's cost model predicts a gain, or always, in pieces of cp_piece chunks, when given.
    $QLA_BWD_OVERLAP=1 runs stage 0 on a side stream beside stage 1 (same kernels, same results; off by default).
    """
    shape = _check_stage_inputs(q, k, v, g_cumsum, beta, A, do, cu_seqlens)
    b, t, h_qk, h_v = shape.batch, shape.seqlen, shape.h_qk, shape.h_v
    plan = _plan(q, cu_seqlens)
    n = plan.num_seqs
    _check_state("initial_state", initial_state, n, h_v)
    _check_state("dht", dht, n, h_v)
    scale = HEAD_DIM**-0.5 if scale is None else float(scale)
    qf, kf, vf, af, dof = (pack_tokens(x) for x in (q, k, v, A, do))
    gf, bf = (pack_tokens(x).float() for x in (g_cumsum, beta))

    fused = resolve_bwd_fused_mode()
    if fused != "0":
        dq, dk, dbeta, dg, dv, dh0 = _bwd_fused(qf, kf, vf, gf, bf, af, dof, initial_state, dht, plan, scale, cp,
                                                cp_piece, prefetch=fused == "2",
                                                ws=fused if fused.startswith("ws") else "")  # fmt: skip
        dq, dk = _group_sums(dq, dk, b, t, h_qk, q.dtype)
        return BwdOutput(dq=dq, dk=dk, dv=dv.view(v.shape), dbeta=dbeta.view(b, t, h_v), dg=dg.view(b, t, h_v),
                         dh0=dh0 if initial_state is not None else None)  # fmt: skip
    cpp = _bwd_cp_plan(plan, h_v, q.device, cp, cp_piece)
    side = _stage0_stream(q.device)  # stage 0 beside stage 1 (None: in turn)
    if cpp is None:
        states = torch.empty(plan.num_chunks, h_v, HEAD_DIM, HEAD_DIM, dtype=qf.dtype, device=qf.device)
        _fork(side)
        try:
            stage1 = _dstate_packed(qf, kf, gf, bf, af, dof, dht, plan, scale, None)
            with _on(side):
                chunk_states(qf, kf, vf, gf, bf, af, initial_state, plan, scale, states)
        finally:  # joined even on an error: an unjoined side stream would end a graph capture with its own error
            _join(side)
    else:
        states, stage1 = _states_and_dstate_cp(qf, kf, vf, gf, bf, af, dof, initial_state, dht, plan, cpp, scale,
                                               side)  # fmt: skip
    dv = torch.empty_like(vf) if stage1.dv is None else None  # then stage 2 writes it, in v's dtype
    summed = grads_sum_groups(resolve_grads_rev(), h_v // h_qk)  # rev 9: stage 2 writes the group's sums
    dq, dk, dbeta, dg = chunk_bwd_grads(qf, kf, vf, gf, bf, af, dof, states, stage1.ds_next, plan, scale, dv, summed)
    if summed:
        dq, dk = dq.view(b, t, h_qk, HEAD_DIM), dk.view(b, t, h_qk, HEAD_DIM)
    else:
        dq, dk = _group_sums(dq, dk, b, t, h_qk, q.dtype)
    return BwdOutput(
        dq=dq,
        dk=dk,
        dv=(stage1.dv if dv is None else dv).view(v.shape).to(v.dtype),
        dbeta=dbeta.view(b, t, h_v),
        dg=dg.view(b, t, h_v),
        dh0=stage1.dh0 if initial_state is not None else None,
    )
