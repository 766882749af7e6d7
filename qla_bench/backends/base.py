"""The one small interface every backend implements, and the canonical tensors they exchange.

A backend adapts one library to: available? supports(workload, mode)? prepare(inputs) -> a callable to
time plus a function that turns its raw result into canonical outputs. It knows nothing of timing,
tables or the CLI. Layout conversion happens in prepare(), outside the timed region.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from ..workload import Workload

# Canonical output names (FLA layout): o [1,T,H_v,V] and final_state [N,H_v,K,V] for fwd;
# dq, dk [1,T,H_qk,K], dv [1,T,H_v,V], dg, dbeta [1,T,H_v], dh0 [N,H_v,K,V] for bwd.
FWD_OUTPUTS = ("o", "final_state")
BWD_OUTPUTS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


@dataclass
class GDNInputs:
    """Canonical inputs: FLA layout, B = 1 with cu_seqlens, q/k already L2-normalised.

    q, k [1,T,H_qk,K] and v [1,T,H_v,V] in the workload dtype; g (log gate, <= 0) and beta [1,T,H_v]
    fp32; h0 [N,H_v,K,V] fp32; do like v; dht like h0. cu_seqlens int64 [N+1] on the same device.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    h0: torch.Tensor
    cu_seqlens: torch.Tensor
    scale: float
    do: torch.Tensor | None = None
    dht: torch.Tensor | None = None
    workload: Workload | None = None

    @property
    def device(self) -> torch.device:
        return self.q.device

    def tensors(self) -> dict[str, torch.Tensor]:
        names = ("q", "k", "v", "g", "beta", "h0", "cu_seqlens", "do", "dht")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass
class Prepared:
    """What the harness times: run() launches the work; outputs(result) maps it to canonical tensors.

    run() must be free of host syncs and allocations the library would not do in production, so the
    same callable can be captured in a CUDA graph. keepalive holds converted inputs alive.
    """

    run: Callable[[], Any]
    outputs: Callable[[Any], dict[str, torch.Tensor]]
    graph_safe: bool = True
    keepalive: list[Any] = field(default_factory=list)


class Backend(ABC):
    """One library behind the harness. Subclasses are registered with @register in their module."""

    name: str = ""
    description: str = ""
    modes: tuple[str, ...] = ("fwd",)
    distributions: tuple[str, ...] = ()  # PyPI distributions whose versions go into every row
    # True when its first call times candidate configs on the GPU (Triton autotune): `prepare --jobs`
    # then keeps it in one job of its own, since concurrent GPU work would skew the choice it keeps.
    tunes_on_device: bool = False
    # False for a backend that is no GPU library under comparison (the plain PyTorch path): a run on a
    # GPU then leaves it out unless --backends names it.
    default_on_gpu: bool = True

    @abstractmethod
    def available(self) -> str | None:
        """None when the library can run here, else the reason it cannot (import error, no GPU...)."""

    def installed(self) -> str | None:
        """A cheaper available(): whether the library is there, without importing it.

        Isolated runs pick their default backends with this, since every worker imports its library
        anyway and turns an import failure into UNSUPPORTED rows that carry the reason; importing all
        of them once more in the parent process cost a warm GPU smoke run ~15 s. Default: available().
        """
        return self.available()

    def supports(self, workload: Workload, mode: str, device: torch.device) -> str | None:
        """None when this backend can run the workload in this mode, else why not."""
        if mode not in self.modes:
            return f"{self.name} has no {mode} pass (modes: {', '.join(self.modes)})"
        return None

    @abstractmethod
    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        """Convert inputs to the library's layout (untimed) and return the callable to time."""

    def versions(self) -> dict[str, str]:
        out = {}
        for dist in self.distributions:
            try:
                out[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                out[dist] = "not installed"
        return out

    def env_flags(self) -> dict[str, str]:
        """Environment settings that change what this backend runs (recorded in every row)."""
        return {}


def grad_seeds(inputs: GDNInputs, backend: str, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """do and dht, contiguous, for a backward or training-step run."""
    if inputs.do is None:
        raise ValueError(f"{backend} {mode} needs inputs.do")
    return inputs.do.contiguous(), (inputs.dht.contiguous() if inputs.dht is not None else None)


def backward_prepared(
    backend: str,
    mode: str,
    forward: Callable[[], Any],
    backward: Callable[[Any], Any],
    fwd_outputs: Callable[[Any], dict[str, torch.Tensor]],
    bwd_outputs: Callable[[Any], dict[str, torch.Tensor]],
    keepalive: list[Any],
) -> Prepared:
    """bwd: the library's own forward runs once here, untimed, and run() is its backward alone (never
    another library's forward outputs); train: run() is forward + backward, one training step."""
    if mode == "bwd":
        saved = forward()
        keepalive.append(saved)
        return Prepared(run=lambda: backward(saved), outputs=bwd_outputs, keepalive=keepalive)
    if mode == "train":

        def train() -> tuple[Any, Any]:
            f = forward()
            return f, backward(f)

        return Prepared(run=train, outputs=lambda r: {**fwd_outputs(r[0]), **bwd_outputs(r[1])}, keepalive=keepalive)
    raise ValueError(f"{backend}: unknown mode {mode!r}")


def env_flag_values(*names: str) -> dict[str, str]:
    return {n: os.environ[n] for n in names if n in os.environ}


def requires_cuda(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "needs a CUDA device"
    return None


def hopper_or_newer(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "needs a CUDA device"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"needs SM90+ (Hopper), device is sm_{major}{minor}"
    return None
