"""Intra-card context parallelism (CP) planning: split long sequences into pieces of L chunks.

Pure python/torch, tested on CPU; api.py runs the plan through cp.py when CP is on. What is decided here,
once per cu_seqlens (cached on the ChunkPlan, so a cache hit costs no host sync and no allocation):

- whether to split at all and the piece length L (in 64-token chunks), by a cost model whose every
  number is a field of CPHeuristics (data, refit from H200 measurements in session 7);
- the V-slice width of the fused kernel under that split;
- the pieces as device tensors: piece token offsets (the fused kernel's "sequences"), the sequence and
  index of every piece, and where each sequence's pieces start.

Pieces start at multiples of 64 tokens from their sequence's start, so chunk boundaries (and A0, which
is per chunk) are the same with or without CP; only a sequence's last piece can be ragged.

Cost model (times in microseconds; a pass is a list of CTA durations scheduled on num_sms x ctas_per_sm
slots, longest first, and costs its makespan):
    no CP : fused pass, one CTA per (sequence, head, V-slice) at the api's width for N sequences,
            chunks x fused_step_us[BV]
    CP    : state pass   one CTA per (piece, head, V-slice) for h and one for M at the api's width for 2P
                         pieces, chunks x prep_step_scale x fused_step_us[BV] + piece_setup_us (the whole
                         piece, unless assumed_warmup_chunks); M only for exact_m_frac of the heads, the
                         other M slices skip_m_us (their pieces decay: M = 0, decided on the GPU)
            combine      one kernel after the state pass (fwd/cp_combine.py): combine_setup_us + the longest
                         sequence's links x combine_link_us (sequences and heads run in parallel)
            fused pass   over the pieces at the api's width for P pieces, + piece_setup_us per CTA
            + launch_us per extra kernel
CP is used when its best L beats no-CP by more than `margin`. FlashQLA's closed-form rule (their SM90
fallback, design/gdn.md) is kept as flashqla_rule() for comparison.
"""

from __future__ import annotations

import heapq
import itertools
import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, fields

import torch

from .plan import CHUNK, ChunkPlan, choose_block_v_ws, longest_first

_CACHE_SIZE = 64


@dataclass(frozen=True)
class CPHeuristics:
    """Every number the CP decision uses (session 7 fit, session 10 refit; NOTES.md). fused_step_us: the ws6
    fused kernel's chunk step by V-slice width with at most one CTA per SM, from the whole forward less kkt_solve on the
    H200 (2/8 1x32768: 1.56 us at 32, 1.88 at 64, 2.86 at 128; 16/32 1x32768 at 32: 1.62; 16/32 8192x4 at
    128: 3.09). piece_setup_us: what a CTA walking a piece costs beyond its steps (initial state load,
    pipeline fill). The state pass (ws rev 5's state_pass build: h from S = 0 for every piece, M from S = I
    unless the piece decays, exact_m_frac below) runs at the width the api picks for 2P pieces,
    prep_step_scale times the fused step there. Session 10 refit these two (20 -> 10 us, 0.8 -> 0.7) on the
    H200 against 17 qwen35-fwd mixes x 4 piece lengths timed with the harness's gates
    (tests/gpu/test_qla_cp.py::test_time_cp_mixes[harness]): the change CP makes to the whole forward is
    then predicted within 24 us RMS (169 before, which priced CP 0.1-0.45 ms too high and declined it on
    8 mixes where it gains 2.5-24 %). The combine is the one-kernel
    form: its links S_{p+1} = M_p S_p + h_p run one after another within a sequence, plus ~13.5 us for the
    launch and the first loads. Session 8 (rev 1, H200): ~10.5 us a link (0.087 ms for 7 links, 0.162 for 15,
    0.340 for 31). Session 18 (H100, one call, profile_cp --combine at 3/7/15/31 links): rev 1 10.45 us a
    link (as on the H200), rev 2 at 32-column slices (the default) 6.06, so combine_link_us = 6.1; the
    intercept (12.7 us) is within the H200's 13.5, kept. The host walk ($QLA_CP_COMBINE=views, ~40 us of host
    time a link) is not priced."""

    fused_step_us: tuple[tuple[int, float], ...] = ((32, 1.6), (64, 2.0), (128, 3.0))
    fused_ctas_per_sm: int = 1  # 100-200 KiB of shared memory per CTA: one per SM
    piece_setup_us: float = 10.0
    prep_step_scale: float = 0.7
    combine_link_us: float = 6.1
    combine_setup_us: float = 13.5
    launch_us: float = 5.0  # per extra launch (state pass, fused walk over pieces)
    margin: float = 0.05  # CP must be predicted at least this much faster than no CP
    min_piece_chunks: int = 4
    max_piece_chunks: int = 512
    # The state pass writes M = 0 for a piece whose summed log gate is at most fused_fwd_ws.SKIP_M_LOG_DECAY
    # (data-dependent, decided on the GPU per piece and head): the model assumes this fraction of the value
    # heads needs its exact M (the harness's inputs set 25 % of the heads to g = 0; trained models have
    # hardly any), and a skipped slice costs skip_m_us.
    exact_m_frac: float = 0.25
    skip_m_us: float = 3.0
    # None: plan for the worst case (heads that do not decay need the whole previous piece exactly).
    # An int n: assume gate-driven warm-up over the previous piece's last n chunks is enough.
    assumed_warmup_chunks: int | None = None
    # The fused walk's V-slice width: plan.choose_block_v_ws's count rule (one wave of CTAs) unless the
    # model prices another width this much faster for the actual sequence lengths. The count rule assumes
    # sequences of one length; on a ragged mix the long sequences' CTAs set the time while the short ones
    # leave SMs idle, and a narrower slice (shorter step, more CTAs) fills them (session 14, best_block_v).
    # 1.0 keeps the count rule (what stage 0 of the backward runs, bwd_cp_plan).
    width_margin: float = 0.05

    def step_us(self, block_v: int) -> float:
        return dict(self.fused_step_us)[block_v]

    @property
    def block_vs(self) -> tuple[int, ...]:
        return tuple(bv for bv, _ in self.fused_step_us)

    def __hash__(self) -> int:
        """The fields' hash, computed once: the plan caches' keys hold the heuristics, so every forward call
        hashes them (twice; ~1 us each with the generated per-field hash)."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def piece_candidates(self, max_chunks: int) -> list[int]:
        """Powers of two from min_piece_chunks up to (not including) the longest sequence."""
        out, length = [], self.min_piece_chunks
        while length < max_chunks and length <= self.max_piece_chunks:
            out.append(length)
            length *= 2
        return out


DEFAULT_HEURISTICS = CPHeuristics()


def makespan(runs: list[tuple[float, int]], slots: int, longest_first: bool = True) -> float:
    """List scheduling of `count` CTAs of each `duration` on `slots` identical slots, each CTA on the slot that
    frees first: longest first, or (longest_first=False) in the order of `runs`, which is how the GPU hands
    out a grid's CTAs (by block index) when `runs` lists them in that order."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    free = [(0.0, slots)]  # (time a group of slots becomes free, how many)
    end = 0.0
    for duration, count in sorted(runs, key=lambda r: -r[0]) if longest_first else runs:
        while count > 0:
            t, n = heapq.heappop(free)
            take = min(n, count)
            if n > take:
                heapq.heappush(free, (t, n - take))
            heapq.heappush(free, (t + duration, take))
            end = max(end, t + duration)
            count -= take
    return end


def split_counts(chunks: int, piece: int | None) -> list[int]:
    """Chunks of each piece of a sequence of `chunks` chunks (no split when piece is None or >= chunks)."""
    if piece is None or chunks <= piece:
        return [chunks]
    full, rest = divmod(chunks, piece)
    return [piece] * full + ([rest] if rest else [])


def _fused_us(pieces: list[int], h_v: int, block_v: int, num_sms: int, h: CPHeuristics,
              setup_us: float = 0.0) -> float:
    """The fused walk over `pieces` (sequences or CP pieces; a piece's heads and V-slices are consecutive
    blocks), its CTAs dispatched in block order, which the plan's seq_order / piece_order makes longest first
    (session 15; before it, on 4096+28672 the short sequence's CTAs went first, and with more CTAs than SMs
    some of the long walks started only when they finished)."""
    return makespan(_fused_runs(pieces, h_v, block_v, h, setup_us), num_sms * h.fused_ctas_per_sm,
                    longest_first=True)


def makespan_floor(runs: list[tuple[float, int]], slots: int) -> float:
    """A lower bound on makespan(runs, slots) under any order: the longest CTA, and the work spread over every
    slot. O(len(runs)), where the schedule itself costs up to a heap operation per CTA."""
    if not runs:
        return 0.0
    return max(max(d for d, n in runs if n > 0), sum(d * n for d, n in runs) / slots)


def _fused_runs(pieces: list[int], h_v: int, block_v: int, h: CPHeuristics, setup_us: float) -> list:
    ways = 128 // block_v
    return [(c * h.step_us(block_v) + setup_us, h_v * ways) for c in pieces]


def best_block_v(chunks: list[int], h_v: int, num_sms: int, h: CPHeuristics = DEFAULT_HEURISTICS,
                 setup_us: float = 0.0) -> tuple[float, int]:
    """(predicted time, V-slice width) of the fused walk over sequences (or pieces) of `chunks` chunks: the
    count rule's width (plan.choose_block_v_ws) unless another of h.block_vs is predicted faster by more
    than h.width_margin. On equal lengths the two agree (one wave at the narrowest width that fits it); on
    a ragged mix, e.g. 16/48 28672+4096, the 448-chunk sequence's CTAs set the time and a narrower slice
    shortens their walk (1344 -> 896 us at BV 128 -> 64; 1024 for 4096+28672, whose short sequence's CTAs
    are dispatched first)."""
    count_bv = choose_block_v_ws(len(chunks), h_v, num_sms)
    count = (_fused_us(chunks, h_v, count_bv, num_sms, h, setup_us), count_bv)
    bar = count[0] * (1.0 - h.width_margin)  # another width must come in under this
    slots = num_sms * h.fused_ctas_per_sm
    fastest = count
    for bv in h.block_vs:  # a width whose floor is over the bar cannot be taken: not scheduled (same result)
        if bv != count_bv and makespan_floor(_fused_runs(chunks, h_v, bv, h, setup_us), slots) < bar:
            fastest = min(fastest, (_fused_us(chunks, h_v, bv, num_sms, h, setup_us), bv))
    return fastest if fastest[0] < bar else count


def _prep_runs(pieces: list[int], h_v: int, num_sms: int, h: CPHeuristics) -> list[tuple[float, int]]:
    """The CP state pass's CTAs (h slices, the exact M slices, the skipped M slices) as makespan runs."""
    bv_sp = choose_block_v_ws(2 * len(pieces), h_v, num_sms)
    warm = pieces if h.assumed_warmup_chunks is None else [min(p, h.assumed_warmup_chunks) for p in pieces]
    ways = 128 // bv_sp
    exact_m = math.ceil(h.exact_m_frac * h_v)  # value heads whose transition M is computed, per piece
    runs = [(c * h.step_us(bv_sp) * h.prep_step_scale + h.piece_setup_us, (h_v + exact_m) * ways) for c in warm]
    runs.append((h.skip_m_us, len(warm) * (h_v - exact_m) * ways))  # the skipped M slices: zeros, then exit
    return runs


def _combine_us(chunks: list[int], piece: int, h: CPHeuristics) -> float:
    longest_chain = max(len(split_counts(c, piece)) for c in chunks) - 1
    return h.combine_setup_us + longest_chain * h.combine_link_us


def predict_floor_us(chunks: list[int], h_v: int, num_sms: int, piece: int,
                     h: CPHeuristics = DEFAULT_HEURISTICS) -> float:
    """A lower bound on predict_us(..., piece, h)[0] in O(pieces): each pass's makespan_floor at its best width
    for the fused walk. choose_cp skips a piece length whose floor cannot beat the best so far."""
    pieces = [p for c in chunks for p in split_counts(c, piece)]
    slots = num_sms * h.fused_ctas_per_sm
    if len(pieces) == len(chunks):
        return min(makespan_floor(_fused_runs(pieces, h_v, bv, h, 0.0), slots) for bv in h.block_vs)
    fused = min(makespan_floor(_fused_runs(pieces, h_v, bv, h, h.piece_setup_us), slots) for bv in h.block_vs)
    prep = makespan_floor(_prep_runs(pieces, h_v, num_sms, h), slots)
    return fused + prep + _combine_us(chunks, piece, h) + 3 * h.launch_us


def predict_us(chunks: list[int], h_v: int, num_sms: int, piece: int | None,
               h: CPHeuristics = DEFAULT_HEURISTICS) -> tuple[float, int]:
    """(predicted time, V-slice width of the fused walk) for piece length `piece` (None: no CP). The
    widths are the api's own (best_block_v; the api runs the decision's width), so the model prices what
    would run."""
    pieces = [p for c in chunks for p in split_counts(c, piece)]
    if piece is None or len(pieces) == len(chunks):
        return best_block_v(pieces, h_v, num_sms, h)
    fused, bv = best_block_v(pieces, h_v, num_sms, h, setup_us=h.piece_setup_us)
    prep = makespan(_prep_runs(pieces, h_v, num_sms, h), num_sms * h.fused_ctas_per_sm)
    return fused + prep + _combine_us(chunks, piece, h) + 3 * h.launch_us, bv


@dataclass(frozen=True)
class CPDecision:
    piece_chunks: int | None  # None: no CP
    block_v: int
    predicted_us: float
    baseline_us: float  # no CP, best V-slice
    # (L, predicted us) of the piece lengths scheduled; those whose lower bound could not win are not listed
    sweep: tuple[tuple[int, float], ...] = field(default=(), compare=False)


def choose_cp(chunks: list[int], h_v: int, num_sms: int, h: CPHeuristics = DEFAULT_HEURISTICS) -> CPDecision:
    """Pick the piece length (or no CP) for sequences of `chunks` chunks and h_v value heads."""
    if h_v < 1 or num_sms < 1 or not chunks or min(chunks) < 1:
        raise ValueError(f"need h_v >= 1, num_sms >= 1 and sequences of >= 1 chunk; got h_v={h_v}, "
                         f"num_sms={num_sms}, chunks={chunks[:8]}")
    base_us, base_bv = predict_us(chunks, h_v, num_sms, None, h)
    sweep = []
    best = (base_us, None, base_bv)
    for piece in h.piece_candidates(max(chunks)):
        # a piece length whose floor can neither beat the best so far nor pass the margin cannot be chosen:
        # skip its schedule (up to a heap operation per CTA: 0.3 s for 256 sequences at 4-chunk pieces)
        floor = predict_floor_us(chunks, h_v, num_sms, piece, h)
        if floor >= best[0] or floor > base_us * (1.0 - h.margin):
            continue
        t, bv = predict_us(chunks, h_v, num_sms, piece, h)
        sweep.append((piece, t))
        if t < best[0]:
            best = (t, piece, bv)
    t, piece, bv = best
    if piece is not None and t > base_us * (1.0 - h.margin):
        t, piece, bv = base_us, None, base_bv
    return CPDecision(piece_chunks=piece, block_v=bv, predicted_us=t, baseline_us=base_us, sweep=tuple(sweep))


def flashqla_rule(chunks: list[int], h_v: int, num_sms: int) -> tuple[bool, int]:
    """FlashQLA's SM90 fallback rule as published (design/gdn.md), for comparison only:
    L = max(4, 2^round(log2(3 sqrt(H_v * total_chunks / #SM)))); CP when Be*H_v <= 40, or <= 56 with the
    longest sequence >= 128 chunks, where Be = total chunks / longest."""
    total, longest = sum(chunks), max(chunks)
    piece = max(4, 2 ** round(math.log2(3 * math.sqrt(h_v * total / num_sms))))
    be_h = total / longest * h_v
    return (be_h <= 40 or (be_h <= 56 and longest >= 128)), piece


@dataclass(frozen=True)
class CPPlan:
    """The split, as device tensors (int32) plus host sizes.

    cu_seqlens [P+1]: token offsets of the pieces (equal to the input's when CP is off);
    piece_seq [P]: sequence of each piece; piece_index [P]: its index within the sequence (0 = takes the
    sequence's initial state); seq_first_piece [N+1]: pieces of sequence s are seq_first_piece[s] ..
    seq_first_piece[s+1]-1, the last one writes the final state.
    """

    decision: CPDecision
    cu_seqlens: torch.Tensor
    piece_seq: torch.Tensor
    piece_index: torch.Tensor
    seq_first_piece: torch.Tensor
    num_pieces: int
    num_seqs: int
    max_piece_chunks: int
    # for the combine step (gdn/cp.py), int64 index tensors: links[k] = the pieces at position k of their
    # sequence that have a successor (piece p hands its end state to p + 1); first/last piece per sequence
    links: tuple[torch.Tensor, ...] = ()
    first_piece: torch.Tensor | None = None
    last_piece: torch.Tensor | None = None
    # the same links as host ints, position-major (every piece's state is final before it is read), so the
    # combine can run one GEMM per link on views instead of gathering and scattering through index tensors
    host_links: tuple[int, ...] = ()
    # chunk_offsets [P+1] int32: the global index of every piece's first chunk (pieces start on chunk
    # boundaries, so a piece's chunks keep their numbers: kernels that write per-chunk outputs over the
    # pieces write where the whole-sequence run would); reverse_order [P] int64: each sequence's pieces
    # last to first, in place (an involution), for the backward's reverse chain (gdn/cp_bwd.py)
    chunk_offsets: torch.Tensor | None = None
    reverse_order: torch.Tensor | None = None
    # piece_order [P] int32: the pieces longest first (plan.longest_first), the fused walk's grid order
    piece_order: torch.Tensor | None = None

    @property
    def enabled(self) -> bool:
        return self.decision.piece_chunks is not None

    def final_states(self, piece_states: torch.Tensor) -> torch.Tensor:
        """The sequences' final states [N, ...] from every piece's end state [P, ...]: each sequence's last
        piece. One sequence: a view of the last row (no launch, no allocation: a gather costs ~10 us of host
        time, and the small CP configs are host-bound); it shares piece_states' storage."""
        if self.num_seqs == 1:
            return piece_states[self.num_pieces - 1 :]
        return piece_states.index_select(0, self.last_piece)


def build_cp_plan(cu: list[int] | tuple[int, ...], decision: CPDecision, device: torch.device | str) -> CPPlan:
    """Pieces for host offsets `cu` under `decision` (pure; cu is assumed validated by plan.py)."""
    piece = decision.piece_chunks
    offs, seq, idx, first, chunk_offs = [], [], [], [0], [0]
    longest = 0
    for s, (a, b) in enumerate(itertools.pairwise(cu)):
        chunks = -(-(b - a) // CHUNK)
        start = a
        for i, c in enumerate(split_counts(chunks, piece)):
            offs.append(start)
            seq.append(s)
            idx.append(i)
            chunk_offs.append(chunk_offs[-1] + c)
            longest = max(longest, c)
            start = min(b, start + c * CHUNK)
        first.append(len(offs))
    offs.append(cu[-1])
    reverse = [first[s] + first[s + 1] - 1 - p for s in range(len(cu) - 1) for p in range(first[s], first[s + 1])]

    def dev(x, dtype=torch.int32):
        return torch.tensor(x, dtype=dtype).to(device)

    links, host_links = [], []
    for k in range(max(idx, default=-1) + 1):
        sel = [p for p in range(len(seq)) if idx[p] == k and p + 1 < first[seq[p] + 1]]
        if sel:
            links.append(dev(sel, torch.int64))
            host_links.extend(sel)
    return CPPlan(decision=decision, cu_seqlens=dev(offs), piece_seq=dev(seq), piece_index=dev(idx),
                  seq_first_piece=dev(first), num_pieces=len(seq), num_seqs=len(cu) - 1,
                  max_piece_chunks=longest, links=tuple(links), first_piece=dev(first[:-1], torch.int64),
                  last_piece=dev([f - 1 for f in first[1:]], torch.int64), host_links=tuple(host_links),
                  chunk_offsets=dev(chunk_offs), reverse_order=dev(reverse, torch.int64),
                  piece_order=dev(longest_first([b - a for a, b in itertools.pairwise(chunk_offs)])))


class PerPlanCache:
    """Values computed once per ChunkPlan object (plus the key's other parts) from the host offsets it holds:
    a hit costs no host sync and no allocation. Entries are dropped with their plan (weak reference) or when
    the cache is full (least recently used first)."""

    def __init__(self, size: int = _CACHE_SIZE):
        self._entries: OrderedDict[tuple, tuple[weakref.ref, object]] = OrderedDict()
        self._size = size

    def get(self, chunk_plan: ChunkPlan, extra: tuple, compute):
        """The cached value for (chunk_plan, *extra), else compute(chunks per sequence, host offsets)."""
        key = (id(chunk_plan), *extra)
        hit = self._entries.get(key)
        if hit is not None and hit[0]() is chunk_plan:
            self._entries.move_to_end(key)
            return hit[1]
        cu = chunk_plan.cu_host
        if len(cu) < 2:
            raise ValueError("the ChunkPlan has no host offsets (cu_host); build it with plan.build_plan_from_list")
        value = compute([-(-(b - a) // CHUNK) for a, b in itertools.pairwise(cu)], cu)
        self._entries[key] = (weakref.ref(chunk_plan), value)
        self._entries.move_to_end(key)  # a key reused by a new plan (its old plan gone) is the newest entry
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return value


_plans = PerPlanCache()


def plan_cp(
    chunk_plan: ChunkPlan,
    h_v: int,
    num_sms: int,
    h: CPHeuristics = DEFAULT_HEURISTICS,
    piece_chunks: int | None = None,
) -> CPPlan:
    """CP plan for a ChunkPlan (from plan_varlen / plan_fixed), cached per (plan object, h_v, #SM,
    heuristics, forced piece length): built once, from the host offsets the ChunkPlan already holds, so
    never a host sync. piece_chunks forces pieces of that many chunks instead of the cost model's choice."""

    def build(chunks: list[int], cu: tuple[int, ...]) -> CPPlan:
        if piece_chunks is not None:
            t, bv = predict_us(chunks, h_v, num_sms, piece_chunks, h)
            decision = CPDecision(piece_chunks, bv, t, predict_us(chunks, h_v, num_sms, None, h)[0])
        else:
            decision = choose_cp(chunks, h_v, num_sms, h)
        return build_cp_plan(cu, decision, chunk_plan.cu_seqlens.device)

    return _plans.get(chunk_plan, (h_v, num_sms, h, piece_chunks), build)


_widths = PerPlanCache()


def plan_block_v(chunk_plan: ChunkPlan, h_v: int, num_sms: int, h: CPHeuristics = DEFAULT_HEURISTICS) -> int:
    """The fused walk's V-slice width over the plan's own sequences (no CP), best_block_v's choice, cached
    per plan like plan_cp: no host sync."""
    return _widths.get(chunk_plan, ("width", h_v, num_sms, h),
                       lambda chunks, cu: best_block_v(chunks, h_v, num_sms, h)[1])
