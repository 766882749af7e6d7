"""FlashQLA 0.1.3 (flash-qla): fused TileLang GDN forward/backward with automatic intra-card CP.

Called through flash_qla.chunk_gated_delta_rule_fwd/_bwd with the arguments its own autograd Function
passes: inference forward with is_train=False and no CP cache (what the public entry does when nothing
requires grad); training forward with is_train=True and enable_fwd_cp_cache=True, whose g_cumsum, A0
and CP cache feed its backward. The CP decision depends on is_train, so the backward is always given a
forward made in training mode. auto_cp=True everywhere: the library's default, part of what it is.

FlashQLA caches its CP plan and chunk offsets by tensor identity, so the adapter passes the very
cu_seqlens object from the inputs to every call. Only K = V = 128 is supported (other K give silently
wrong results on some GPUs); its backward asserts an fp32 gate.

train = low-level forward then backward, the kernels its autograd Function launches, without autograd
bookkeeping: the same treatment FLA's adapter gets.
"""

from __future__ import annotations

from typing import Any

import torch

from ..workload import Workload
from . import register
from .base import Backend, GDNInputs, Prepared, backward_prepared, grad_seeds, requires_cuda
from .libinfo import import_or_reason, installed_reason, library_reason

ENTRY_MODULE = "flash_qla"
HEAD_DIM = 128
# Compute capabilities FlashQLA 0.1.3 builds for; SM120/121 ship a forward only.
FWD_BWD_ARCHS = ((9, 0), (10, 0), (10, 3))
FWD_ONLY_ARCHS = ((12, 0), (12, 1))
DTYPES = ("bfloat16", "float16")


def flashqla_arch_reason(capability: tuple[int, int], mode: str) -> str | None:
    """None when FlashQLA 0.1.3 runs `mode` on a GPU of this compute capability, else why not."""
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability in FWD_BWD_ARCHS:
        return None
    if capability in FWD_ONLY_ARCHS:
        return None if mode == "fwd" else f"FlashQLA 0.1.3 has no backward on {sm} (forward only)"
    return f"FlashQLA 0.1.3 builds for sm_90, sm_100, sm_103 and sm_120/121 only, device is {sm}"


@register
class FlashQLABackend(Backend):
    """FlashQLA's fused TileLang kernels, forward, backward and training step."""

    name = "flashqla"
    description = "FlashQLA 0.1.3 chunk_gated_delta_rule_fwd/_bwd (TileLang, auto intra-card CP)"
    modes = ("fwd", "bwd", "train")
    distributions = ("flash-qla", "tilelang")

    def available(self) -> str | None:
        return library_reason("flash_qla", "flash-qla", ENTRY_MODULE)

    def installed(self) -> str | None:
        return installed_reason("flash_qla", "flash-qla")

    def supports(self, workload: Workload, mode: str, device: torch.device) -> str | None:
        reason = super().supports(workload, mode, device) or requires_cuda(device)
        if reason:
            return reason
        if workload.k != HEAD_DIM or workload.v != HEAD_DIM:
            return f"FlashQLA supports only K = V = {HEAD_DIM}, got K={workload.k} V={workload.v}"
        if workload.recipe.dtype not in DTYPES:
            return f"FlashQLA supports {' and '.join(DTYPES)} only, got {workload.recipe.dtype}"
        major, minor = torch.cuda.get_device_capability(device)
        return flashqla_arch_reason((major, minor), mode)

    def env_flags(self) -> dict[str, str]:
        # No environment variables change FlashQLA's path; record the call choices instead.
        return {"flashqla_auto_cp": "True", "flashqla_fwd_is_train": "False for fwd, True for bwd/train"}

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        fq, reason = import_or_reason(ENTRY_MODULE)
        if fq is None:
            raise RuntimeError(reason)
        x = {n: getattr(inputs, n).contiguous() for n in ("q", "k", "v", "beta", "h0")}
        x["g"] = inputs.g.to(torch.float32).contiguous()  # its backward asserts an fp32 gate
        cu = inputs.cu_seqlens  # same object every call: FlashQLA caches its CP plan by identity
        keep: list[Any] = [x]

        def fwd(train: bool) -> tuple:
            return fq.chunk_gated_delta_rule_fwd(
                q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=inputs.scale,
                initial_state=x["h0"], cu_seqlens=cu, output_final_state=True, output_h=False,
                auto_cp=True, enable_fwd_cp_cache=train, is_train=train,
            )  # fmt: skip

        if mode == "fwd":
            return Prepared(run=lambda: fwd(False), outputs=_fwd_outputs, keepalive=keep)

        do, dht = grad_seeds(inputs, self.name, mode)
        keep += [do, dht]

        def bwd(f: tuple) -> tuple:
            g_cumsum, A0, _o, _h, _ht, cp_cache = f
            return fq.chunk_gated_delta_rule_bwd(
                q=x["q"], k=x["k"], v=x["v"], g=g_cumsum, beta=x["beta"], A=A0, do=do, dht=dht,
                scale=inputs.scale, initial_state=x["h0"], cu_seqlens=cu, auto_cp=True,
                cp_cache=cp_cache,
            )  # fmt: skip

        # bwd/train use FlashQLA's own training forward (g_cumsum, gate-free A0, CP cache)
        return backward_prepared(self.name, mode, lambda: fwd(True), bwd, _fwd_outputs, _bwd_outputs, keep)


def _fwd_outputs(res: tuple) -> dict[str, torch.Tensor]:
    # (g_cumsum, A0, o, h, final_state, cp_cache)
    return {"o": res[2], "final_state": res[4]}


def _bwd_outputs(res: tuple) -> dict[str, torch.Tensor]:
    # (dq, dk, dv, dbeta, dg, dh0): dbeta comes before dg
    dq, dk, dv, db, dg, dh0 = res
    return {"dq": dq, "dk": dk, "dv": dv, "dg": dg, "dbeta": db, "dh0": dh0}


__all__ = ["FlashQLABackend", "flashqla_arch_reason"]
