"""Chunk plans: which (sequence, chunk) each 64-token chunk is, built once per cu_seqlens.

Everything here is pure torch/python so it is tested on CPU. The varlen plan needs cu_seqlens on the
host once (one sync when a new cu_seqlens tensor is first seen); it is cached by tensor identity (a weak
reference, so a freed tensor whose address is reused never hits a stale entry). Fixed-length batches
need no sync at all: their plan is arithmetic.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .checks import HEAD_DIM, check_cu_seqlens_values

CHUNK = 64
_CACHE_SIZE = 64


@dataclass(frozen=True)
class ChunkPlan:
    """Device tensors the kernels index by, plus host-side sizes for grids.

    cu_seqlens: int32 [N+1] token offsets; chunk_indices: int32 [NC, 2] rows of (sequence, chunk within
    sequence); chunk_offsets: int32 [N+1] first global chunk of each sequence. cu_host: the same offsets
    on the host (read once when the plan was built), for later host-side planning without a sync.
    seq_order: int32 [N] the sequences longest first (ties in input order), the order in which the fused
    forward's grid walks them: the GPU hands out blocks roughly by index, so on 4096+28672 the long walks
    start first instead of queueing behind the short ones when there are more CTAs than SMs.
    """

    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    num_seqs: int
    num_chunks: int
    max_chunks: int
    cu_host: tuple[int, ...] = ()
    seq_order: torch.Tensor | None = None


def longest_first(counts: list[int]) -> list[int]:
    """Indices of `counts` by decreasing count, ties in index order (a stable sort: equal lengths keep the
    input order, so a fixed-length batch walks its sequences as given)."""
    return sorted(range(len(counts)), key=lambda i: -counts[i])


def chunk_counts(lengths: list[int], chunk: int = CHUNK) -> list[int]:
    """Chunks per sequence: ceil(len / chunk); a ragged tail is one partial chunk."""
    return [(n + chunk - 1) // chunk for n in lengths]


def build_plan_from_list(cu: list[int], device: torch.device | str, chunk: int = CHUNK) -> ChunkPlan:
    """Plan from host offsets (validated)."""
    check_cu_seqlens_values(cu, cu[-1] if cu else 0)
    counts = chunk_counts([b - a for a, b in itertools.pairwise(cu)], chunk)
    seq_ids = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    offs = [0]
    for c in counts:
        offs.append(offs[-1] + c)
    local = torch.arange(offs[-1]) - torch.tensor(offs[:-1]).repeat_interleave(torch.tensor(counts))
    idx = torch.stack([seq_ids, local], dim=1).to(torch.int32)
    return ChunkPlan(
        cu_seqlens=torch.tensor(cu, dtype=torch.int32).to(device),
        chunk_indices=idx.to(device),
        chunk_offsets=torch.tensor(offs, dtype=torch.int32).to(device),
        num_seqs=len(counts),
        num_chunks=offs[-1],
        max_chunks=max(counts),
        cu_host=tuple(cu),
        seq_order=torch.tensor(longest_first(counts), dtype=torch.int32).to(device),
    )


_varlen_cache: OrderedDict[int, tuple[weakref.ref, int, ChunkPlan]] = OrderedDict()
_fixed_cache: OrderedDict[tuple, ChunkPlan] = OrderedDict()


def _remember(cache: OrderedDict, key, value) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)


def plan_varlen(cu_seqlens: torch.Tensor, total_tokens: int) -> ChunkPlan:
    """Plan for B = 1 + cu_seqlens, cached per tensor object and its in-place version counter."""
    key = id(cu_seqlens)
    hit = _varlen_cache.get(key)
    if hit is not None and hit[0]() is cu_seqlens and hit[1] == cu_seqlens._version:
        _varlen_cache.move_to_end(key)
        return hit[2]
    cu = [int(x) for x in cu_seqlens.tolist()]  # the one host sync per new cu_seqlens
    check_cu_seqlens_values(cu, total_tokens)
    plan = build_plan_from_list(cu, cu_seqlens.device)
    _remember(_varlen_cache, key, (weakref.ref(cu_seqlens), cu_seqlens._version, plan))
    return plan


def plan_fixed(batch: int, seqlen: int, device: torch.device | str) -> ChunkPlan:
    """Plan for a fixed-length batch viewed as B*T packed tokens: no host sync (sizes are known)."""
    dev = torch.device(device)
    key = (batch, seqlen, dev.type, dev.index)
    hit = _fixed_cache.get(key)
    if hit is not None:
        _fixed_cache.move_to_end(key)
        return hit
    plan = build_plan_from_list([i * seqlen for i in range(batch + 1)], dev)
    _remember(_fixed_cache, key, plan)
    return plan


def choose_block_v(num_seqs: int, h_v: int, num_sms: int = 132) -> int:
    """V-slice width of the fused kernel. Measured on the H200 (NOTES.md, v2): with fewer CTAs than
    about 0.75 x #SM at BV = 64, splitting V once more (BV = 32) shortens the serial chunk walk more
    than it costs in repeated Q K^T / Gamma work; otherwise BV = 64 wins."""
    return 32 if num_seqs * h_v * 2 < 0.75 * num_sms else 64


BLOCK_V_CHOICES = (32, 64, 128)


def choose_block_v_ws(num_seqs: int, h_v: int, num_sms: int = 132) -> int:
    """V-slice width of the warp-specialised fused kernel (one CTA per SM). Measured on the H200 with
    rev 5 (NOTES.md, v5): the narrowest slice whose CTAs (one per sequence x head x slice) still fit in
    one wave wins, since the chunk walk is serial and a narrower slice shortens each step more than it
    costs in repeated Q K^T, Gamma and A0 work; with more pairs than SMs, BV = 128. It counts sequences, not
    their lengths: the forward runs cp_plan.best_block_v, which starts from this width and leaves it where
    the cost model prices another one faster for the actual lengths (ragged mixes, session 14)."""
    pairs = num_seqs * h_v
    for bv in (32, 64):
        if pairs * (HEAD_DIM // bv) <= num_sms:
            return bv
    return 128


# fused_fwd_ws7.py keeps S^T [BV, K] as a wgmma accumulator of one warpgroup, whose M is 64
WS7_BLOCK_V = 64
# CP's one-launch combine (fwd/cp_combine.py, whose docstring says what each revision does and measured): the
# default revision, V-slice width and threads. Here, not there, so the api resolves them without tilelang.
CP_COMBINE_REV = 2
CP_COMBINE_BLOCK_V = 32
CP_COMBINE_THREADS = 128

WS_IMPL = "ws12"


def choose_fused(num_seqs: int, h_v: int, num_sms: int = 132) -> tuple[str, int]:
    """(fused kernel, V-slice width) for `auto`. On the H200 the rev-5 warp-specialised kernel was the
    fastest of v2, ws (rev 4) and ws5 on all eight measured configs (NOTES.md, v5: 1.1-2.0x over the
    previous choice); rev 6 (ws6) is rev 5 with beta applied to W before its bf16 rounding, the same speed
    on those configs and a smaller error (NOTES.md, session 7), so `auto` runs ws6 and only picks its slice
    width. ws10 (rev 7: stage 1 hands over Gamma o A0 diag(beta), the state chain is one GEMM) is 1.04-1.05x
    ws6's speed over qwen35-fwd on the H200 with the same best widths, but its one-token final state was 1.16x
    FLA's error on one edge config (issue 4 bounds it at 1.1x). ws12 (rev 9: ws10 with a token's own beta
    unrounded on Agb's diagonal, the fix written under WG1's asynchronous GEMMs) is auto's kernel since
    session 13: on the H200 1.026x ws6's speed over qwen35-fwd (faster on 154 of 171 configs; ws10 is 1.023x
    faster still) with every edge config at or below 1.011x FLA's error (o) and 0.952x (final state), and
    the same best widths as ws6 and ws10. It has no A0: the autograd forward runs ws6 (api.A0_FALLBACK_IMPL)."""
    return WS_IMPL, choose_block_v_ws(num_seqs, h_v, num_sms)
