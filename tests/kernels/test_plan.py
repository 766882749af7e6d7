"""Chunk plans: chunk counts, (sequence, chunk) indices, offsets, and the per-cu_seqlens cache."""

import torch

from qla_kernels.gdn.plan import build_plan_from_list, chunk_counts, longest_first, plan_fixed, plan_varlen


def test_chunk_counts_ragged():
    assert chunk_counts([1, 63, 64, 65, 128, 1000, 3096]) == [1, 1, 1, 2, 2, 16, 49]


def test_plan_indices_and_offsets():
    p = build_plan_from_list([0, 65, 66, 200], "cpu")
    assert p.num_seqs == 3 and p.num_chunks == 2 + 1 + 3 and p.max_chunks == 3
    assert p.chunk_indices.tolist() == [[0, 0], [0, 1], [1, 0], [2, 0], [2, 1], [2, 2]]
    assert p.chunk_offsets.tolist() == [0, 2, 3, 6]
    assert p.cu_seqlens.dtype == torch.int32 and p.chunk_indices.dtype == torch.int32


def test_seq_order_walks_the_longest_first():
    """The fused forward's grid walks seq_order[i] in its i-th group of blocks: longest first, ties in input
    order (a stable sort), so equal lengths keep the input order."""
    p = build_plan_from_list([0, 4096, 4096 + 28672, 4096 + 28672 + 1, 4096 + 28672 + 4097], "cpu")
    assert p.seq_order.tolist() == [1, 0, 3, 2] and p.seq_order.dtype == torch.int32
    assert plan_fixed(4, 8192, "cpu").seq_order.tolist() == [0, 1, 2, 3]
    assert longest_first([3, 5, 5, 1, 5]) == [1, 2, 4, 0, 3]


def test_plan_every_token_in_exactly_one_chunk():
    cu = [0, 1, 1000, 4096, 4161]
    p = build_plan_from_list(cu, "cpu")
    covered = []
    for s, c in p.chunk_indices.tolist():
        lo = cu[s] + 64 * c
        hi = min(lo + 64, cu[s + 1])
        assert lo < hi
        covered.extend(range(lo, hi))
    assert covered == list(range(cu[-1]))


def test_varlen_cache_by_identity_and_version():
    cu = torch.tensor([0, 100, 300])
    p1 = plan_varlen(cu, 300)
    assert plan_varlen(cu, 300) is p1
    same_values = torch.tensor([0, 100, 300])
    assert plan_varlen(same_values, 300) is not p1
    cu[1] = 50  # in-place edit bumps the version counter: re-plan
    p3 = plan_varlen(cu, 300)
    assert p3 is not p1 and p3.chunk_indices.tolist() == [[0, 0], [1, 0], [1, 1], [1, 2], [1, 3]]


def test_fixed_plan_matches_varlen_equivalent():
    p = plan_fixed(3, 130, "cpu")
    q = build_plan_from_list([0, 130, 260, 390], "cpu")
    assert torch.equal(p.chunk_indices, q.chunk_indices) and torch.equal(p.cu_seqlens, q.cu_seqlens)
    assert plan_fixed(3, 130, "cpu") is p


def test_choose_block_v():
    from qla_kernels.gdn.plan import choose_block_v

    assert choose_block_v(1, 8) == 32  # 2/8 x 1 sequence: 16 CTAs at BV=64
    assert choose_block_v(1, 32) == 32
    assert choose_block_v(1, 64) == 64  # 128 CTAs at BV=64 already fill the GPU
    assert choose_block_v(4, 32) == 64


def test_choose_fused_follows_the_h200_measurements():
    from qla_kernels.gdn.plan import choose_block_v_ws, choose_fused

    # the slice width is the narrowest that fits one wave of CTAs (the times are ws6's; ws10 and ws12 were
    # fastest at the same widths on the eight timed configs, session 13)
    assert choose_fused(1, 8) == ("ws12", 32)  # 2/8 x 1 long sequence: 32 CTAs (0.94 ms vs 1.10 at 64)
    assert choose_fused(1, 32) == ("ws12", 32)  # 16/32 x 1: 128 CTAs (1.30 vs 1.46)
    assert choose_fused(8, 8) == ("ws12", 64)  # 2/8 x 8: 64 pairs (0.084 vs 0.103 at 128, 0.106 at 32)
    assert choose_fused(1, 64) == ("ws12", 64)  # 16/64 x 1 (0.263 vs 0.325 / 0.345)
    assert choose_fused(4, 32) == ("ws12", 128)  # 128 pairs already fill the GPU (0.85 vs 0.97)
    assert choose_fused(8, 64) == ("ws12", 128)
    assert choose_fused(1, 64, num_sms=78) == ("ws12", 128)  # fewer SMs: 64 pairs already fill it
    assert [choose_block_v_ws(n, 8) for n in (1, 4, 5, 8, 9)] == [32, 32, 64, 64, 128]


def test_dstate_block_v_follows_the_h200_measurements():
    """Stage 1 rev3's V-slice (bwd_api.choose_block_v_dstate) on the configs measured on the H200
    (results/H200/logs/2026-12-03-s6/call5-bwd_block_v.json, stage 1 ms at 32 / 64), and the ragged mix
    the pair-count rule got wrong."""
    import itertools

    from qla_kernels.gdn.bwd_api import choose_block_v_dstate

    def pick(lens, h_v):
        return choose_block_v_dstate(build_plan_from_list([0, *itertools.accumulate(lens)], "cpu"), h_v, 132)

    assert pick([32768], 32) == 32  # 2.09 vs 3.24
    assert pick([16384, 16384], 32) == 64  # 2.09 vs 1.91
    assert pick([8192] * 4, 32) == 64  # 2.09 vs 1.91
    assert pick([16384, 16384], 16) == 32  # 1.04 vs 1.60
    assert pick([8192] * 4, 8) == 32  # 0.54 vs 0.81
    assert pick([31905, 863], 32) == 32  # qwen35-bwd 32k_2seq: one long chain decides
    assert choose_block_v_dstate(build_plan_from_list([0, 32768], "cpu"), 32, 64) == 64  # half the SMs
