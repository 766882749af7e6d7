"""FlashInfer (flashinfer-python 0.6.9 or 0.7.x): GDN chunked prefill, forward only.

flashinfer.gdn_prefill.chunk_gated_delta_rule takes packed tokens without a batch dim (q,k,v
[T,H,D], free views of ours), a LINEAR gate alpha = exp(g) (0.6.9 has no other domain and a log gate
runs silently wrong), and its state V-first [N,H,V,K]. All three conversions happen in prepare()
(untimed) and the final state is transposed back in outputs().

Version differences, detected from the function's signature (falling back to the version number):
- 0.7.x adds use_cp ("auto" by default: its own context-parallel path when sequences x heads is small
  on Hopper). The 'flashinfer' backend passes use_cp=False, like-for-like with 0.6.9 and with the
  non-CP kernels; 'flashinfer-cp' passes use_cp="auto" plus the exact max_seqlen host hint, so both
  can be reported.
- 0.7.x adds gate_domain="log", which only runs torch.exp(g) inside the call. We give both versions
  the precomputed linear gate by default (the kernel's native input); QLA_FLASHINFER_GATE_DOMAIN=log
  times that extra exp instead (0.7.x only).
- 0.6.9 ignores use_qk_l2norm_in_kernel; we pass False everywhere (q, k arrive L2-normalised).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError
from ..workload import Workload
from . import register
from .base import Backend, GDNInputs, Prepared, env_flag_values, requires_cuda
from .layouts import add_batch, drop_batch, log_gate_to_linear, state_kv_to_vk, state_vk_to_kv
from .libinfo import dist_version, import_or_reason, installed_reason, library_reason, version_tuple

DIST = "flashinfer-python"
ENTRY_MODULE = "flashinfer.gdn_prefill"
HEAD_DIM = 128
DTYPES = ("bfloat16", "float16")
GATE_DOMAIN_ENV = "QLA_FLASHINFER_GATE_DOMAIN"
ENV_VARS = ("FLASHINFER_LOGLEVEL", GATE_DOMAIN_ENV)  # FLASHINFER_LOGLEVEL > 0 wraps every call in logging


@dataclass(frozen=True)
class CallShape:
    """Which keyword arguments this FlashInfer's chunk_gated_delta_rule accepts beyond 0.6.9's."""

    version: str
    use_cp: bool
    gate_domain: bool
    max_seqlen: bool


def call_shape(version: str, params: Collection[str] | None) -> CallShape:
    """Decide the call shape from the signature's parameter names, or from the version without one.

    params is None when the signature cannot be read (a C extension, a bare *args/**kwargs wrapper).
    """
    if params is not None:
        return CallShape(version, "use_cp" in params, "gate_domain" in params, "max_seqlen" in params)
    new = version_tuple(version) >= (0, 7)
    return CallShape(version, new, new, new)


def signature_params(fn: Any) -> set[str] | None:
    """Named parameters of fn (following functools.wraps), or None when only *args/**kwargs show."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return named or None


def gate_domain_setting() -> str:
    """'linear' (default: exp(g) precomputed outside the timed call) or 'log' (0.7.x exps inside it)."""
    value = os.environ.get(GATE_DOMAIN_ENV, "linear").strip().lower()
    if value not in ("linear", "log"):
        raise UsageError(GATE_DOMAIN_ENV, f"unknown gate domain {value!r}", "linear, log")
    return value


def extra_kwargs(shape: CallShape, *, use_cp: bool | str, gate_domain: str, max_seqlen: int | None) -> dict[str, Any]:
    """Keyword arguments beyond 0.6.9's for this call shape; raises when the shape cannot honour them."""
    kw: dict[str, Any] = {}
    if shape.use_cp:
        kw["use_cp"] = use_cp
    elif use_cp is not False:
        raise ValueError(f"FlashInfer {shape.version} has no use_cp (added in 0.7)")
    if gate_domain == "log":
        if not shape.gate_domain:
            raise ValueError(f"FlashInfer {shape.version} has no gate_domain (added in 0.7)")
        kw["gate_domain"] = "log"
    if use_cp is not False and shape.max_seqlen and max_seqlen is not None:
        kw["max_seqlen"] = max_seqlen
    return kw


def supported_archs(version: str) -> tuple[int, ...]:
    """Compute-capability majors with a GDN prefill kernel: 0.6.9 SM90/SM100, 0.7.x adds SM8x/SM120."""
    return (8, 9, 10, 12) if version_tuple(version) >= (0, 7) else (9, 10)


ALLOW_BUILD_ENV = "QLA_FLASHINFER_ALLOW_BUILD"
_JIT_VERSION_MAX = (0, 7)  # 0.6.x builds one CUTLASS module with nvcc; 0.7.x compiles CuTe DSL per process


def jit_module_path(version: str, capability: tuple[int, int], workspace: str | None = None) -> Path:
    """Where FlashInfer 0.6.x keeps its built GDN prefill module (flashinfer/jit/env.py layout)."""
    base = Path(workspace or os.environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home())
    arch = f"{capability[0]}{capability[1]}" + ("a" if capability[0] >= 9 else "")
    return base / ".cache" / "flashinfer" / version / arch / "cached_ops" / "gdn_prefill_sm90" / "gdn_prefill_sm90.so"


def unbuilt_jit_reason(version: str, capability: tuple[int, int], aot_present: bool) -> str | None:
    """Why a sweep must not trigger FlashInfer 0.6.x's GDN JIT build (~13 min on 16 cores, 12,000 CPU-s)
    inside a timed config; None when the module is built, prebuilt (AOT), or a build is allowed here."""
    if version_tuple(version) >= _JIT_VERSION_MAX or aot_present or os.environ.get(ALLOW_BUILD_ENV) == "1":
        return None
    path = jit_module_path(version, capability)
    if path.is_file():
        return None
    return (
        f"FlashInfer {version}'s GDN module is not built ({path} missing; its JIT build takes ~13 min on 16 "
        "cores): run `qla-bench prepare --backends flashinfer` once, or unpack a prebuilt module "
        "(.ci/build-flashinfer-gdn.sh)"
    )


def _aot_present() -> bool:
    """FlashInfer loads a module shipped under <package>/data/aot/ without any build."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):  # a module object without a spec (tests' fakes)
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        (Path(loc) / "data" / "aot" / "gdn_prefill_sm90" / "gdn_prefill_sm90.so").is_file()
        for loc in spec.submodule_search_locations
    )


class _FlashInferBase(Backend):
    """Shared adapter; subclasses pick use_cp."""

    modes = ("fwd",)
    distributions = (DIST,)
    use_cp: bool | str = False

    def available(self) -> str | None:
        return library_reason("flashinfer", DIST, ENTRY_MODULE)

    def installed(self) -> str | None:
        return installed_reason("flashinfer", DIST)

    def _version(self) -> str:
        return dist_version(DIST) or ""

    def _call_shape(self, fn: Any) -> CallShape:
        return call_shape(self._version(), signature_params(fn))

    def supports(self, workload: Workload, mode: str, device: torch.device) -> str | None:
        reason = super().supports(workload, mode, device) or requires_cuda(device)
        if reason:
            return reason
        if workload.k != HEAD_DIM or workload.v != HEAD_DIM:
            return (
                f"FlashInfer takes one head_size for q, k and v and qla-bench compares it at "
                f"K = V = {HEAD_DIM} only, got K={workload.k} V={workload.v}"
            )
        if workload.recipe.dtype not in DTYPES:
            return f"FlashInfer GDN prefill supports {' and '.join(DTYPES)} only, got {workload.recipe.dtype}"
        version = self._version()
        major, minor = torch.cuda.get_device_capability(device)
        if major not in supported_archs(version):
            return f"FlashInfer {version} has no GDN prefill kernel for sm_{major}{minor}"
        reason = unbuilt_jit_reason(version, (major, minor), _aot_present())
        if reason:
            return reason
        if self.use_cp is not False or gate_domain_setting() == "log":
            mod, reason = import_or_reason(ENTRY_MODULE)
            if mod is None:
                return reason
            try:
                extra_kwargs(
                    self._call_shape(mod.chunk_gated_delta_rule),
                    use_cp=self.use_cp, gate_domain=gate_domain_setting(), max_seqlen=None,
                )  # fmt: skip
            except ValueError as e:
                return str(e)
        return None

    def env_flags(self) -> dict[str, str]:
        flags = env_flag_values(*ENV_VARS)
        flags["flashinfer_use_cp"] = str(self.use_cp)
        flags["flashinfer_gate_domain"] = gate_domain_setting()
        return flags

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        if mode != "fwd":
            raise ValueError(f"{self.name} has no {mode} pass")
        mod, reason = import_or_reason(ENTRY_MODULE)
        if mod is None:
            raise RuntimeError(reason)
        fn = mod.chunk_gated_delta_rule
        domain = gate_domain_setting()
        cu = inputs.cu_seqlens
        if cu.dtype != torch.int64:  # int32 costs 0.6.9 a cast kernel inside every call
            cu = cu.to(torch.int64)
        max_seqlen = int((cu[1:] - cu[:-1]).max()) if self.use_cp is not False else None
        extra = extra_kwargs(self._call_shape(fn), use_cp=self.use_cp, gate_domain=domain, max_seqlen=max_seqlen)
        q, k, v = (drop_batch(t.contiguous()) for t in (inputs.q, inputs.k, inputs.v))
        gate = inputs.g.to(torch.float32).contiguous() if domain == "log" else log_gate_to_linear(inputs.g)
        g = drop_batch(gate)
        beta = drop_batch(inputs.beta.to(torch.float32).contiguous())
        h0 = state_kv_to_vk(inputs.h0.to(torch.float32))

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            return fn(
                q, k, v, g=g, beta=beta, scale=inputs.scale, initial_state=h0, output_final_state=True,
                cu_seqlens=cu, use_qk_l2norm_in_kernel=False, **extra,
            )  # fmt: skip

        return Prepared(run=run, outputs=_fwd_outputs, keepalive=[q, k, v, g, beta, h0, cu])


def _fwd_outputs(res: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
    o, state_vk = res
    return {"o": add_batch(o), "final_state": state_vk_to_kv(state_vk)}


@register
class FlashInferBackend(_FlashInferBase):
    """FlashInfer's non-CP GDN prefill (use_cp=False on 0.7.x; 0.6.9 has no CP)."""

    name = "flashinfer"
    description = "FlashInfer gdn_prefill.chunk_gated_delta_rule, forward only, use_cp=False"
    use_cp = False


@register
class FlashInferCPBackend(_FlashInferBase):
    """FlashInfer 0.7.x with its own context-parallel routing (use_cp='auto'), reported beside the above."""

    name = "flashinfer-cp"
    description = "FlashInfer 0.7.x gdn_prefill.chunk_gated_delta_rule, forward only, use_cp='auto'"
    use_cp = "auto"


__all__ = [
    "CallShape",
    "FlashInferBackend",
    "FlashInferCPBackend",
    "call_shape",
    "extra_kwargs",
    "signature_params",
    "supported_archs",
]
