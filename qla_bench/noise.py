"""Run-to-run noise: the same configs measured in several separate processes.

The spread of the median across processes (not within one) is what a CI gate must tolerate, so it is
measured per timer and turned into a threshold suggestion for `qla-bench gate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rows import Row


@dataclass(frozen=True)
class NoisePoint:
    backend: str
    timer: str
    model: str
    label: str
    medians_ms: tuple[float, ...]

    @property
    def spread(self) -> float:
        """(max - min) / mean of the per-process medians."""
        m = self.medians_ms
        mean = sum(m) / len(m)
        return (max(m) - min(m)) / mean if mean > 0 else 0.0


def noise_points(runs: list[list[Row]]) -> list[NoisePoint]:
    """Match PASSED rows across runs by config key; keep configs measured in every run."""
    if len(runs) < 2:
        raise ValueError("noise needs at least two runs")
    keyed = [{r.config_key(): r for r in run if r.passed and r.median_ms} for run in runs]
    common = set(keyed[0]).intersection(*keyed[1:])
    out = []
    for key in sorted(common, key=str):
        first = keyed[0][key]
        out.append(
            NoisePoint(first.backend, first.timer, first.model, first.label, tuple(k[key].median_ms for k in keyed))
        )
    return out


def suggested_threshold(points: list[NoisePoint], floor: float = 0.05) -> float:
    """max(floor, 2 x the 90th-percentile spread): a slowdown under it is within process-to-process noise."""
    if not points:
        return floor
    spreads = sorted(p.spread for p in points)
    p90 = spreads[min(len(spreads) - 1, int(0.9 * len(spreads)))]
    return max(floor, 2 * p90)


def render_noise_markdown(points: list[NoisePoint], n_runs: int, gpu: str) -> str:
    lines = [
        f"# Run-to-run noise on {gpu}",
        "",
        f"The same configs measured in {n_runs} separate processes; spread = (max - min) / mean of the "
        "per-process medians.",
        "",
        "| backend | timer | config | seqlens | medians (ms) | spread |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        meds = ", ".join(f"{m:.4f}" for m in p.medians_ms)
        lines.append(f"| {p.backend} | {p.timer} | {p.model} | {p.label} | {meds} | {100 * p.spread:.2f} % |")
    lines += [
        "",
        "| timer | configs | median spread | max spread | suggested gate threshold |",
        "|---|---|---|---|---|",
    ]
    for timer in sorted({p.timer for p in points}):
        ps = [p for p in points if p.timer == timer]
        spreads = sorted(p.spread for p in ps)
        lines.append(
            f"| {timer} | {len(ps)} | {100 * spreads[len(spreads) // 2]:.2f} % | {100 * spreads[-1]:.2f} % | "
            f"{100 * suggested_threshold(ps):.1f} % |"
        )
    return "\n".join(lines) + "\n"
