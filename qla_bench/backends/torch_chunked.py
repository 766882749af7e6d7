"""`torch`: a plain PyTorch chunked GDN (fp32 math on the bf16 inputs), for any device.

An implementation independent of the float64 reference's code path: FLA's structure (all chunks'
WY matrices at once, then one sequential state pass batched over sequences), so the harness has a
backend that runs on the CPU, and a portable GPU baseline. Backward and train go through autograd.
"""

from __future__ import annotations

import itertools

import torch

from ..workload import Workload
from . import register
from .base import Backend, GDNInputs, Prepared

CHUNK = 64


def _chunk_table(cu: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Token index [Nc, 64] and valid mask per chunk, first chunk id and chunk count per sequence."""
    starts, lens, first, count = [], [], [], []
    for s, e in itertools.pairwise(cu):
        first.append(len(starts))
        for c0 in range(s, e, CHUNK):
            starts.append(c0)
            lens.append(min(CHUNK, e - c0))
        count.append(len(starts) - first[-1])
    pos = torch.arange(CHUNK)
    starts_t, lens_t = torch.tensor(starts), torch.tensor(lens)
    valid = pos[None, :] < lens_t[:, None]
    idx = torch.where(valid, starts_t[:, None] + pos[None, :], 0)
    return idx, valid, first, count


def chunk_gdn_fp32(q, k, v, g, beta, scale, h0, cu_seqlens):
    """GDN forward in fp32. Returns (o [1,T,H_v,V] fp32, final state [N,H_v,K,V] fp32). Differentiable."""
    dev = q.device
    cu = [int(x) for x in cu_seqlens.tolist()]
    idx, valid, first, count = _chunk_table(cu)
    idx, valid = idx.to(dev), valid.to(dev)
    r = v.shape[2] // q.shape[2]
    m = valid[:, None, :].float()  # [Nc,1,C]

    def chunks(x: torch.Tensor, rep: int = 1) -> torch.Tensor:
        x = x[0].float()[idx]  # [Nc,C,H,...]
        if rep > 1:
            x = x.repeat_interleave(rep, dim=2)
        return x.transpose(1, 2)  # [Nc,H,C,...]

    qc, kc = chunks(q, r) * m[..., None], chunks(k, r) * m[..., None]
    vc = chunks(v) * m[..., None]
    gc = torch.cumsum(chunks(g) * m, dim=-1)  # [Nc,H,C]
    bc = chunks(beta) * m
    lower = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=dev))
    strict = torch.tril(lower, -1)
    eye = torch.eye(CHUNK, device=dev)
    kkt = kc @ kc.transpose(-1, -2)
    lhs = eye + torch.where(strict, bc[..., :, None] * kkt, torch.zeros_like(kkt))
    a0 = torch.linalg.solve_triangular(lhs, eye.expand_as(lhs), upper=False, unitriangular=True)
    diff = gc[..., :, None] - gc[..., None, :]
    gamma_mat = torch.where(lower, torch.exp(torch.where(lower, diff, torch.zeros_like(diff))), 0.0)
    ag = gamma_mat * a0 * bc[..., None, :]
    d = torch.exp(gc)[..., None]
    u = ag @ vc  # FLA's u
    wk = ag @ (d * kc)  # FLA's w
    qk_masked = gamma_mat * (qc @ kc.transpose(-1, -2))
    gamma = gc[..., -1]  # padded positions carry g = 0, so the last entry is the chunk total
    kr = torch.exp(gamma[..., None] - gc)[..., None] * kc  # D_r K

    n = len(cu) - 1
    state = h0.float() if h0 is not None else torch.zeros(n, v.shape[2], q.shape[-1], v.shape[-1], device=dev)
    first_t, count_t = torch.tensor(first, device=dev), torch.tensor(count, device=dev)
    outs: list[torch.Tensor | None] = [None] * idx.shape[0]
    for j in range(max(count)):
        active = torch.nonzero(count_t > j).flatten()
        cid = first_t[active] + j
        s = state[active]
        vnew = u[cid] - wk[cid] @ s
        o_c = scale * (d[cid] * (qc[cid] @ s) + qk_masked[cid] @ vnew)
        s_new = torch.exp(gamma[cid])[..., None, None] * s + kr[cid].transpose(-1, -2) @ vnew
        state = state.index_put((active,), s_new)
        for pos, a in enumerate(active.tolist()):  # nonzero() is sorted: pos is a's row in o_c
            outs[first[a] + j] = o_c[pos]
    o_chunks = torch.stack(outs)  # [Nc,H,C,V] in chunk (= token) order
    o = o_chunks.transpose(1, 2).reshape(-1, v.shape[2], v.shape[-1])[valid.reshape(-1)]
    return o[None], state


@register
class TorchChunkedBackend(Backend):
    name = "torch"
    description = "plain PyTorch chunked GDN, fp32 math on the bf16 inputs (CPU or GPU)"
    modes = ("fwd", "bwd", "train")
    distributions = ("torch",)
    # the CPU path and a cross-check, 20-100x slower than the kernels on a GPU (12 ms geomean on the smoke
    # sweep against 0.1-0.6 ms): timing it by default would spend most of a GPU run on it
    default_on_gpu = False

    def available(self) -> str | None:
        return None

    def supports(self, workload: Workload, mode: str, device: torch.device) -> str | None:
        return super().supports(workload, mode, device)

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        x = inputs
        if mode == "fwd":

            def run():
                with torch.no_grad():
                    return chunk_gdn_fp32(x.q, x.k, x.v, x.g, x.beta, x.scale, x.h0, x.cu_seqlens)

            return Prepared(
                run=run, outputs=lambda res: {"o": res[0].to(x.v.dtype), "final_state": res[1]}, graph_safe=False
            )
        leaves = [t.detach().float().requires_grad_(True) for t in (x.q, x.k, x.v, x.g, x.beta, x.h0)]

        def forward():
            return chunk_gdn_fp32(*leaves[:5], x.scale, leaves[5], x.cu_seqlens)

        def backward(o, ht):
            return torch.autograd.grad((o, ht), leaves, (x.do.float(), x.dht), retain_graph=(mode == "bwd"))

        names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
        if mode == "bwd":
            with torch.enable_grad():
                o, ht = forward()

            def run():
                return backward(o, ht)
        else:

            def run():
                with torch.enable_grad():
                    return backward(*forward())

        return Prepared(run=run, outputs=lambda res: dict(zip(names, res)), graph_safe=False, keepalive=leaves)
