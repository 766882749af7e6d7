"""Numerics before timing: compare canonical outputs with the float64 reference.

Pure functions of tensors; nothing library-specific. A backend that fails here is never timed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import UsageError
from .rows import Status


@dataclass(frozen=True)
class Tolerance:
    """Relative-L2 limits per output name; `default` applies to names not listed."""

    name: str
    default: float
    per_output: dict[str, float] = field(default_factory=dict)

    def limit(self, output: str) -> float:
        return self.per_output.get(output, self.default)


# FlashQLA's tests accept rel-L2 <= 0.02 for bf16; 'strict' is the bar set for our own kernels
# (issue targets: 0.005 on o and final state; 0.01 on dq, dk, dv, dh0 and 0.02 on dg, dbeta).
TOLERANCES = {
    "bf16": Tolerance("bf16", 0.02),
    "strict": Tolerance("strict", 0.005, {"dq": 0.01, "dk": 0.01, "dv": 0.01, "dh0": 0.01, "dg": 0.02, "dbeta": 0.02}),
    "fp32": Tolerance("fp32", 1e-4),
}


def get_tolerance(name: str) -> Tolerance:
    if name not in TOLERANCES:
        raise UsageError("--tolerance", f"unknown profile {name!r}", ", ".join(TOLERANCES))
    return TOLERANCES[name]


@dataclass
class Comparison:
    """Per-output errors plus the verdict."""

    rel_l2: dict[str, float]
    max_abs: dict[str, float]
    nonfinite: dict[str, int]
    status: Status
    reason: str = ""


def compare_outputs(
    outputs: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], tolerance: Tolerance
) -> Comparison:
    """rel-L2 = ||x - ref|| / ||ref||, max |x - ref| and NaN/Inf count for every reference output.

    A missing output, a shape mismatch, any NaN/Inf, or an error over its limit is INCORRECT.
    """
    rel, mx, bad, problems = {}, {}, {}, []
    for name, ref in reference.items():
        if name not in outputs or outputs[name] is None:
            problems.append(f"{name} missing")
            continue
        out = outputs[name]
        if tuple(out.shape) != tuple(ref.shape):
            problems.append(f"{name} shape {tuple(out.shape)} != {tuple(ref.shape)}")
            continue
        x = out.detach().to(device=ref.device, dtype=torch.float64)
        finite = torch.isfinite(x)
        bad[name] = int((~finite).sum().item())
        diff = torch.where(finite, x - ref, torch.zeros_like(x))
        ref_norm = ref.norm().item()
        rel[name] = diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item()
        mx[name] = diff.abs().max().item() if diff.numel() else 0.0
        if bad[name]:
            problems.append(f"{name} has {bad[name]} NaN/Inf")
        elif rel[name] > tolerance.limit(name):
            problems.append(f"{name} rel-L2 {rel[name]:.3g} > {tolerance.limit(name):g}")
    status = Status.INCORRECT if problems else Status.PASSED
    return Comparison(rel, mx, bad, status, "; ".join(problems))


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill a harness-allocated output with NaN so an unwritten element can never pass."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t
