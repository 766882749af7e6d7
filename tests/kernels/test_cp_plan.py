"""Context-parallel planning (CPU): the split, the cost-model decision, FlashQLA's rule, caching."""

import dataclasses

import pytest
import torch

from qla_kernels.gdn.cp_plan import (
    DEFAULT_HEURISTICS,
    CPDecision,
    CPHeuristics,
    build_cp_plan,
    choose_cp,
    flashqla_rule,
    makespan,
    plan_cp,
    predict_us,
    split_counts,
)
from qla_kernels.gdn.plan import build_plan_from_list, plan_fixed, plan_varlen


def test_makespan_list_scheduling():
    assert makespan([], 4) == 0.0
    assert makespan([(10.0, 4)], 4) == 10.0
    assert makespan([(10.0, 5)], 4) == 20.0
    assert makespan([(10.0, 1), (4.0, 3)], 2) == 12.0  # longest first: 10 | 4+4+4
    with pytest.raises(ValueError):
        makespan([(1.0, 1)], 0)


def test_split_counts():
    assert split_counts(10, None) == [10]
    assert split_counts(10, 16) == [10]
    assert split_counts(64, 16) == [16] * 4
    assert split_counts(70, 16) == [16] * 4 + [6]


def test_baseline_reproduces_ws6_measurements():
    """No-CP predictions against the ws6 fused times the defaults were fitted to (whole forward less kkt,
    NOTES.md session 7), at the width the api picks."""
    t, bv = predict_us([512], 8, 132, None)
    assert bv == 32 and abs(t - 813) / 813 < 0.03  # 2/8 1x32768: 0.893 - 0.080 ms
    t, bv = predict_us([512], 32, 132, None)
    assert bv == 32 and abs(t - 829) / 829 < 0.03  # 16/32 1x32768: 1.192 - 0.363 ms
    t, bv = predict_us([128] * 4, 32, 132, None)
    assert bv == 128 and abs(t - 395) / 395 < 0.05  # 16/32 8192x4: 0.758 - 0.363 ms


def test_cp_predictions_reproduce_the_kernel_combine_measurements():
    """CP forward less kkt, measured on the H200 with the one-kernel combine (profile_cp, NOTES.md session 8),
    against the model at the same piece lengths: within 13 %, and the measured best piece is the model's."""
    measured = {  # (h_v, chunks per sequence, piece) -> ms
        (8, (512,), 16): 0.780 - 0.090, (8, (512,), 32): 0.582 - 0.090, (8, (512,), 64): 0.504 - 0.090,
        (8, (512,), 128): 0.587 - 0.090, (16, (512,), 32): 0.913 - 0.162, (16, (512,), 64): 0.836 - 0.162,
        (8, (64, 448), 64): 0.467 - 0.099,
    }  # fmt: skip
    for (h_v, chunks, piece), ms in measured.items():
        t, _ = predict_us(list(chunks), h_v, 132, piece)
        assert abs(t - 1000 * ms) / (1000 * ms) < 0.13, (h_v, chunks, piece, t, ms)
    assert choose_cp([512], 8, 132).piece_chunks == 64 and choose_cp([512], 16, 132).piece_chunks == 64


def test_decisions_on_the_notes_configs():
    one_long_few_heads = choose_cp([512], 8, 132)  # 2/8 1x32768: 16 CTAs without CP
    assert one_long_few_heads.piece_chunks is not None
    assert one_long_few_heads.predicted_us < 0.6 * one_long_few_heads.baseline_us
    assert choose_cp([64], 64, 132).piece_chunks is None  # 16/64 1x4096: 128 CTAs already
    assert choose_cp([128] * 4, 32, 132).piece_chunks is None  # 16/32 8192x4: 256 CTAs
    assert choose_cp([16] * 8, 8, 132).piece_chunks is None  # short sequences: nothing to split


def test_heuristics_are_data():
    h = DEFAULT_HEURISTICS
    assert hash(h) == hash(CPHeuristics())  # hashable: part of the cache key
    never = dataclasses.replace(h, margin=0.99)
    assert choose_cp([512], 8, 132, never).piece_chunks is None
    cheap_warmup = dataclasses.replace(h, assumed_warmup_chunks=2)
    d_cheap, d_exact = choose_cp([512], 32, 132, cheap_warmup), choose_cp([512], 32, 132, h)
    assert d_cheap.predicted_us < d_exact.predicted_us
    assert h.piece_candidates(512) == [4, 8, 16, 32, 64, 128, 256]
    assert h.piece_candidates(4) == []
    with pytest.raises(ValueError):
        choose_cp([], 8, 132)
    with pytest.raises(ValueError):
        choose_cp([4], 0, 132)


def test_flashqla_rule_as_published():
    assert flashqla_rule([512], 8, 132) == (True, 16)  # 3 sqrt(8*512/132) = 16.7 -> 2^4
    enabled, piece = flashqla_rule([128] * 4, 32, 132)
    assert not enabled and piece == 32
    assert flashqla_rule([2], 8, 132)[1] == 4  # floor of 4 chunks


def _pieces(cp):
    cu = cp.cu_seqlens.tolist()
    return list(zip(cu[:-1], cu[1:], cp.piece_seq.tolist(), cp.piece_index.tolist(), strict=True))


def test_pieces_cover_every_token_once_and_align_to_chunks():
    cu = [0, 1, 1000, 1000 + 64 * 40 + 5, 1000 + 64 * 40 + 5 + 64 * 16]
    decision = CPDecision(piece_chunks=16, block_v=64, predicted_us=0.0, baseline_us=0.0)
    cp = build_cp_plan(cu, decision, "cpu")
    assert cp.enabled and cp.num_seqs == 4
    pieces = _pieces(cp)
    covered = [t for a, b, _, _ in pieces for t in range(a, b)]
    assert covered == list(range(cu[-1]))
    for a, b, s, i in pieces:
        assert (a - cu[s]) % 64 == 0 and (a - cu[s]) == i * 16 * 64  # chunk-aligned, in order
        assert b - a <= 16 * 64
    # 1 token | 999 tokens = 16 chunks (one piece) | 41 chunks -> 16 + 16 + 9 | exactly 16 chunks
    assert [sum(1 for p in pieces if p[2] == s) for s in range(4)] == [1, 1, 3, 1]
    assert cp.seq_first_piece.tolist() == [0, 1, 2, 5, 6]
    assert cp.max_piece_chunks == 16 and cp.num_pieces == 6
    assert cp.cu_seqlens.dtype == torch.int32 and cp.piece_seq.dtype == torch.int32


def test_no_cp_keeps_the_sequences():
    cu = [0, 100, 300]
    cp = build_cp_plan(cu, CPDecision(None, 64, 1.0, 1.0), "cpu")
    assert not cp.enabled and cp.cu_seqlens.tolist() == cu and cp.piece_index.tolist() == [0, 0]


def test_plan_cp_is_cached_per_chunk_plan_without_resync():
    cu = torch.tensor([0, 32768], dtype=torch.int32)
    chunk_plan = plan_varlen(cu, 32768)
    assert chunk_plan.cu_host == (0, 32768)
    a = plan_cp(chunk_plan, 8, 132)
    assert plan_cp(chunk_plan, 8, 132) is a  # same object: nothing rebuilt, no sync
    assert plan_cp(chunk_plan, 64, 132) is not a  # head count is part of the key
    assert a.enabled and a.num_pieces == 512 // a.decision.piece_chunks
    fixed = plan_fixed(1, 32768, "cpu")  # fixed-length: no cu_seqlens tensor, no sync at all
    assert plan_cp(fixed, 8, 132).decision == a.decision


def test_plan_cp_needs_host_offsets():
    plan = dataclasses.replace(build_plan_from_list([0, 10], "cpu"), cu_host=())
    with pytest.raises(ValueError, match="host offsets"):
        plan_cp(plan, 8, 132)
