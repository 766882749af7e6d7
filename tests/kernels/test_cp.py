"""Context-parallel orchestration (gdn/cp.py) on the CPU: the pieces, the prep pass's [h | M], the combine
chain and the gather of final states must reproduce the whole-sequence forward exactly. The kernels are
replaced by float64 stand-ins built on the reference, so only the orchestration is under test; the
TileLang state pass is checked on the H200 (tests/gpu/test_qla_cp.py)."""

import pytest
import torch
import torch.nn.functional as F

from qla_bench.reference import chunk_gated_delta_rule_ref
from qla_kernels.gdn.cp import combine, run_cp
from qla_kernels.gdn.cp_plan import CPDecision, build_cp_plan

D = 16  # K = V: small, so float64 on a CPU stays fast; the orchestration does not depend on it


def inputs(total, h_qk, h_v, seed):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(1, total, h_qk, D, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(1, total, h_qk, D, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, total, h_v, D, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(1, total, h_v, generator=gen, dtype=torch.float64)) / 16
    g[..., 0] = 0.0  # a head that never decays: needs the exact transition
    if h_v > 2:
        g[..., 1] = -20.0  # one that forgets everything
    beta = torch.sigmoid(torch.randn(1, total, h_v, generator=gen, dtype=torch.float64))
    return q, k, v, g, beta


def stand_ins(q, k, v, g, beta):
    """The two kernels' contracts, in float64 on the reference."""

    def state_pass(cu_p):
        p, h_v = cu_p.numel() - 1, v.shape[2]
        _, h = chunk_gated_delta_rule_ref(q, k, v, g, beta, None, None, True, cu_p)
        eye = torch.eye(D, dtype=torch.float64).expand(p, h_v, D, D).contiguous()
        _, m = chunk_gated_delta_rule_ref(q, k, torch.zeros_like(v), g, beta, None, eye, True, cu_p)
        return torch.cat([h, m], dim=-1).float()

    def fused(cu_p, init):
        return chunk_gated_delta_rule_ref(q, k, v, g, beta, None, init.double(), True, cu_p)

    return state_pass, fused


CASES = [
    # (sequence lengths, h_qk, h_v, piece length in chunks, initial state)
    ([640], 1, 4, 2, True),
    ([640], 2, 4, 3, False),  # 10 chunks in pieces of 3: a short last piece
    ([700, 65, 1, 300], 1, 3, 2, True),  # ragged, a sequence shorter than a piece, T = 1
    ([64 * 7, 64 * 5 + 7], 2, 8, 1, True),  # one-chunk pieces: the longest combine chain
]


@pytest.mark.parametrize(("lens", "h_qk", "h_v", "piece", "with_h0"), CASES)
def test_cp_reproduces_the_whole_sequence_forward(lens, h_qk, h_v, piece, with_h0):
    total = sum(lens)
    q, k, v, g, beta = inputs(total, h_qk, h_v, seed=total + piece)
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]
    h0 = torch.randn(len(lens), h_v, D, D, dtype=torch.float64) if with_h0 else None
    cp = build_cp_plan(cu, CPDecision(piece_chunks=piece, block_v=64, predicted_us=0.0, baseline_us=0.0), "cpu")
    assert cp.enabled and cp.num_pieces > len(lens)
    state_pass, fused = stand_ins(q, k, v, g, beta)
    o, final = run_cp(cp, h0, state_pass, fused)
    ref_o, ref_s = chunk_gated_delta_rule_ref(q, k, v, g, beta, None, h0, True, torch.tensor(cu))
    # fp32 [h | M] and fp32 combine: errors at fp32 level, far below the kernels' bf16 error
    assert ((o - ref_o).norm() / ref_o.norm()).item() < 1e-5
    assert ((final.double() - ref_s).norm() / ref_s.norm()).item() < 1e-5


def test_links_follow_each_sequence_in_order():
    cp = build_cp_plan([0, 64 * 5, 64 * 6, 64 * 9], CPDecision(2, 64, 0.0, 0.0), "cpu")
    # pieces: seq 0 -> 0,1,2 (2+2+1 chunks); seq 1 -> 3; seq 2 -> 4,5 (2+1)
    assert cp.num_pieces == 6
    assert [t.tolist() for t in cp.links] == [[0, 4], [1]]
    assert cp.first_piece.tolist() == [0, 3, 4] and cp.last_piece.tolist() == [2, 3, 5]


def test_combine_chains_transitions():
    cp = build_cp_plan([0, 64 * 3], CPDecision(1, 64, 0.0, 0.0), "cpu")
    gen = torch.Generator().manual_seed(0)
    hm = torch.randn(3, 2, D, 2 * D, generator=gen)
    h0 = torch.randn(1, 2, D, D, generator=gen)
    init = combine(cp, hm, h0)
    h, m = hm[..., :D], hm[..., D:]
    s1 = m[0] @ h0[0] + h[0]
    assert torch.allclose(init[0], h0[0]) and torch.allclose(init[1], s1, atol=1e-5)
    assert torch.allclose(init[2], m[1] @ s1 + h[1], atol=1e-4)
    assert cp.host_links == (0, 1)


def test_combine_view_and_index_paths_agree():
    """The per-link view walk (short chains) and the index-tensor walk give the same states, ragged batches
    and a sequence that is not split included."""
    cp = build_cp_plan([0, 64 * 5, 64 * 6, 64 * 9 + 3], CPDecision(2, 64, 0.0, 0.0), "cpu")
    gen = torch.Generator().manual_seed(1)
    hm = torch.randn(cp.num_pieces, 3, D, 2 * D, generator=gen) / D  # fp32, as the state pass writes it
    h0 = torch.randn(3, 3, D, D, generator=gen)
    assert cp.host_links == (0, 4, 1)  # position-major: piece 1 is final before piece 2 reads it
    views = combine(cp, hm, h0)
    index = combine(cp, hm, h0, max_view_links=0)
    assert torch.allclose(views, index, rtol=1e-5, atol=1e-6)
    assert not torch.equal(views[2], torch.zeros_like(views[2]))  # a chained piece, really written


def test_combine_takes_an_initial_state_that_requires_grad():
    """The view walk writes with out=, which autograd refuses; combine runs without a graph (its output
    only feeds a kernel), so a caller's h0 that requires grad must not make it raise."""
    cp = build_cp_plan([0, 64 * 3], CPDecision(1, 64, 0.0, 0.0), "cpu")
    hm = torch.randn(3, 2, D, 2 * D) / D
    h0 = torch.randn(1, 2, D, D, requires_grad=True)
    init = combine(cp, hm, h0)
    assert not init.requires_grad and torch.allclose(init[0], h0[0].detach())


def test_combine_implementation_from_the_environment(monkeypatch):
    from qla_kernels.gdn.api import resolve_cp_combine

    monkeypatch.delenv("QLA_CP_COMBINE", raising=False)
    assert resolve_cp_combine() == "kernel"  # one launch: measured faster than the host walk (session 8)
    monkeypatch.setenv("QLA_CP_COMBINE", "views")
    assert resolve_cp_combine() == "views"
    monkeypatch.setenv("QLA_CP_COMBINE", "graph")
    with pytest.raises(ValueError, match=r"\$QLA_CP_COMBINE must be one of \['kernel', 'views'\]"):
        resolve_cp_combine()


def test_combine_rejects_k_not_v():
    cp = build_cp_plan([0, 128], CPDecision(1, 64, 0.0, 0.0), "cpu")
    with pytest.raises(ValueError, match="K == V"):
        combine(cp, torch.zeros(2, 1, 8, 32), None)


def test_cp_switch_and_forced_piece(monkeypatch):
    from qla_kernels.gdn.api import _cp_plan
    from qla_kernels.gdn.plan import build_plan_from_list, plan_fixed

    plan = build_plan_from_list([0, 32768], "cpu")
    monkeypatch.setenv("QLA_CP", "0")
    assert _cp_plan(plan, 8, 132, None, None) is None  # off when asked to be
    monkeypatch.setenv("QLA_CP", "yes")
    with pytest.raises(ValueError, match=r"\$QLA_CP must be '0' or '1'"):
        _cp_plan(plan, 8, 132, None, None)
    monkeypatch.delenv("QLA_CP", raising=False)
    assert _cp_plan(plan, 8, 132, None, None) is not None  # on by default
    forced = _cp_plan(plan, 8, 132, True, 64)
    assert forced is not None and forced.num_pieces == 8 and forced.decision.piece_chunks == 64
    monkeypatch.setenv("QLA_CP", "1")
    auto = _cp_plan(plan, 8, 132, None, None)  # 2/8 x 32768 tokens: the cost model splits it
    assert auto is not None and auto.num_pieces > 1
    assert _cp_plan(plan, 8, 132, False, None) is None  # the argument wins over the variable
    assert _cp_plan(build_plan_from_list([0, 100], "cpu"), 8, 132, True, 4) is None  # nothing to split
    assert _cp_plan(plan_fixed(2, 4096, "cpu"), 8, 132, True, 16).num_pieces == 8  # fixed-length batches too
    with pytest.raises(ValueError, match="cp_piece must be a positive"):
        _cp_plan(plan, 8, 132, True, 0)


def test_token_head_product_guard():
    """B*T*H_v >= 2**31 is refused before any launch (checked on meta tensors: nothing is allocated)."""
    from qla_kernels.gdn.api import chunk_gated_delta_rule_fwd

    t, h_qk, h_v = 2**25, 16, 64
    q = torch.empty(1, t, h_qk, 128, dtype=torch.bfloat16, device="meta")
    v = torch.empty(1, t, h_v, 128, dtype=torch.bfloat16, device="meta")
    g = torch.empty(1, t, h_v, dtype=torch.float32, device="meta")
    with pytest.raises(ValueError, match=r"B\*T\*H_v must be below 2\*\*31"):
        chunk_gated_delta_rule_fwd(q, q, v, g, g)


def test_forced_piece_plans_are_cached():
    """A forced piece length must not rebuild the plan (host-to-device copies) on every call."""
    from qla_kernels.gdn.api import _cp_plan
    from qla_kernels.gdn.plan import build_plan_from_list

    plan = build_plan_from_list([0, 8192], "cpu")
    first = _cp_plan(plan, 8, 132, True, 16)
    assert _cp_plan(plan, 8, 132, True, 16) is first
    assert _cp_plan(plan, 8, 132, True, 32) is not first and _cp_plan(plan, 8, 132, True, 32).num_pieces == 4


def test_transition_bound_behind_the_state_pass_skip():
    """The CP state pass writes a piece's transition M as zeros when its summed log gate is <= -30
    (fused_fwd_ws.SKIP_M_LOG_DECAY): exact to ~1e-13 because ||M||_2 <= exp(sum g) when every step
    I - beta k k^T is a contraction (unit-norm keys, beta in [0, 2]). Checked here in float64 on pieces with
    correlated keys, betas up to 2 and gates that do and do not decay."""
    gen = torch.Generator().manual_seed(3)
    t, h, d = 96, 3, 16
    k = F.normalize(torch.randn(1, t, 1, d, generator=gen) + 2.0 * torch.randn(1, 1, 1, d, generator=gen), dim=-1)
    beta = 2.0 * torch.rand(1, t, h, generator=gen)
    rates = (0.0, 0.05, 0.5)  # per-token decay up to: none (g = 0), weak, strong
    g = torch.stack([-r * torch.rand(t, generator=gen) for r in rates], -1)[None]
    eye = torch.eye(d, dtype=torch.float64).expand(1, h, d, d).contiguous()
    _, m = chunk_gated_delta_rule_ref(k, k, torch.zeros(1, t, h, d), g, beta, initial_state=eye)
    norms = torch.linalg.matrix_norm(m[0], ord=2)
    bounds = g[0].double().sum(0).exp()
    assert (norms <= bounds * (1 + 1e-9)).all(), (norms, bounds)
    assert bounds[0] == 1.0 and bounds[2] < 1e-10  # the bound spans no decay to a skipped piece


def test_walk_order_from_the_environment(monkeypatch):
    """Longest first by default (H100, session 15: 1.09-1.22x on the queueing mixes); QLA_LONGEST_FIRST=0 walks
    in input order, for timing the difference; anything else is refused by name."""
    from qla_kernels.gdn.api import _walk_order

    order = torch.tensor([2, 0, 1], dtype=torch.int32)
    monkeypatch.delenv("QLA_LONGEST_FIRST", raising=False)
    assert _walk_order(order) is order
    monkeypatch.setenv("QLA_LONGEST_FIRST", "0")
    walked = _walk_order(order)
    assert walked.tolist() == [0, 1, 2] and walked.dtype == torch.int32
    monkeypatch.setenv("QLA_LONGEST_FIRST", "yes")
    with pytest.raises(ValueError, match=r"\$QLA_LONGEST_FIRST must be '0' or '1'"):
        _walk_order(order)


def test_forced_piece_from_the_environment(monkeypatch):
    """QLA_CP_PIECE forces the forward's pieces (A/B runs of the cost model's choice): unset leaves the model's
    choice, a positive integer is taken, anything else is refused by name before a launch."""
    from qla_kernels.gdn.api import resolve_cp_piece

    monkeypatch.delenv("QLA_CP_PIECE", raising=False)
    assert resolve_cp_piece() is None
    monkeypatch.setenv("QLA_CP_PIECE", "32")
    assert resolve_cp_piece() == 32
    for bad in ("0", "-4", "16.5", "auto"):
        monkeypatch.setenv("QLA_CP_PIECE", bad)
        with pytest.raises(ValueError, match=r"\$QLA_CP_PIECE must be a positive number of 64-token chunks"):
            resolve_cp_piece()


@pytest.mark.parametrize("cu", [[0, 64 * 7 + 5], [0, 64 * 5, 64 * 6, 64 * 9 + 3]])
def test_final_states_are_each_sequences_last_piece(cu):
    cp = build_cp_plan(cu, CPDecision(2, 64, 0.0, 0.0), "cpu")
    piece_states = torch.randn(cp.num_pieces, 2, 3, 3)
    final = cp.final_states(piece_states)
    assert torch.equal(final, piece_states[cp.last_piece])
    if cp.num_seqs == 1:  # a view: no launch, no allocation
        assert final.data_ptr() == piece_states[cp.num_pieces - 1].data_ptr()
