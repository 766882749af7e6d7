"""Whether, and in pieces of how many chunks, the backward runs its chains context-parallel (gdn/cp_bwd.py).

Pure python, tested on CPU. The backward's chains are stage 0 (the forward's walk storing every chunk's
state) and stage 1 rev3 (the reverse chain of state gradients). Their cost, by piece length L:

    no CP : the forward's walk over the sequences (cp_plan.predict_us without pieces)
            + stage 1 over the sequences (stage1_chain_us)
    CP    : the forward's CP cost at L (cp_plan.predict_us: state pass, combine, walk over the pieces)
            + stage 1 twice over the pieces (pass A from zero, pass B from the exact ends), each
              + PASS_SETUP_US, + one more combine (cp_plan's combine_setup_us + links x combine_link_us)

Nothing here is fitted beyond the two models it composes (cp_plan.CPHeuristics, DSTATE_STEP_US) and
PASS_SETUP_US: on the H200 (session 9, tests/gpu/test_qla_bwd_cp.py::test_time_bwd_cp and two qwen35-bwd
rows) it reproduces the measured change of the whole backward at 29 (config, L) points, from -1.47 ms to
+3.6 ms, within 0.1 ms at 17 of them and within 0.25 ms or 25 % at all, and it predicts the two 8-sequence
mixes where CP lost (+0.20 and +0.73 ms predicted, +0.20 and +0.85 measured): there the SMs are already
full, and stage 1 twice costs more than it saves. Those checks ran stage 1 rev3; rev4 (the default since
session 10) has its own measured step (DSTATE_STEP_US).
"""

from __future__ import annotations

from .checks import HEAD_DIM
from .cp_plan import CPHeuristics, PerPlanCache, predict_floor_us, predict_us, split_counts
from .plan import ChunkPlan

# Stage 1's chain: one step of one CTA (microseconds, on the H200) by revision and V-slice width, from
# tests/gpu/test_qla_bwd.py::test_time_dstate_block_v (stage 1 less its parallel part over the chain steps,
# five configs): rev3 2.85-2.90 us at 32 and 5.0-5.1 at 64 (session 6), rev4 (one more GEMM a step) 3.18-3.30
# and 5.59-5.66 (session 10, results/H200/logs/2026-12-03-s10/call3-bwd_block_v.json).
DSTATE_STEP_US = {"rev3": {32: 2.88, 64: 5.07}, "rev4": {32: 3.25, 64: 5.62}}
DEFAULT_REV = "rev4"  # bwd_api.DEFAULT_DSTATE_REV (not imported: bwd_api imports this module)

# Stage 0's CP cost: the forward's model with the numbers this composite was checked with on the H200
# (session 9). Session 10 refit the forward's piece_setup_us and prep_step_scale on the ws6 forward; stage 0
# runs the ws5 state-storing walk, whose CP timings have not been refit, so it keeps session 9's values.
# Stage 0's walk runs at the count rule's width (bwd_api), so its price keeps that width (width_margin=1).
# The combine keeps session 9's link cost (rev 1, 10.5 us) too: with rev 2's 6.1 the model moves 2/4 x 32 K
# from 64- to 32-chunk pieces, which no backward run has measured; refit with the backward's CP timings.
STAGE0_HEURISTICS = CPHeuristics(piece_setup_us=20.0, prep_step_scale=0.8, width_margin=1.0, combine_link_us=10.5)

PASS_SETUP_US = 20.0  # a stage-1 pass over pieces beyond its steps (launch, first loads)
MARGIN = 0.05  # CP must be predicted at least this much faster than no CP


def dstate_width(chains: int, max_chunks: int, num_chunks: int, h_v: int, num_sms: int, rev: str = DEFAULT_REV) -> int:
    """Stage 1's V-slice for `chains` chains (sequences, or pieces): the width with the shorter estimated
    time (_chain_us)."""
    return min(DSTATE_STEP_US[rev], key=lambda bv: _chain_us(bv, chains, max_chunks, num_chunks, h_v, num_sms, rev))


def _chain_us(
    bv: int, chains: int, max_chunks: int, num_chunks: int, h_v: int, num_sms: int, rev: str = DEFAULT_REV
) -> float:
    """One CTA per (chain, head, slice) fits on an SM; the kernel takes the longest chain, or as many rounds
    of CTAs as the SMs need times the mean chain, whichever is longer."""
    ctas = chains * h_v * (HEAD_DIM // bv)
    return DSTATE_STEP_US[rev][bv] * max(max_chunks, -(-ctas // num_sms) * num_chunks / chains)


def stage1_chain_us(chunks: list[int], h_v: int, num_sms: int, rev: str = DEFAULT_REV) -> float:
    """Stage 1's chain over chains of `chunks` chunks each, at the width it would run."""
    n, longest, total = len(chunks), max(chunks), sum(chunks)
    return _chain_us(dstate_width(n, longest, total, h_v, num_sms, rev), n, longest, total, h_v, num_sms, rev)


def predict_bwd_chains_us(
    chunks: list[int],
    h_v: int,
    num_sms: int,
    piece: int | None,
    h: CPHeuristics = STAGE0_HEURISTICS,
    rev: str = DEFAULT_REV,
) -> float:
    """Predicted time of stages 0 and 1 for sequences of `chunks` chunks, in pieces of `piece` (None: no CP),
    with stage 1 revision `rev`."""
    return predict_us(chunks, h_v, num_sms, piece, h)[0] + _after_stage0_us(chunks, h_v, num_sms, piece, h, rev)


def predict_bwd_chains_floor_us(
    chunks: list[int], h_v: int, num_sms: int, piece: int, h: CPHeuristics = STAGE0_HEURISTICS, rev: str = DEFAULT_REV
) -> float:
    """A lower bound on predict_bwd_chains_us(..., piece): stage 0's makespan floor (cp_plan.predict_floor_us),
    the rest as priced (closed forms)."""
    return predict_floor_us(chunks, h_v, num_sms, piece, h) + _after_stage0_us(chunks, h_v, num_sms, piece, h, rev)


def _after_stage0_us(chunks: list[int], h_v: int, num_sms: int, piece: int | None, h: CPHeuristics,
                     rev: str) -> float:
    """Stage 1's chain (twice over the pieces with CP, plus the combine between the passes)."""
    pieces = [p for c in chunks for p in split_counts(c, piece)]
    if piece is None or len(pieces) == len(chunks):
        return stage1_chain_us(chunks, h_v, num_sms, rev)
    links = max(len(split_counts(c, piece)) for c in chunks) - 1
    combine = h.combine_setup_us + links * h.combine_link_us
    return 2 * (stage1_chain_us(pieces, h_v, num_sms, rev) + PASS_SETUP_US) + combine


def _check_chunks(chunks: list[int], h_v: int, num_sms: int) -> None:
    if h_v < 1 or num_sms < 1 or not chunks or min(chunks) < 1:
        raise ValueError(f"need h_v >= 1, num_sms >= 1 and sequences of >= 1 chunk; got h_v={h_v}, "
                         f"num_sms={num_sms}, chunks={chunks[:8]}")  # fmt: skip


def choose_bwd_cp(
    chunks: list[int], h_v: int, num_sms: int, h: CPHeuristics = STAGE0_HEURISTICS, rev: str = DEFAULT_REV
) -> int | None:
    """The piece length with the shortest predicted chains, or None when none beats no CP by MARGIN."""
    _check_chunks(chunks, h_v, num_sms)
    if rev not in DSTATE_STEP_US:
        raise ValueError(f"rev must be one of {sorted(DSTATE_STEP_US)}, got {rev!r}")
    base = predict_bwd_chains_us(chunks, h_v, num_sms, None, h, rev)
    best, best_us = None, base
    for piece in h.piece_candidates(max(chunks)):
        # skip a piece length that cannot win (its floor): stage 0's schedule is the costly part of the price
        floor = predict_bwd_chains_floor_us(chunks, h_v, num_sms, piece, h, rev)
        if floor >= best_us or floor > base * (1.0 - MARGIN):
            continue
        t = predict_bwd_chains_us(chunks, h_v, num_sms, piece, h, rev)
        if t < best_us:
            best, best_us = piece, t
    return best if best is not None and best_us <= base * (1.0 - MARGIN) else None


_pieces = PerPlanCache()


def bwd_piece_chunks(chunk_plan: ChunkPlan, h_v: int, num_sms: int, rev: str = DEFAULT_REV) -> int | None:
    """choose_bwd_cp for a ChunkPlan's sequences, cached per (plan object, h_v, #SM, rev): decided once per
    cu_seqlens, from the host offsets the plan holds (no host sync)."""
    return _pieces.get(
        chunk_plan, (h_v, num_sms, rev), lambda chunks, _cu: choose_bwd_cp(chunks, h_v, num_sms, rev=rev)
    )


# The fused backward ($QLA_BWD_FUSED, session 23: bwd/chunk_grads.py's `fused`): one CTA per (piece, value head)
# walks the piece's chunks with stage 1's chain and stage 2's gradients in one step. Stage 0 stays as it is; with CP,
# pass A (bwd/dvl_wk.py and the chain from zero over the pieces) and the combine give every piece's exact end
# gradient, and the fused walk replaces pass B and stage 2. Its step is an estimate until measured: stage 2 rev 8's
# CTA (~20 us a chunk on the H200, session 22's kernel table) plus the chain's three GEMMs.
FUSED_STEP_US = 21.0
# bwd/dvl_wk.py over every chunk and head (H200, session 22: 609 us at 16/32 x 32768, 512 chunks x 32 heads)
DVL_WK_US = 609.0 / (512 * 32)


def fused_walk_us(chunks: list[int], h_v: int, num_sms: int) -> float:
    """The fused walk over chains of `chunks` chunks: one CTA per (chain, head), one CTA an SM; the longest chain,
    or as many rounds of CTAs as the SMs need times the mean chain, whichever is longer."""
    ctas = len(chunks) * h_v
    return FUSED_STEP_US * max(max(chunks), -(-ctas // num_sms) * sum(chunks) / len(chunks))


def predict_fused_us(
    chunks: list[int],
    h_v: int,
    num_sms: int,
    piece: int | None,
    h: CPHeuristics = STAGE0_HEURISTICS,
    rev: str = DEFAULT_REV,
) -> float:
    """Predicted time of the fused backward less its group sums: stage 0 (over pieces with CP), with CP pass A
    and the combine, and the fused walk."""
    stage0 = predict_us(chunks, h_v, num_sms, piece, h)[0]
    pieces = [p for c in chunks for p in split_counts(c, piece)]
    if piece is None or len(pieces) == len(chunks):
        return stage0 + fused_walk_us(chunks, h_v, num_sms)
    links = max(len(split_counts(c, piece)) for c in chunks) - 1
    pass_a = DVL_WK_US * sum(chunks) * h_v + stage1_chain_us(pieces, h_v, num_sms, rev) + PASS_SETUP_US
    combine = h.combine_setup_us + links * h.combine_link_us
    return stage0 + pass_a + combine + fused_walk_us(pieces, h_v, num_sms)


def choose_fused_cp(
    chunks: list[int], h_v: int, num_sms: int, h: CPHeuristics = STAGE0_HEURISTICS, rev: str = DEFAULT_REV
) -> int | None:
    """The piece length with the shortest predicted fused backward, or None when none beats no CP by MARGIN."""
    _check_chunks(chunks, h_v, num_sms)
    base = predict_fused_us(chunks, h_v, num_sms, None, h, rev)
    best, best_us = None, base
    for piece in h.piece_candidates(max(chunks)):
        t = predict_fused_us(chunks, h_v, num_sms, piece, h, rev)
        if t < best_us:
            best, best_us = piece, t
    return best if best is not None and best_us <= base * (1.0 - MARGIN) else None


def fused_piece_chunks(chunk_plan: ChunkPlan, h_v: int, num_sms: int, rev: str = DEFAULT_REV) -> int | None:
    """choose_fused_cp for a ChunkPlan's sequences, cached like bwd_piece_chunks (no host sync)."""
    return _pieces.get(
        chunk_plan, ("fused", h_v, num_sms, rev), lambda chunks, _cu: choose_fused_cp(chunks, h_v, num_sms, rev=rev)
    )
