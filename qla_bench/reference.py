"""Float64 reference for GDN (gated delta rule) prefill: what every backend is judged by.

Imports nothing of backends or kernels. Layout is FLA's: q, k [B,T,H_qk,K]; v [B,T,H_v,V];
g (log gate), beta [B,T,H_v]; state [N,H_v,K,V]; B = 1 when cu_seqlens is given. Value head i reads
qk head i // (H_v / H_qk). Two forms that must agree to ~1e-12: the naive token recurrence (simplest
to trust) and a chunked form (C = 64, the gate-free A0 reformulation of design/gdn.md) that is fast
enough for 32K-token sequences and differentiable for the gradient reference.
"""

from __future__ import annotations

import itertools

import torch

CHUNK = 64


def _check_and_split(q, k, v, g, beta, initial_state, cu_seqlens):
    """Validate shapes and return [(start, end)] per sequence plus the flattened (T_total, H, D) views."""
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4:
        raise ValueError(f"q, k must be [B,T,H_qk,K] and v [B,T,H_v,V]; got {tuple(q.shape)}, {tuple(v.shape)}")
    b, t, h_qk, _ = q.shape
    h_v = v.shape[2]
    if v.shape[:2] != (b, t) or g.shape != (b, t, h_v) or beta.shape != (b, t, h_v):
        raise ValueError("v [B,T,H_v,V], g and beta [B,T,H_v] must match q's B and T")
    if h_v % h_qk:
        raise ValueError(f"h_v={h_v} must be a multiple of h_qk={h_qk}")
    if cu_seqlens is not None:
        if b != 1:
            raise ValueError(f"cu_seqlens needs B = 1, got B = {b}")
        cu = [int(x) for x in cu_seqlens.tolist()]
        if cu[0] != 0 or cu[-1] != t or any(y <= x for x, y in itertools.pairwise(cu)):
            raise ValueError(f"cu_seqlens must rise strictly from 0 to T={t}, got {cu}")
        spans = list(itertools.pairwise(cu))
    else:
        spans = [(i * t, (i + 1) * t) for i in range(b)]
    n = len(spans)
    if initial_state is not None and initial_state.shape != (n, h_v, q.shape[-1], v.shape[-1]):
        raise ValueError(f"initial_state must be [N={n},H_v,K,V], got {tuple(initial_state.shape)}")
    return spans, h_v // h_qk


def _as64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[B,T,...] -> [B*T,...] (sequences of fixed-length batches become consecutive spans)."""
    return x.reshape(-1, *x.shape[2:])


def recurrent_gated_delta_rule_ref(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True, cu_seqlens=None
):
    """Token-by-token float64 recurrence. Slow (T python steps) but transparently the definition."""
    spans, r = _check_and_split(q, k, v, g, beta, initial_state, cu_seqlens)
    kdim, vdim = q.shape[-1], v.shape[-1]
    scale = kdim**-0.5 if scale is None else scale
    qf, kf = (_flat(_as64(x)).repeat_interleave(r, dim=1) for x in (q, k))
    vf, gf, bf = (_flat(_as64(x)) for x in (v, g, beta))
    h_v = vf.shape[1]
    o = torch.empty_like(vf)
    finals = []
    for n, (s, e) in enumerate(spans):
        state = (
            _as64(initial_state[n]).clone()
            if initial_state is not None
            else torch.zeros(h_v, kdim, vdim, dtype=torch.float64, device=q.device)
        )
        for t in range(s, e):
            state = state * torch.exp(gf[t])[:, None, None]
            kt = kf[t]  # [H,K]
            pred = torch.einsum("hkv,hk->hv", state, kt)
            delta = bf[t][:, None] * (vf[t] - pred)
            state = state + kt[:, :, None] * delta[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", state, qf[t])
        finals.append(state)
    o = o.reshape(v.shape[0], v.shape[1], h_v, vdim)
    return o, (torch.stack(finals) if output_final_state else None)


def _chunked_sequence(qs, ks, vs, gs, bs, state, scale):
    """One sequence, all value heads at once. qs, ks [T,H,K] (already expanded for GVA), vs [T,H,V],
    gs, bs [T,H], state [H,K,V]. Returns (o [T,H,V], final state). Differentiable."""
    t_len = qs.shape[0]
    outs = []
    for c0 in range(0, t_len, CHUNK):
        c1 = min(c0 + CHUNK, t_len)
        qc, kc, vc = (x[c0:c1].transpose(0, 1) for x in (qs, ks, vs))  # [H,C,D]
        gc = torch.cumsum(gs[c0:c1].transpose(0, 1), dim=-1)  # [H,C] chunk-local cumsum
        bc = bs[c0:c1].transpose(0, 1)
        c = c1 - c0
        eye = torch.eye(c, dtype=qs.dtype, device=qs.device)
        strict = torch.tril(torch.ones(c, c, dtype=torch.bool, device=qs.device), -1)
        lower = torch.tril(torch.ones(c, c, dtype=torch.bool, device=qs.device))
        kkt = bc[:, :, None] * (kc @ kc.transpose(-1, -2))
        a0 = torch.linalg.solve_triangular(
            eye + torch.where(strict, kkt, torch.zeros_like(kkt)),
            eye.expand_as(kkt),
            upper=False,
            unitriangular=True,
        )
        diff = gc[:, :, None] - gc[:, None, :]
        gamma_mat = torch.where(lower, torch.exp(torch.where(lower, diff, torch.zeros_like(diff))), 0.0)
        ag = gamma_mat * a0 * bc[:, None, :]
        d = torch.exp(gc)[:, :, None]
        w = vc - d * (kc @ state)
        vnew = ag @ w
        oc = scale * (d * (qc @ state) + (gamma_mat * (qc @ kc.transpose(-1, -2))) @ vnew)
        gamma = gc[:, -1]
        d_r = torch.exp(gamma[:, None] - gc)[:, :, None]
        state = torch.exp(gamma)[:, None, None] * state + kc.transpose(-1, -2) @ (d_r * vnew)
        outs.append(oc.transpose(0, 1))
    return torch.cat(outs, dim=0), state


def chunk_gated_delta_rule_ref(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True, cu_seqlens=None, form="chunked"
):
    """Float64 GDN forward. Returns (o [B,T,H_v,V] float64, final_state [N,H_v,K,V] float64 or None).

    form='chunked' (default) or 'recurrent'. Any device; any K and V; GVA; varlen via cu_seqlens.
    """
    if form == "recurrent":
        return recurrent_gated_delta_rule_ref(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens)
    if form != "chunked":
        raise ValueError(f"form must be 'chunked' or 'recurrent', got {form!r}")
    spans, r = _check_and_split(q, k, v, g, beta, initial_state, cu_seqlens)
    kdim, vdim = q.shape[-1], v.shape[-1]
    scale = kdim**-0.5 if scale is None else scale
    qf, kf = (_flat(_as64(x)).repeat_interleave(r, dim=1) for x in (q, k))
    vf, gf, bf = (_flat(_as64(x)) for x in (v, g, beta))
    h_v = vf.shape[1]
    outs, finals = [], []
    for n, (s, e) in enumerate(spans):
        state = (
            _as64(initial_state[n])
            if initial_state is not None
            else torch.zeros(h_v, kdim, vdim, dtype=torch.float64, device=q.device)
        )
        o_seq, state = _chunked_sequence(qf[s:e], kf[s:e], vf[s:e], gf[s:e], bf[s:e], state, scale)
        outs.append(o_seq)
        finals.append(state)
    o = torch.cat(outs, dim=0).reshape(v.shape[0], v.shape[1], h_v, vdim)
    return o, (torch.stack(finals) if output_final_state else None)


def chunk_gated_delta_rule_ref_grads(
    q, k, v, g, beta, do, dht=None, scale=None, initial_state=None, cu_seqlens=None, form="chunked"
) -> dict[str, torch.Tensor]:
    """Float64 gradients through autograd of the reference: dq, dk, dv, dg (of the log gate), dbeta, dh0.

    The loss is <o, do> + <final_state, dht>; dq/dk come out summed over each GVA group because the
    forward expands q/k with repeat_interleave. dh0 is returned only when initial_state is given.
    """
    leaves = {
        n: _as64(x).detach().requires_grad_(True) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))
    }
    h0 = _as64(initial_state).detach().requires_grad_(True) if initial_state is not None else None
    with torch.enable_grad():
        o, ht = chunk_gated_delta_rule_ref(
            leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], scale, h0, True, cu_seqlens, form
        )
        loss = (o * _as64(do)).sum()
        if dht is not None:
            loss = loss + (ht * _as64(dht)).sum()
        inputs = [*leaves.values()] + ([h0] if h0 is not None else [])
        grads = torch.autograd.grad(loss, inputs)
    names = ["dq", "dk", "dv", "dg", "dbeta"] + (["dh0"] if h0 is not None else [])
    return dict(zip(names, (x.detach() for x in grads)))
