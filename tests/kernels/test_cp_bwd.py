"""The backward's context parallelism (gdn/cp_bwd.py) on the CPU: the states at every chunk start and the
reverse chain of state gradients, run over pieces, must reproduce the whole-sequence stages 0 and 1. The
kernels are float64 stand-ins (the reference forward for the state pass, bwd_chunked's chunk step and
dstate_chain for the walks), so only the orchestration is under test."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from qla_bench.reference import chunk_gated_delta_rule_ref
from qla_kernels.gdn.bwd_chunked import _chunk, dstate_chain, stage1_reference
from qla_kernels.gdn.cp_bwd import dstate_cp, states_cp
from qla_kernels.gdn.cp_plan import CPDecision, build_cp_plan
from qla_kernels.gdn.plan import CHUNK

D = 16  # K = V, small: float64 on a CPU stays fast


def inputs(total, h_qk, h_v, seed):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(1, total, h_qk, D, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(1, total, h_qk, D, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, total, h_v, D, generator=gen, dtype=torch.float64)
    do = torch.randn(1, total, h_v, D, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(1, total, h_v, generator=gen, dtype=torch.float64)) / 16
    g[..., 0] = 0.0  # never decays: the pieces need the exact transition
    if h_v > 2:
        g[..., 1] = -20.0  # forgets everything within a token
    beta = torch.sigmoid(torch.randn(1, total, h_v, generator=gen, dtype=torch.float64))
    return q, k, v, do, g, beta


def states_walk(q, k, v, gc, beta, a0, cu, init, scale):
    """Every chunk's start state, walking each span of cu from init (float64, bwd_chunked's chunk step)."""
    r = v.shape[2] // q.shape[2]
    flat = [x[0] for x in (q, k, v, gc, beta, a0)]
    out = []
    for s, (lo, hi) in enumerate(itertools.pairwise(cu)):
        state = init[s].double()
        for c0 in range(lo, hi, CHUNK):
            out.append(state)
            state = _chunk(*flat, c0, min(c0 + CHUNK, hi), r, scale, state)[0]
    return torch.stack(out)


CASES = [
    # (sequence lengths, h_qk, h_v, piece length in chunks, initial state and dht)
    ([640], 1, 4, 2, True),
    ([640], 2, 4, 3, False),  # 10 chunks in pieces of 3: a short last piece
    ([700, 65, 1, 300], 1, 3, 2, True),  # ragged, a sequence shorter than a piece, T = 1
    ([64 * 7, 64 * 5 + 7], 2, 8, 1, True),  # one-chunk pieces: the longest chains
]


@pytest.mark.parametrize(("lens", "h_qk", "h_v", "piece", "with_states"), CASES)
def test_cp_reproduces_the_whole_sequence_stages(lens, h_qk, h_v, piece, with_states):
    total = sum(lens)
    q, k, v, do, g, beta = inputs(total, h_qk, h_v, seed=total + piece)
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]
    n, scale = len(lens), D**-0.5
    gen = torch.Generator().manual_seed(piece)
    h0 = torch.randn(n, h_v, D, D, generator=gen, dtype=torch.float64) if with_states else None
    dht = torch.randn(n, h_v, D, D, generator=gen, dtype=torch.float64) if with_states else None
    gc, a0 = stage1_reference(k, g, beta, list(itertools.pairwise(cu)))
    cp = build_cp_plan(cu, CPDecision(piece_chunks=piece, block_v=64, predicted_us=0.0, baseline_us=0.0), "cpu")
    assert cp.enabled and cp.num_pieces > n
    cu_p = cp.cu_seqlens.tolist()
    assert cp.chunk_offsets.tolist() == [
        0,
        *itertools.accumulate(-(-(b - a) // CHUNK) for a, b in itertools.pairwise(cu_p)),
    ]

    # stage 0
    def state_pass(cu_t):
        p = cu_t.numel() - 1
        _, h = chunk_gated_delta_rule_ref(q, k, v, g, beta, None, None, True, cu_t)
        eye = torch.eye(D, dtype=torch.float64).expand(p, h_v, D, D).contiguous()
        _, m = chunk_gated_delta_rule_ref(q, k, torch.zeros_like(v), g, beta, None, eye, True, cu_t)
        return torch.cat([h, m], dim=-1).float()

    walked = {}

    def walk(cu_t, init):
        walked["states"] = states_walk(q, k, v, gc, beta, a0, cu_t.tolist(), init, scale)

    hm = states_cp(cp, h0, state_pass, walk)
    zeros = torch.zeros(n, h_v, D, D, dtype=torch.float64)
    ref_states = states_walk(q, k, v, gc, beta, a0, cu, h0 if h0 is not None else zeros, scale)
    err = (walked["states"] - ref_states).norm() / ref_states.norm()
    assert err.item() < 1e-5  # the fp32 [h | M] and combine: fp32-level error

    # stage 1
    def chain(ends):
        ds_next, _, starts = dstate_chain(q, k, gc, beta, a0, do, ends, scale, cu_p)
        return ds_next, starts.float()  # fp32, like the kernel's

    ds_next, dh0 = dstate_cp(cp, hm, dht.float() if dht is not None else None, chain)
    ref_ds, _, ref_dh0 = dstate_chain(q, k, gc, beta, a0, do, dht, scale, cu)
    assert ((ds_next - ref_ds).norm() / ref_ds.norm()).item() < 1e-5
    assert ((dh0 - ref_dh0).norm() / ref_dh0.norm()).item() < 1e-5


def test_a_wrong_transition_fails():
    """The combine must use M^T: with M itself the g = 0 head's gradients come out wrong."""
    h_v = 4
    q, k, v, do, g, beta = inputs(640, 1, h_v, seed=3)
    cu = [0, 640]
    gc, a0 = stage1_reference(k, g, beta, [(0, 640)])
    cp = build_cp_plan(cu, CPDecision(2, 64, 0.0, 0.0), "cpu")
    cu_t = cp.cu_seqlens
    eye = torch.eye(D, dtype=torch.float64).expand(cp.num_pieces, h_v, D, D).contiguous()
    _, m = chunk_gated_delta_rule_ref(q, k, torch.zeros_like(v), g, beta, None, eye, True, cu_t)
    hm_wrong = torch.cat([m, m.transpose(-1, -2)], dim=-1).float()  # dstate_cp transposes: M^T^T = M

    def chain(ends):
        ds_next, _, starts = dstate_chain(q, k, gc, beta, a0, do, ends, D**-0.5, cu_t.tolist())
        return ds_next, starts.float()

    ds_next, _ = dstate_cp(cp, hm_wrong, None, chain)
    ref_ds, _, _ = dstate_chain(q, k, gc, beta, a0, do, None, D**-0.5, cu)
    head0 = (ds_next[:, 0] - ref_ds[:, 0]).norm() / ref_ds[:, 0].norm()
    assert head0.item() > 1e-3


def test_reverse_order_reverses_each_sequence_in_place():
    cp = build_cp_plan([0, 64 * 5, 64 * 6, 64 * 9], CPDecision(2, 64, 0.0, 0.0), "cpu")
    # pieces: seq 0 -> 0,1,2; seq 1 -> 3; seq 2 -> 4,5
    assert cp.reverse_order.tolist() == [2, 1, 0, 3, 5, 4]
    assert cp.chunk_offsets.tolist() == [0, 2, 4, 5, 6, 8, 9]


def test_no_pieces_is_refused():
    cp = build_cp_plan([0, 64 * 3], CPDecision(None, 64, 0.0, 0.0), "cpu")
    with pytest.raises(ValueError, match="CP plan with pieces"):
        dstate_cp(cp, torch.zeros(1, 1, D, 2 * D), None, lambda ends: (None, None))
