"""--rerun: re-measure suspected SLOWER rows once on this machine before failing.

Only possible when the candidate can run here: a CUDA GPU of the same kind is present and the rows
came from qla-bench's own CUDA timers. The measuring itself is qla_bench.runner.remeasure (imported
lazily, so the gate stays importable and testable without torch); it interleaves the rows.
"""

from __future__ import annotations

from collections.abc import Callable

from ..rows import SCHEMA_VERSION, Row
from .classify import Verdict
from .gate import GateResult, reclassify
from .labels import gpu_matches

CUDA_TIMERS = ("cuda-events", "cuda-graph")
Remeasure = Callable[[list[Row]], list[Row]]


def cuda_device_name() -> str | None:
    """Name of CUDA device 0, or None when torch or a GPU is absent."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        return str(torch.cuda.get_device_name(0))
    except Exception:  # a broken driver is "no GPU" for this purpose
        return None


def rerun_unavailable(rows: list[Row], device: str | None = None) -> str | None:
    """None when `rows` can be re-measured here, else the reason they can't (for a hint)."""
    device = device if device is not None else cuda_device_name()
    if not device:
        return "no CUDA GPU here"
    foreign = [r for r in rows if r.schema_version != SCHEMA_VERSION or r.timer not in CUDA_TIMERS]
    if foreign:
        timer = foreign[0].timer or "unset"
        return f"{len(foreign)} row(s) were not timed by qla-bench on a GPU (timer {timer!r})"
    other = sorted({r.gpu for r in rows if not gpu_matches(device, r.gpu)})
    if other:
        return f"rows are from {', '.join(other) or '(no GPU name)'} but this machine has {device}"
    return None


def _default_remeasure(rows: list[Row]) -> list[Row]:
    from ..runner import remeasure  # lazy: pulls in torch and the backends

    return remeasure(rows)


def rerun_slower(result: GateResult, remeasure: Remeasure | None = None) -> GateResult:
    """Re-measure the SLOWER rows once; each keeps the verdict of its re-measurement."""
    suspects = result.of(Verdict.SLOWER)
    if not suspects:
        return result
    fresh = (remeasure or _default_remeasure)([c.head for c in suspects if c.head is not None])
    new_head = {r.config_key(): r for r in fresh}
    note = "rerun (first {first.ratio:.3f}x)"
    result = reclassify(result, new_head, note=note)
    result.notes.append(f"re-measured {len(new_head)} suspected row(s) once before deciding")
    return result


def rerun_if_possible(
    result: GateResult, remeasure: Remeasure | None = None, device: str | None = None
) -> tuple[GateResult, str | None]:
    """--rerun as one call: re-measure the SLOWER rows when possible; else return why not (a hint)."""
    suspects = [c.head for c in result.of(Verdict.SLOWER) if c.head is not None]
    if not suspects:
        return result, None
    why = rerun_unavailable(suspects, device)
    if why:
        return result, f"--rerun skipped ({why}); gating on the given data"
    return rerun_slower(result, remeasure), None
