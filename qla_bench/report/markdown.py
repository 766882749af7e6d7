"""report.md: provenance, statuses, latencies, speedups, numerics, roofline, health, host-bound rows, and FlashQLA
anchors.

Everything is computed from rows (and the parsed anchors file), so a report can be rebuilt on any
machine from committed results.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

from ..provenance import describe_health, is_throttled
from ..rows import Row, Status
from ..stats import geomean
from .anchors import AnchorTable
from .compare import THRESHOLD, common_reasons, compare_with_anchors, summarize_comparisons
from .grid import (
    MODES,
    Grid,
    backends_of,
    bwd_seqlen_label,
    display_name,
    format_ms,
    format_ratio,
    grids,
    latency_cell,
    ratio,
)
from .host_bound import HOST_BOUND_RATIO, HOST_TIME_FRACTION, host_bound_rows, host_timed_rows
from .provenance import env_line, merged_env_flags, merged_versions, timer_summary, versions_line

STATUS_ORDER = [s.value for s in Status]
CHECKED = (Status.PASSED.value, Status.INCORRECT.value)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], body: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """A GitHub Markdown table; align is one 'l'/'r' per column (default: first left, rest right)."""
    align = (align or "l").ljust(len(header), "r")
    out = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    out.append("|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|")
    out += ["| " + " | ".join(_cell(c) for c in cells) + " |" for cells in body]
    return out


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _config_text(r: Row) -> str:
    mix = r.label if r.mode == "fwd" else bwd_seqlen_label(r.seqlens)
    return f"{r.model + ' ' if r.model else ''}h{r.h_qk}/{r.h_v} {mix} ({r.mode})"


def _details(summary: str, lines: list[str], limit: int = 20) -> list[str]:
    """Long listings fold away on GitHub; short ones stay inline."""
    if len(lines) - 2 <= limit:
        return [*lines, ""]
    return ["<details>", f"<summary>{summary}</summary>", "", *lines, "", "</details>", ""]


def provenance_section(rows: Sequence[Row], timers: Sequence[str]) -> list[str]:
    modes = Counter(r.mode for r in rows)
    stamps = sorted(r.timestamp for r in rows if r.timestamp)
    facts = [
        ("GPU", ", ".join(dict.fromkeys(r.gpu for r in rows if r.gpu)) or "unknown"),
        ("Git SHA", ", ".join(dict.fromkeys(r.git_sha for r in rows if r.git_sha)) or "unknown"),
        ("Timers", "; ".join(timer_summary(rows, t) for t in timers)),
        ("Sweeps", ", ".join(dict.fromkeys(r.sweep for r in rows if r.sweep)) or "-"),
        ("Rows", f"{len(rows)} (" + ", ".join(f"{m} {n}" for m, n in modes.items()) + ")"),
        ("Env flags", env_line(merged_env_flags(rows)) or "none recorded"),
        ("Measured", f"{stamps[0]} .. {stamps[-1]}" if stamps else "-"),
    ]
    out = ["## Provenance", "", *md_table(["", ""], facts, "ll"), ""]
    versions = merged_versions(rows)
    if versions:
        out += ["Library versions: " + versions_line(versions), ""]
    if len({r.gpu for r in rows if r.gpu}) > 1:
        out += ["**Warning:** rows from several GPUs are mixed in this report.", ""]
    return out


def status_section(rows: Sequence[Row]) -> list[str]:
    counts = Counter((r.backend, r.mode, r.status) for r in rows)
    statuses = [s for s in STATUS_ORDER if any(k[2] == s for k in counts)]
    statuses += sorted({k[2] for k in counts} - set(statuses))
    pairs = list(dict.fromkeys((r.backend, r.mode) for r in rows))
    order = {b: i for i, b in enumerate(backends_of(rows))}
    mode_rank = {m: i for i, m in enumerate(MODES)}
    pairs.sort(key=lambda p: (order[p[0]], mode_rank.get(p[1], len(MODES)), p[1]))
    body = [
        [
            display_name(b),
            m,
            *(counts.get((b, m, s), 0) for s in statuses),
            sum(counts.get((b, m, s), 0) for s in statuses),
        ]
        for b, m in pairs
    ]
    out = ["## Status per backend", "", *md_table(["backend", "mode", *statuses, "total"], body, "ll"), ""]
    failed = [r for r in rows if not r.passed]
    if failed:
        out += ["Rows that did not pass (timing is never reported for them):", ""]
        table = md_table(
            ["backend", "config", "status", "reason"],
            ([display_name(r.backend), _config_text(r), r.status, r.reason or "-"] for r in failed),
            "llll",
        )
        out += _details(f"{len(failed)} rows", table)
    return out


def speedup_section(tables: Sequence[Grid]) -> list[str]:
    out = ["## Speedups", ""]
    if all(len(g.backends) < 2 for g in tables):
        return [*out, "Only one backend was measured: no ratios to report.", ""]
    for g in tables:
        if len(g.backends) < 2:
            continue
        out += [
            f"Geometric mean of other / {display_name(g.primary)} latency "
            f"({g.mode}, timer {g.timer}); > 1 means {display_name(g.primary)} is faster.",
            "",
        ]
        body = []
        for b in g.backends[1:]:
            pairs = g.ratios(b)
            values = [r for _, r in pairs]
            slower = [(line, r) for line, r in pairs if r < 1.0]
            worst = min(slower, key=lambda p: p[1]) if slower else None
            body.append(
                [
                    f"vs {display_name(b)}",
                    format_ratio(geomean(values)) if values else "-",
                    format_ratio(min(values)) if values else "-",
                    format_ratio(max(values)) if values else "-",
                    len(values),
                    len(slower),
                    f"{worst[0].head.label(g.mode)} {worst[0].label} ({worst[1]:.2f}x)" if worst else "-",
                ]
            )
        out += md_table(
            ["baseline", "geomean", "min", "max", "configs", f"{display_name(g.primary)} slower", "worst"],
            body,
        )
        out.append("")
    return out


def latency_section(tables: Sequence[Grid]) -> list[str]:
    out = ["## Latency (median)", ""]
    for g in tables:
        out += [f"### {g.mode} · {g.timer}", ""]
        lat = [f"{display_name(b)} [{g.mode}]" for b in g.backends]
        rat = [f"vs {display_name(b)}" for b in g.backends[1:]]
        body = []
        for head, lines in g.groups:
            for line in lines:
                prim = line.cells.get(g.primary)
                body.append(
                    [head.label(g.mode), line.label, head.h_qk, head.h_v]
                    + [latency_cell(line.cells.get(b)) for b in g.backends]
                    + [format_ratio(ratio(line.cells.get(b), prim)) for b in g.backends[1:]]
                )
        out += md_table(
            ["Model Config", "Seqlens", "h_qk", "h_v", *lat, *rat],
            body,
            "ll" + "r" * (2 + len(lat) + len(rat)),
        )
        out.append("")
    return out


def _workload_key(r: Row, backend: bool = True) -> tuple:
    """A row's workload, optionally with its backend, never its timer: numerics are timer-free."""
    key = (r.gpu, r.mode, r.h_qk, r.h_v, r.k, r.v, tuple(r.seqlens), r.dtype, r.gate, r.zero_gate_frac, r.seed)
    return (r.backend, *key) if backend else key


def _unique_by_config(rows: Iterable[Row]) -> list[Row]:
    """One checked row per (config, backend): numerics do not depend on the timer, and only PASSED
    or INCORRECT rows were compared with the reference (others carry no meaningful error)."""
    seen: dict[tuple, Row] = {}
    for r in rows:
        if r.rel_l2 and r.status in CHECKED:
            seen.setdefault(_workload_key(r), r)
    return list(seen.values())


def numerics_section(rows: Sequence[Row]) -> list[str]:
    checked = _unique_by_config(rows)
    out = ["## Numerics", ""]
    if not checked:
        return [*out, "No row carries numerics (rel_l2).", ""]
    worst: dict[tuple[str, str], tuple[float, Row, int]] = {}
    for r in checked:
        for name, value in r.rel_l2.items():
            key = (r.backend, name)
            prev = worst.get(key)
            bad = value is None or not math.isfinite(value)
            score = math.inf if bad else float(value)
            n = (prev[2] if prev else 0) + 1
            worst[key] = (score, r, n) if prev is None or score > prev[0] else (prev[0], prev[1], n)
    order = {b: i for i, b in enumerate(backends_of(rows))}
    body = [
        [display_name(b), name, _fmt(score), _config_text(r), r.status, n]
        for (b, name), (score, r, n) in sorted(worst.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))
    ]
    out += ["Worst relative L2 error against the float64 reference, per backend and output:", ""]
    out += md_table(["backend", "output", "worst rel_l2", "config", "status", "rows"], body, "llrllr")
    out.append("")
    out += _relative_to_fla(checked, order)
    return out


def _relative_to_fla(checked: Sequence[Row], order: dict[str, int]) -> list[str]:
    """Each backend's error over FLA's on the same inputs: 'as accurate as FLA' is a comparison."""
    fla = {_workload_key(r, backend=False): r for r in checked if r.backend == "fla"}
    if not fla:
        return []
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in checked:
        ref = fla.get(_workload_key(r, backend=False))
        if r.backend == "fla" or ref is None:
            continue
        for name, value in r.rel_l2.items():
            base = ref.rel_l2.get(name)
            if value is not None and base and base > 0 and math.isfinite(value):
                ratios.setdefault((r.backend, name), []).append(float(value) / float(base))
    if not ratios:
        return []
    body = [
        [display_name(b), name, _fmt(geomean(v)), _fmt(max(v)), len(v)]
        for (b, name), v in sorted(ratios.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))
    ]
    return [
        "Error relative to FLA's error on the same config (1.0 = as accurate as FLA):",
        "",
        *md_table(["backend", "output", "geomean ratio", "max ratio", "configs"], body, "llrrr"),
        "",
    ]


def roofline_section(rows: Sequence[Row]) -> list[str]:
    """Achieved rates per backend; % of the roofline floor only where the GPU was calibrated."""
    measured = [r for r in rows if r.passed and (r.pct_roofline, r.tflops, r.gbps) != (None, None, None)]
    if not measured:
        return []
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in measured:
        groups.setdefault((r.backend, r.mode, r.timer), []).append(r)
    body = []
    for (b, m, t), items in groups.items():
        pct = [float(r.pct_roofline) for r in items if r.pct_roofline is not None]
        tf = [float(r.tflops) for r in items if r.tflops is not None]
        gb = [float(r.gbps) for r in items if r.gbps is not None]
        body.append(
            [
                display_name(b),
                m,
                t,
                len(items),
                _fmt(statistics.median(pct) if pct else None, ".1f"),
                _fmt(max(pct) if pct else None, ".1f"),
                _fmt(max(tf) if tf else None, ".3g"),
                _fmt(max(gb) if gb else None, ".3g"),
            ]
        )
    header = ["backend", "mode", "timer", "rows", "median % roofline", "max % roofline", "max TFLOP/s", "max GB/s"]
    out = ["## Roofline", "", *md_table(header, body, "lll"), ""]
    if not any(r.pct_roofline is not None for r in measured):
        out += ["No row carries % of the roofline floor (the device was not calibrated).", ""]
    return out


def _throttled(row: Row) -> bool:
    """From the recorded NVML readings when present (the set of slowing bits may have been refined since)."""
    if row.health:
        return is_throttled(row.health.get("before") or {}, row.health.get("after") or {})
    return row.throttled


def throttle_section(rows: Sequence[Row]) -> list[str]:
    throttled = [r for r in rows if _throttled(r)]
    out = ["## Device health", ""]
    if not throttled:
        return [*out, "No row was measured while the GPU reported throttling.", ""]
    out += [f"**{len(throttled)} row(s) measured while throttled**; treat their times with care:", ""]
    body = [
        [
            display_name(r.backend),
            _config_text(r),
            r.timer or "-",
            format_ms(r.median_ms),
            describe_health(r.health) if r.health else "-",
        ]
        for r in throttled
    ]
    return [*out, *md_table(["backend", "config", "timer", "median", "health (before/after)"], body, "lllrl"), ""]


def host_bound_section(rows: Sequence[Row], threshold: float = HOST_BOUND_RATIO) -> list[str]:
    return ["## Host-bound rows", "", *_host_pairs_part(rows, threshold), *_host_time_part(rows)]


def _host_time_part(rows: Sequence[Row], fraction: float = HOST_TIME_FRACTION) -> list[str]:
    """Events rows that recorded the host's own time per call, where it reaches `fraction` of their median."""
    flagged, recorded = host_timed_rows(rows, fraction)
    if not recorded:
        return []
    if not flagged:
        return [f"Of the {recorded} cuda-events rows that record the host's time per call, none spends "
                f">= {fraction:.0%} of its median in the host.", ""]  # fmt: skip
    out = [f"**{len(flagged)} of {recorded}** cuda-events rows that record the host's time per call spend >= "
           f"{fraction:.0%} of their median in the library's host path (the call's entry to return): their latency "
           "is at least partly host time.", ""]  # fmt: skip
    body = [
        [display_name(r.backend), _config_text(r), r.git_sha or "-", format_ms(r.median_ms),
         format_ms(r.host_median_ms), f"{r.host_median_ms / r.median_ms:.2f}"]
        for r in flagged
    ]  # fmt: skip
    header = ["backend", "config", "commit", "events", "host per call", "host / events"]
    return [*out, *_details(f"{len(flagged)} rows", md_table(header, body, "lllrrr"), limit=20)]


def _host_pairs_part(rows: Sequence[Row], threshold: float) -> list[str]:
    """Configs timed with both GPU timers at one commit whose events median is >= threshold x the graph's."""
    flagged, pairs = host_bound_rows(rows, threshold)
    if not pairs:
        return ["No config was timed with both cuda-events and cuda-graph at one commit.", ""]
    if not flagged:
        return [f"None of the {pairs} configs timed with both timers at one commit reads >= {threshold:g}x "
                "slower under cuda-events than under cuda-graph.", ""]  # fmt: skip
    out = [
        f"**{len(flagged)} of {pairs}** configs timed with both timers at one commit read >= {threshold:g}x slower "
        "under cuda-events than under cuda-graph: the GPU waited for the library's host work (argument handling, "
        "allocations, launches), so their events latency is host time (it moves between processes), not kernel time.",
        "",
    ]
    body = [
        [
            display_name(p.events.backend),
            _config_text(p.events),
            p.events.git_sha or "-",
            format_ms(p.events.median_ms),
            f"{format_ms(p.events.q1_ms)} - {format_ms(p.events.q3_ms)}" if p.events.q1_ms and p.events.q3_ms else "-",
            format_ms(p.graph.median_ms),
            f"{p.ratio:.2f}x",
        ]
        for p in flagged
    ]
    header = ["backend", "config", "commit", "events", "events q1 - q3", "graph", "events / graph"]
    return [*out, *_details(f"{len(flagged)} rows", md_table(header, body, "lllrrrr"), limit=20)]


def _ratio_cells(c) -> list[str]:
    """The leading cells of a compared-ratio row: mode, timer, config and which ratio."""
    return [
        c.record.mode,
        c.timer,
        c.record.model,
        c.record.label,
        f"{c.record.h_qk}/{c.record.h_v}",
        f"{display_name(c.baseline)} / {display_name(c.record.primary)}",
    ]


def anchors_section(rows: Sequence[Row], anchors: AnchorTable | None, threshold: float = THRESHOLD) -> list[str]:
    out = ["## Comparison with FlashQLA's published ratios", ""]
    if anchors is None:
        return [*out, "No anchors file was given (`--anchors PATH`), so no comparison was made.", ""]
    their_versions = " | ".join(f"{k}: {v}" for k, v in anchors.versions.items()) or "unknown"
    out += [
        f"Source: `{anchors.source}` (GPU {anchors.gpu or 'unknown'}, "
        f"timer {anchors.timer or 'unknown'}, statistic {anchors.statistic}, versions {their_versions}).",
        f"A ratio is flagged when |ours / theirs - 1| > {threshold:.0%}. Ratios are other / "
        "flash_qla latency, as in their table.",
        "",
    ]
    comps = compare_with_anchors(rows, anchors)
    if not comps:
        return [*out, "None of our rows matches a published configuration.", ""]
    summary = summarize_comparisons(comps, threshold)
    out += md_table(
        [
            "mode",
            "timer",
            "ratio",
            "compared",
            f"> {threshold:.0%} off",
            "not comparable",
            "geomean ours/theirs",
        ],
        (
            [
                s.mode,
                s.timer,
                f"{display_name(s.baseline)} / {display_name(s.primary)}",
                s.compared,
                s.flagged,
                s.not_comparable,
                _fmt(s.geomean_ours_over_theirs, ".2f"),
            ]
            for s in summary
        ),
        "lll",
    )
    out.append("")
    flagged = [c for c in comps if c.flagged(threshold)]
    if flagged:
        shared = common_reasons(flagged)
        out += [
            f"{len(flagged)} ratios differ from the published ones by more than {threshold:.0%}. "
            + (f"Differences common to all of them: {'; '.join(shared)}. " if shared else "")
            + "The reason column adds what is particular to each line (which backend's time moved).",
            "",
        ]
        body = [
            [
                *_ratio_cells(c),
                format_ratio(c.theirs),
                format_ratio(c.ours),
                f"{c.deviation:+.0%}",
                "; ".join(r for r in c.reasons if r not in shared) or "-",
            ]
            for c in flagged
        ]
        header = [
            "mode",
            "timer",
            "Model Config",
            "Seqlens",
            "h_qk/h_v",
            "ratio",
            "theirs",
            "ours",
            "diff",
            "reason",
        ]
        out += [*md_table(header, body, "llllllrrrl"), ""]
    else:
        out += [f"No compared ratio differs from the published one by more than {threshold:.0%}.", ""]
    missing = [c for c in comps if c.ours is None]
    if missing:
        out += ["Published ratios we could not reproduce a number for:", ""]
        body = [
            [
                *_ratio_cells(c),
                c.unavailable,
            ]
            for c in missing
        ]
        header = ["mode", "timer", "Model Config", "Seqlens", "h_qk/h_v", "ratio", "why no ratio"]
        table = md_table(header, body, "l" * len(header))
        out += _details(f"{len(missing)} ratios", table)
    return out


def render_markdown(
    rows: Iterable[Row],
    *,
    anchors: AnchorTable | None = None,
    primary: str | None = None,
    threshold: float = THRESHOLD,
) -> str:
    """The whole Markdown report of a set of rows."""
    rows = list(rows)
    prim, tables = grids(rows, primary)
    timers = list(dict.fromkeys(g.timer for g in tables))
    gpu = ", ".join(dict.fromkeys(r.gpu for r in rows if r.gpu)) or "unknown GPU"
    out = [
        f"# qla-bench results: {gpu}",
        "",
        f"Primary backend: **{display_name(prim)}** (ratios are other / primary latency; > 1 means "
        f"{display_name(prim)} is faster). Statistic: median.",
        "",
    ]
    out += provenance_section(rows, timers)
    out += status_section(rows)
    out += speedup_section(tables)
    out += latency_section(tables)
    out += numerics_section(rows)
    out += roofline_section(rows)
    out += throttle_section(rows)
    out += host_bound_section(rows)
    out += anchors_section(rows, anchors, threshold)
    return "\n".join(out).rstrip() + "\n"
