"""`qla`: this project's bundled TileLang kernels (package qla_kernels, folder kernels/).

fwd runs the differentiable entry (chunk_gated_delta_rule) with nothing requiring grad. bwd and train
run the low-level forward (its g_cumsum and A0 feed the backward, as in the other adapters) and the
TileLang backward, qla_kernels.gdn.bwd_api.chunk_gated_delta_rule_bwd, whatever $QLA_BWD_IMPL says:
that variable only picks what autograd uses, and the harness measures the kernels.
"""

from __future__ import annotations

import importlib

import torch

from ..workload import Workload
from . import register
from .base import Backend, GDNInputs, Prepared, backward_prepared, grad_seeds, hopper_or_newer
from .libinfo import is_installed

BWD_MODULE = "qla_kernels.gdn.bwd_api"


def _load():
    return importlib.import_module("qla_kernels")


@register
class QlaBackend(Backend):
    name = "qla"
    description = "qla-bench's bundled TileLang GDN kernels (SM90)"
    modes = ("fwd", "bwd", "train")
    distributions = ("qla-bench", "tilelang")

    def available(self) -> str | None:
        if not torch.cuda.is_available():
            return "needs a CUDA device (SM90)"
        why = hopper_or_newer(torch.device("cuda"))
        if why:
            return why
        try:
            mod = _load()
        except Exception as exc:
            return f"cannot import qla_kernels ({type(exc).__name__}: {exc}); install with the [gpu] extra"
        if not getattr(mod, "KERNELS_READY", False):
            return "bundled kernels not built yet (qla_kernels.KERNELS_READY is False)"
        return None

    def installed(self) -> str | None:
        if not torch.cuda.is_available():
            return "needs a CUDA device (SM90)"
        for module in ("qla_kernels", "tilelang"):
            if not is_installed(module):
                return f"no module {module!r}; install with the [gpu] extra"
        return hopper_or_newer(torch.device("cuda"))

    def supports(self, workload: Workload, mode: str, device: torch.device) -> str | None:
        why = super().supports(workload, mode, device)
        if why:
            return why
        if (workload.k, workload.v) != (128, 128):
            return f"K = V = 128 only (got K={workload.k}, V={workload.v})"
        if workload.recipe.dtype not in ("bfloat16", "float16"):
            return f"bf16/fp16 inputs only (got {workload.recipe.dtype})"
        return hopper_or_newer(device)

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        mod = _load()
        x = inputs

        def run():
            return mod.chunk_gated_delta_rule(
                x.q,
                x.k,
                x.v,
                x.g,
                x.beta,
                scale=x.scale,
                initial_state=x.h0,
                output_final_state=True,
                cu_seqlens=x.cu_seqlens,
            )

        if mode == "fwd":
            return Prepared(run=run, outputs=lambda res: {"o": res[0], "final_state": res[1]})

        bwd_api = importlib.import_module(BWD_MODULE)
        do, dht = grad_seeds(inputs, self.name, mode)

        def forward():
            return mod.chunk_gated_delta_rule_fwd(
                x.q, x.k, x.v, x.g, x.beta, scale=x.scale, initial_state=x.h0, cu_seqlens=x.cu_seqlens,
                output_final_state=True,
            )  # fmt: skip

        def backward(f):
            return bwd_api.chunk_gated_delta_rule_bwd(
                x.q, x.k, x.v, f.g_cumsum, x.beta, f.a0, do, dht, x.scale, x.h0, x.cu_seqlens
            )

        return backward_prepared(self.name, mode, forward, backward, _fwd_outputs, _bwd_outputs, [do, dht])

    def env_flags(self) -> dict[str, str]:
        """The kernel choices in force (defaults or $QLA_* overrides), so a row says what it timed."""
        flags = {"qla_bwd": "TileLang (bwd_api: state store, dS chain, chunk gradients)"}
        try:
            api = importlib.import_module("qla_kernels.gdn.api")
            plan = importlib.import_module("qla_kernels.gdn.plan")
            bwd_api = importlib.import_module(BWD_MODULE)
        except Exception:  # reported by available(); rows of an unavailable backend carry no timing
            return flags
        fused = api.resolve_fused_impl()
        flags["qla_fused"] = f"auto ({plan.WS_IMPL}, V-slice by config)" if fused == "auto" else fused
        if (plan.WS_IMPL if fused == "auto" else fused) in api.AGB_IMPLS:  # no A0: bwd and train run ws6
            flags["qla_fused"] += f"; {api.A0_FALLBACK_IMPL} where a backward follows"
        kkt, kkt_agb = api.resolve_kkt_impl(), api.resolve_kkt_impl(emit_agb=True)
        flags["qla_kkt"] = kkt if kkt == kkt_agb else f"{kkt}; {kkt_agb} where it writes Agb (forward only)"
        combine = api.resolve_cp_combine()
        if combine == "kernel":  # the one-launch combine's variant (its A/B rows differ only in this)
            combine += (f" rev {api.resolve_cp_combine_rev()}, {api.resolve_cp_combine_block_v()} columns,"
                        f" {api.resolve_cp_combine_threads()} threads")  # fmt: skip
        piece = api.resolve_cp_piece()
        forced = f", pieces of {piece} chunks forced" if piece is not None else ""
        flags["qla_cp"] = f"on (combine: {combine}{forced})" if api.resolve_cp() else "off"
        flags["qla_bwd_dstate"] = bwd_api.resolve_dstate_rev()
        flags["qla_bwd_states"] = bwd_api.resolve_states_impl()
        grads = bwd_api.resolve_grads_rev()
        flags["qla_bwd_grads"] = grads
        flags["qla_bwd_group_sum"] = bwd_api.resolve_group_sum()
        if grads in bwd_api.CLUSTER_SUM_REVS:  # that stage 2 sums the group itself where it can
            ratios = ", ".join(str(r) for r in bwd_api.CLUSTER_SUM_RATIOS)
            flags["qla_bwd_group_sum"] += f" (only at h_v / h_qk not in {ratios}: stage 2 {grads} sums the group)"
        flags["qla_bwd_cp"] = "on (bwd_cp_plan decides)" if bwd_api.resolve_bwd_cp() else "off"
        flags["qla_bwd_overlap"] = "stage 0 beside stage 1" if bwd_api.resolve_bwd_overlap() else "off"
        fused = {"0": "off", "1": "chain and gradients in one walk (rev12 math)",
                 "2": "chain and gradients in one walk (rev12 math), loads prefetched"}  # fmt: skip
        flags["qla_bwd_fused"] = fused[bwd_api.resolve_bwd_fused_mode()]
        return flags


def _fwd_outputs(f) -> dict[str, torch.Tensor]:
    return {"o": f.o, "final_state": f.final_state}


def _bwd_outputs(b) -> dict[str, torch.Tensor]:
    return {"dq": b.dq, "dk": b.dk, "dv": b.dv, "dg": b.dg, "dbeta": b.dbeta, "dh0": b.dh0}
