"""GDN backward in chunk form, written with torch operations: the specification the TileLang backward
kernels implement (issue 6), and a correct backward on any device until they exist.

It consumes exactly what the forward keeps (chunk-local g_cumsum and the gate-free A0), and is laid out
the way the kernels will be:
1. a state pass recomputes S_c, the state at the start of every chunk;
2. a reverse pass walks the chunks backwards carrying dS (the gradient of the state after the chunk),
   dS_c = M_c^T dS_{c+1} + b_c, and produces each chunk's dq, dk, dv, dbeta and dg from (S_c, dS_{c+1});
   given every S_c and dS_{c+1}, the chunks are independent (the kernels' parallel part).

Per chunk (design/gdn.md): D = diag(e^g), gamma = g_last, D_r = diag(e^(gamma - g)), Gamma_ij =
e^(g_i - g_j) for i >= j, Ag = (Gamma o A0) diag(beta), P = scale Gamma o (Q K^T),
    W = V - D K S,  Vn = Ag W,  O = scale D Q S + P Vn,  S' = e^gamma S + K^T D_r Vn,
and A0 = (I + StrictLower(diag(beta) K K^T))^-1, so dA0 reaches K and beta through
dM = -A0^T dA0 A0^T. dg is the gradient of the raw log gate: the chunk-local gradient of g_cumsum,
reverse-cumsummed within the chunk. dq and dk are summed over each GVA group. Gradients of states and
gates are kept in fp32 or wider (compute_dtype), never rounded through bf16.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from .checks import check_cu_seqlens_values

CHUNK = 64


class BwdOutput(NamedTuple):
    """dq, dk [B,T,H_qk,K], dv [B,T,H_v,V] in q's dtype; dbeta, dg [B,T,H_v] and dh0 [N,H_v,K,V] (None
    without an initial state) in fp32."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dbeta: torch.Tensor
    dg: torch.Tensor
    dh0: torch.Tensor | None


def _spans(b: int, t: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(i * t, (i + 1) * t) for i in range(b)]
    if b != 1:
        raise ValueError(f"cu_seqlens needs B = 1 (sequences packed along T), got B = {b}")
    cu = [int(x) for x in cu_seqlens.tolist()]
    check_cu_seqlens_values(cu, t)
    return list(itertools.pairwise(cu))


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
    compute_dtype: torch.dtype = torch.float32,
) -> BwdOutput:
    """Gradients of <o, do> + <final_state, dht> for the GDN forward (FLA layout, states [N,H_v,K,V]).

    g_cumsum [B,T,H_v] and A [B,T,H_v,64] are the forward's outputs (chunk-local log-gate cumsum and A0).
    """
    b, t, h_qk, dk_ = q.shape
    h_v, dv_ = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (b, t) or do.shape != v.shape:
        raise ValueError(f"q, k [B,T,H_qk,K], v and do [B,T,H_v,V] must agree; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}, do {tuple(do.shape)}")
    if g_cumsum.shape != (b, t, h_v) or beta.shape != (b, t, h_v) or A.shape != (b, t, h_v, CHUNK):
        raise ValueError("g_cumsum and beta must be [B,T,H_v] and A [B,T,H_v,64] (the forward's outputs)")
    if h_v % h_qk:
        raise ValueError(f"h_v={h_v} must be a multiple of h_qk={h_qk}")
    spans = _spans(b, t, cu_seqlens)
    n = len(spans)
    for name, st in (("initial_state", initial_state), ("dht", dht)):
        if st is not None and st.shape != (n, h_v, dk_, dv_):
            raise ValueError(f"{name} must be [N={n},H_v,K,V], got {tuple(st.shape)}")
    r = h_v // h_qk
    scale = dk_**-0.5 if scale is None else float(scale)
    f = compute_dtype

    def flat(x):
        return x.reshape(b * t, *x.shape[2:]).to(f)

    qf, kf, vf, gf, bf, af, dof = (flat(x) for x in (q, k, v, g_cumsum, beta, A, do))
    dq = torch.zeros(b * t, h_v, dk_, dtype=f, device=q.device)
    dk = torch.zeros_like(dq)
    dv = torch.zeros(b * t, h_v, dv_, dtype=f, device=q.device)
    dbeta = torch.zeros(b * t, h_v, dtype=f, device=q.device)
    dg = torch.zeros_like(dbeta)
    dh0 = torch.zeros(n, h_v, dk_, dv_, dtype=f, device=q.device) if initial_state is not None else None

    for s, (lo, hi) in enumerate(spans):
        starts = list(range(lo, hi, CHUNK))
        # 1. states at every chunk start
        state = (initial_state[s].to(f) if initial_state is not None
                 else torch.zeros(h_v, dk_, dv_, dtype=f, device=q.device))
        states = []
        for c0 in starts:
            states.append(state)
            state = _chunk(qf, kf, vf, gf, bf, af, c0, min(c0 + CHUNK, hi), r, scale, state)[0]
        # 2. reverse pass
        ds = dht[s].to(f) if dht is not None else torch.zeros(h_v, dk_, dv_, dtype=f, device=q.device)
        for c0, s_c in zip(reversed(starts), reversed(states)):
            c1 = min(c0 + CHUNK, hi)
            grads = _chunk_bwd(qf, kf, vf, gf, bf, af, dof, c0, c1, r, scale, s_c, ds)
            ds = grads["ds"]
            dq[c0:c1] = grads["dq"]
            dk[c0:c1] = grads["dk"]
            dv[c0:c1] = grads["dv"]
            dbeta[c0:c1] = grads["dbeta"]
            dg[c0:c1] = grads["dg"]
        if dh0 is not None:
            dh0[s] = ds

    def group_sum(x):  # per value head -> per qk head (the GVA group shares q and k)
        return x.view(b * t, h_qk, r, dk_).sum(2)

    def wide(x):  # gate, beta and state gradients: fp32, or float64 when computed in float64
        return x if x is None or f == torch.float64 else x.float()

    return BwdOutput(
        dq=group_sum(dq).view(b, t, h_qk, dk_).to(q.dtype),
        dk=group_sum(dk).view(b, t, h_qk, dk_).to(q.dtype),
        dv=dv.view(b, t, h_v, dv_).to(v.dtype),
        dbeta=wide(dbeta.view(b, t, h_v)),
        dg=wide(dg.view(b, t, h_v)),
        dh0=wide(dh0),
    )


def _chunk_tensors(qf, kf, vf, gf, bf, af, c0, c1, r):
    """Head-major [H_v, n, .] views of one chunk (q, k expanded over the GVA group)."""
    n = c1 - c0
    qc = qf[c0:c1].repeat_interleave(r, dim=1).transpose(0, 1)
    kc = kf[c0:c1].repeat_interleave(r, dim=1).transpose(0, 1)
    vc = vf[c0:c1].transpose(0, 1)
    gc = gf[c0:c1].transpose(0, 1)
    bc = bf[c0:c1].transpose(0, 1)
    a0 = torch.tril(af[c0:c1, :, :n].transpose(0, 1))
    return qc, kc, vc, gc, bc, a0


def _gates(gc):
    n = gc.shape[-1]
    low = torch.ones(n, n, dtype=torch.bool, device=gc.device).tril()
    expo = torch.where(low, gc[:, :, None] - gc[:, None, :], torch.full_like(gc[:, :, None], -torch.inf))
    gam = gc[:, -1]
    return torch.exp(gc), torch.exp(gam[:, None] - gc), torch.exp(expo), torch.exp(gam), low


def _chunk(qf, kf, vf, gf, bf, af, c0, c1, r, scale, s):
    """Forward of one chunk: (S', and the intermediates the backward reuses)."""
    qc, kc, vc, gc, bc, a0 = _chunk_tensors(qf, kf, vf, gf, bf, af, c0, c1, r)
    d, dr, gm, egam, low = _gates(gc)
    ag = gm * a0 * bc[:, None, :]
    ks = kc @ s
    w = vc - d[:, :, None] * ks
    vn = ag @ w
    s_next = egam[:, None, None] * s + kc.transpose(1, 2) @ (dr[:, :, None] * vn)
    return s_next, (qc, kc, vc, gc, bc, a0, d, dr, gm, egam, low, ag, ks, w, vn)


def _chunk_bwd(qf, kf, vf, gf, bf, af, dof, c0, c1, r, scale, s, ds_next):
    """Gradients of one chunk given its start state s and the gradient ds_next of the state after it."""
    _, (qc, kc, _vc, _gc, bc, a0, d, dr, gm, egam, low, ag, ks, w, vn) = _chunk(
        qf, kf, vf, gf, bf, af, c0, c1, r, scale, s
    )
    doc = dof[c0:c1].transpose(0, 1)
    qk = qc @ kc.transpose(1, 2)
    p = scale * gm * qk
    qs = qc @ s
    kds = kc @ ds_next  # K dS' [H, n, V]

    dvn = p.transpose(1, 2) @ doc + dr[:, :, None] * kds
    dp = (doc @ vn.transpose(1, 2)) * low
    dqk = scale * gm * dp
    dq = scale * d[:, :, None] * (doc @ s.transpose(1, 2)) + dqk @ kc
    dkk = dqk.transpose(1, 2) @ qc
    dag = (dvn @ w.transpose(1, 2)) * low
    dw = ag.transpose(1, 2) @ dvn
    dkk = dkk - (d[:, :, None] * dw) @ s.transpose(1, 2) + dr[:, :, None] * (vn @ ds_next.transpose(1, 2))
    ds = (egam[:, None, None] * ds_next + scale * qc.transpose(1, 2) @ (d[:, :, None] * doc)
          - kc.transpose(1, 2) @ (d[:, :, None] * dw))

    # gates (gradient w.r.t. the chunk-local cumsum g)
    dgc = d * (scale * (doc * qs).sum(-1) - (dw * ks).sum(-1))
    dgam_mat = (dag * a0 * bc[:, None, :] + dp * scale * qk) * gm  # d/d(g_i - g_j) on i >= j
    dgc = dgc + dgam_mat.sum(-1) - dgam_mat.sum(-2)
    x = dr * (kds * vn).sum(-1)  # d/d(gamma - g_i)
    dgc = dgc - x
    dgam = x.sum(-1) + egam * (s * ds_next).sum((-1, -2))
    dgc[:, -1] = dgc[:, -1] + dgam

    # beta and the A0 = (I + StrictLower(diag(beta) K K^T))^-1 path
    dbeta = (dag * gm * a0).sum(-2)
    da0 = dag * gm * bc[:, None, :]
    dm = -a0.transpose(1, 2) @ da0 @ a0.transpose(1, 2)
    dl = torch.tril(dm, -1)
    kkt = kc @ kc.transpose(1, 2)
    dbeta = dbeta + (dl * kkt).sum(-1)
    dkkt = bc[:, :, None] * dl
    dkk = dkk + dkkt @ kc + dkkt.transpose(1, 2) @ kc

    dg_raw = torch.flip(torch.cumsum(torch.flip(dgc, [-1]), -1), [-1])
    return {
        "ds": ds,
        "dq": dq.transpose(0, 1),
        "dk": dkk.transpose(0, 1),
        "dv": dw.transpose(0, 1),
        "dbeta": dbeta.transpose(0, 1),
        "dg": dg_raw.transpose(0, 1),
    }


def dstate_chain(
    q: torch.Tensor,
    k: torch.Tensor,
    g_cumsum: torch.Tensor,
    beta: torch.Tensor,
    A: torch.Tensor,
    do: torch.Tensor,
    dht: torch.Tensor | None,
    scale: float,
    cu_seqlens: list[int],
    compute_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 1 of the backward alone (the specification of gdn/bwd/dstate_chain.py): B = 1 packed inputs
    -> (dS' of every chunk [num_chunks,H_v,K,V], dv [T,H_v,V], dh0 [N,H_v,K,V]). The chain never reads
    the forward's states or v, so the per-chunk step runs with S = 0 and V = 0."""
    f = compute_dtype
    h_qk, h_v, dk_, dv_ = q.shape[2], g_cumsum.shape[2], q.shape[3], do.shape[3]
    qf, kf, gf, bf, af, dof = (x[0].to(f) for x in (q, k, g_cumsum, beta, A, do))
    zeros_v = torch.zeros(q.shape[1], h_v, dv_, dtype=f, device=q.device)
    s0 = torch.zeros(h_v, dk_, dv_, dtype=f, device=q.device)
    ds_next: list[torch.Tensor] = []
    dh0: list[torch.Tensor] = []
    dv = torch.zeros_like(zeros_v)
    for s, (lo, hi) in enumerate(itertools.pairwise(cu_seqlens)):
        ds = dht[s].to(f) if dht is not None else torch.zeros_like(s0)
        per_seq = []
        for c0 in reversed(range(lo, hi, CHUNK)):
            per_seq.append(ds)
            c1 = min(c0 + CHUNK, hi)
            out = _chunk_bwd(qf, kf, zeros_v, gf, bf, af, dof, c0, c1, h_v // h_qk, scale, s0, ds)
            ds = out["ds"]
            dv[c0:c1] = out["dv"]
        ds_next += reversed(per_seq)
        dh0.append(ds)
    return torch.stack(ds_next), dv, torch.stack(dh0)


def stage1_reference(
    k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, spans: list[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's stage 1 in float64, for tests and stand-ins: the chunk-local cumsum of g and the
    gate-free A0 = (I + StrictLower(diag(beta) K K^T))^-1 rows, per chunk of every span of the
    flattened [B*T] tokens; returned in g's shape and [*g.shape, 64]."""
    kf = k.reshape(-1, *k.shape[2:]).double()
    gf, bf = g.reshape(-1, g.shape[-1]).double(), beta.reshape(-1, beta.shape[-1]).double()
    h_v = gf.shape[1]
    r = h_v // kf.shape[1]
    gc = torch.zeros_like(gf)
    a0 = torch.zeros(gf.shape[0], h_v, CHUNK, dtype=torch.float64, device=g.device)
    for s, e in spans:
        for c0 in range(s, e, CHUNK):
            c1 = min(c0 + CHUNK, e)
            n = c1 - c0
            gc[c0:c1] = torch.cumsum(gf[c0:c1], 0)
            kc = kf[c0:c1].repeat_interleave(r, 1).transpose(0, 1)
            m = torch.eye(n, dtype=torch.float64, device=g.device) + torch.tril(
                bf[c0:c1].T[:, :, None] * (kc @ kc.transpose(1, 2)), -1
            )
            a0[c0:c1, :, :n] = torch.linalg.inv(m).transpose(0, 1)
    return gc.view(g.shape), a0.view(*g.shape, CHUNK)
