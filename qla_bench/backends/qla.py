"""`qla`: this project's bundled TileLang kernels (package qla_kernels, folder kernels/)."""

from __future__ import annotations

import importlib

import torch

from ..workload import Workload
from . import register
from .base import Backend, GDNInputs, Prepared, hopper_or_newer


def _load():
    return importlib.import_module("qla_kernels")


@register
class QlaBackend(Backend):
    name = "qla"
    description = "qla-bench's bundled TileLang GDN kernels (SM90)"
    modes = ("fwd",)
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

        return Prepared(run=run, outputs=lambda res: {"o": res[0], "final_state": res[1]})
