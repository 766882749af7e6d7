"""FLA 0.6.0 (fla-core): FLA's own multi-kernel Triton GDN, called through its low-level fwd/bwd.

Why the low-level entry points: the public fla.ops.gated_delta_rule.chunk_gated_delta_rule sits behind
FLA's backend dispatch and silently runs FlashQLA when flash_qla is installed (FLA_FLASH_QLA, on by
default). chunk_gated_delta_rule_fwd/_bwd are what FLA's own autograd Function calls; FlashQLA's
registration only replaces the public entry, so these stay FLA. Their sub-kernels are still
dispatched one by one, and one matters: on Hopper with Triton >= 3.4 FLA sends chunk_bwd_dqkwg to its
TileLang kernel (FLA_TILELANG, on by default there), and its Triton version refuses to run for
3.4 <= Triton < 3.7.1 (wrong results upstream, fla-org/flash-linear-attention#640). supports() reports
that case up front and env_flags() records which dqkwg kernel a backward row used.

train = FLA's low-level forward then backward with the same arguments its autograd Function passes
(chunk_indices built once per cu_seqlens, like its tensor cache): the same kernels a training step
launches, without autograd bookkeeping, and the same treatment FlashQLA's adapter gets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..workload import Workload
from . import register
from .base import Backend, GDNInputs, Prepared, backward_prepared, env_flag_values, grad_seeds, requires_cuda
from .libinfo import import_or_reason, installed_reason, library_reason, version_tuple

ENTRY_MODULE = "fla.ops.gated_delta_rule.chunk"
INDEX_MODULE = "fla.ops.utils.index"
TILELANG_BACKEND_MODULE = "fla.ops.common.backends.tilelang"
CHUNK_SIZE = 64
MAX_K = 256  # FLA asserts K <= 256 in its state pass

# Every variable that changes which kernels FLA runs for this op (read by fla.backends / fla.utils).
ENV_VARS = (
    "FLA_FLASH_QLA",  # public entry -> FlashQLA (bypassed here: we call the low-level functions)
    "FLA_DISABLE_BACKEND_DISPATCH",  # read at import: every sub-kernel stays Triton
    "FLA_TILELANG",  # TileLang chunk_bwd_dqkwg on Hopper
    "FLA_INTRACARD_CP",  # intra-card CP state pass (only under torch.inference_mode)
    "FLA_INTRACARD_MAX_SPLITS",
)

# FLA 0.6.0 fla/ops/common/chunk_o.py: chunk_bwd_dqkwg raises on Hopper for these Triton versions.
_BAD_TRITON = ((3, 4, 0), (3, 7, 1))


@dataclass(frozen=True)
class FlaBwdFacts:
    """What decides FLA's gated backward on this machine.

    tilelang_off: None when FLA would dispatch chunk_bwd_dqkwg to TileLang, else why it would not.
    """

    hopper: bool
    triton_version: str
    tilelang_off: str | None


def _in_bad_triton_window(triton_version: str) -> bool:
    v = version_tuple(triton_version)
    return _BAD_TRITON[0] <= v < _BAD_TRITON[1]


def fla_bwd_blocker(facts: FlaBwdFacts) -> str | None:
    """The reason FLA's backward will raise here, or None when it runs (mirrors FLA 0.6.0's check)."""
    if not facts.hopper or not _in_bad_triton_window(facts.triton_version):
        return None
    if facts.tilelang_off is None:
        return None
    return (
        f"FLA 0.6.0 refuses its gated backward on Hopper with Triton {facts.triton_version}: Triton's "
        "chunk_bwd_dqkwg gives wrong results for 3.4.0 <= Triton < 3.7.1 "
        "(fla-org/flash-linear-attention#640) and raises unless FLA's TileLang kernel replaces it, "
        f"which is off here ({facts.tilelang_off}); upgrade Triton to >= 3.7.1 or enable TileLang"
    )


def fla_bwd_dqkwg_kernel(facts: FlaBwdFacts) -> str:
    """Which chunk_bwd_dqkwg FLA runs: 'tilelang' when its TileLang backend is on, else 'triton'.

    FLA enables that backend by default only on Hopper with Triton >= 3.4 (or when FLA_TILELANG is
    set non-zero); tilelang_off already holds FLA's own answer.
    """
    return "tilelang" if facts.tilelang_off is None else "triton"


def _tilelang_off_reason() -> str | None:
    """Ask FLA itself whether its TileLang chunk_bwd_dqkwg would be dispatched, else why not."""
    backends, reason = import_or_reason("fla.backends")
    if backends is None:
        return reason
    if getattr(backends, "_DISPATCH_DISABLED", False):
        return "FLA_DISABLE_BACKEND_DISPATCH=1"
    mod, reason = import_or_reason(TILELANG_BACKEND_MODULE)
    if mod is None:
        return reason
    backend = mod.CommonTileLangBackend()
    if not backend.is_available():
        return "tilelang is not importable or no usable nvcc was found"
    if not backend.is_enabled():
        value = os.environ.get("FLA_TILELANG")
        return f"FLA_TILELANG={value}" if value is not None else "FLA_TILELANG unset and off by default here"
    return None


def gather_bwd_facts(device: torch.device) -> FlaBwdFacts:
    """Read the facts FLA 0.6.0 checks: Hopper (its IS_NVIDIA_HOPPER), triton.__version__, TileLang."""
    utils, _ = import_or_reason("fla.utils")
    hopper = getattr(utils, "IS_NVIDIA_HOPPER", None)
    if hopper is None:
        hopper = torch.cuda.get_device_capability(device)[0] == 9
    triton, _ = import_or_reason("triton")
    triton_version = getattr(triton, "__version__", "") or ""
    return FlaBwdFacts(bool(hopper), triton_version, _tilelang_off_reason())


@register
class FlaBackend(Backend):
    """FLA's Triton chunked GDN (fla-core 0.6.0), forward, backward and training step."""

    name = "fla"
    description = "FLA 0.6.0 Triton kernels via chunk_gated_delta_rule_fwd/_bwd (no FlashQLA dispatch)"
    modes = ("fwd", "bwd", "train")
    distributions = ("fla-core", "flash-linear-attention", "triton", "tilelang")
    tunes_on_device = True  # Triton autotune on first call per shape

    def available(self) -> str | None:
        return library_reason("fla", "fla-core", ENTRY_MODULE)

    def installed(self) -> str | None:
        return installed_reason("fla", "fla-core")

    def supports(self, workload: Workload, mode: str, device: torch.device) -> str | None:
        reason = super().supports(workload, mode, device) or requires_cuda(device)
        if reason:
            return reason
        if workload.k > MAX_K:
            return f"FLA's chunked GDN supports K <= {MAX_K}, got K={workload.k}"
        if mode in ("bwd", "train"):
            return fla_bwd_blocker(gather_bwd_facts(device))
        return None

    def env_flags(self) -> dict[str, str]:
        flags = env_flag_values(*ENV_VARS)
        flags["fla_entry"] = "chunk_gated_delta_rule_fwd/_bwd"
        try:
            if torch.cuda.is_available():
                facts = gather_bwd_facts(torch.device("cuda", torch.cuda.current_device()))
                flags["fla_bwd_dqkwg"] = fla_bwd_dqkwg_kernel(facts)
        except Exception as e:  # provenance must never fail a row
            flags["fla_bwd_dqkwg"] = f"unknown ({type(e).__name__})"
        return flags

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        chunk, reason = import_or_reason(ENTRY_MODULE)
        index, reason2 = import_or_reason(INDEX_MODULE)
        if chunk is None or index is None:
            raise RuntimeError(reason or reason2)
        x = _contiguous(inputs)
        # Same object every call: FLA caches chunk offsets etc. by tensor identity.
        cu = inputs.cu_seqlens
        chunk_indices = index.prepare_chunk_indices(cu, CHUNK_SIZE)
        fwd_kwargs: dict[str, Any] = dict(
            q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=inputs.scale,
            initial_state=x["h0"], output_final_state=True, cu_seqlens=cu,
            chunk_indices=chunk_indices, chunk_size=CHUNK_SIZE,
        )  # fmt: skip
        keep: list[Any] = [x, chunk_indices]

        def fwd() -> tuple:
            return chunk.chunk_gated_delta_rule_fwd(**fwd_kwargs)

        if mode == "fwd":
            return Prepared(run=fwd, outputs=_fwd_outputs, keepalive=keep)

        do, dht = grad_seeds(inputs, self.name, mode)
        keep += [do, dht]

        def bwd(f: tuple) -> tuple:
            g_cumsum, _o, A, _ht, h0, _g_input = f
            return chunk.chunk_gated_delta_rule_bwd(
                q=x["q"], k=x["k"], v=x["v"], g=g_cumsum, beta=x["beta"], A=A, scale=inputs.scale,
                initial_state=h0, do=do, dht=dht, cu_seqlens=cu, chunk_indices=chunk_indices,
                chunk_size=CHUNK_SIZE,
            )  # fmt: skip

        # bwd: FLA's own forward outputs (g_cumsum in log2 units, its gated A), untimed
        return backward_prepared(self.name, mode, fwd, bwd, _fwd_outputs, _bwd_outputs, keep)


def _contiguous(inputs: GDNInputs) -> dict[str, torch.Tensor]:
    return {n: getattr(inputs, n).contiguous() for n in ("q", "k", "v", "g", "beta", "h0")}


def _fwd_outputs(res: tuple) -> dict[str, torch.Tensor]:
    # (g_cumsum, o, A, final_state, initial_state, g_input)
    return {"o": res[1], "final_state": res[3]}


def _bwd_outputs(res: tuple) -> dict[str, torch.Tensor]:
    # (dq, dk, dv, dbeta, dg, dh0, dA_log, ddt_bias)
    dq, dk, dv, db, dg, dh0 = res[:6]
    return {"dq": dq, "dk": dk, "dv": dv, "dg": dg, "dbeta": db, "dh0": dh0}


__all__ = ["FlaBackend", "FlaBwdFacts", "fla_bwd_blocker", "fla_bwd_dqkwg_kernel"]
