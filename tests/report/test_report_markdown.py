"""report.md: sections, status counts, geomean speedups, numerics, roofline and health."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from qla_bench.report.markdown import render_markdown

SECTIONS = [
    "## Provenance",
    "## Status per backend",
    "## Speedups",
    "## Latency (median)",
    "## Numerics",
    "## Device health",
    "## Comparison with FlashQLA's published ratios",
]


def section(text: str, title: str) -> str:
    return text.split(title, 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]


def test_sections_in_order(rows):
    text = render_markdown(rows)
    positions = [text.index(title) for title in SECTIONS]
    assert positions == sorted(positions)
    assert "## Roofline" not in text  # no row carries pct_roofline
    assert "No anchors file was given" in section(text, "## Comparison")


def test_provenance(rows):
    prov = section(render_markdown(rows), "## Provenance")
    assert "NVIDIA H200" in prov and "0123abc" in prov and "FLA_FLASH_QLA=0" in prov
    assert "Timer=cuda-graph, Statistic=median" in prov
    for dist, version in rows[0].versions.items():
        assert f"{dist}: {version}" in prov


def test_status_counts_per_backend(rows):
    body = table_rows(section(render_markdown(rows), "## Status per backend"))
    header = body[0]
    counts = Counter((r.backend, r.mode, r.status) for r in rows)
    names = {"qla": "qla", "flashqla": "flash_qla", "fla": "FLA"}
    for backend, mode, status in counts:
        line = next(x for x in body if x[:2] == [names[backend], mode])
        assert int(line[header.index(status)]) == counts[(backend, mode, status)]
    assert "not on this GPU" in section(render_markdown(rows), "## Status per backend")


def test_geomean_speedups(rows, row):
    rows = [*rows, row("qla", (1024,), 0.5), row("flashqla", (1024,), 0.4), row("fla", (1024,), 1.0)]
    speed = section(render_markdown(rows), "## Speedups")
    fwd = speed.split("(bwd")[0]
    lines = {x[0]: x for x in table_rows(fwd)}
    qla = {(r.model, r.label): r.median_ms for r in rows if r.backend == "qla" and r.mode == "fwd"}
    for backend, name in (("flashqla", "vs flash_qla"), ("fla", "vs FLA")):
        ratios = [
            r.median_ms / qla[(r.model, r.label)] for r in rows if r.backend == backend and r.mode == "fwd" and r.passed
        ]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        _, g, lo, hi, n, slower, _ = lines[name]
        assert (g, lo, hi) == (f"{geo:.2f}x", f"{min(ratios):.2f}x", f"{max(ratios):.2f}x")
        assert int(n) == len(ratios) and int(slower) == sum(x < 1 for x in ratios)
    assert "1x1024 (0.80x)" in lines["vs flash_qla"][-1]  # the planted config where qla is slower


def test_latency_tables_per_mode_and_timer(rows):
    lat = section(render_markdown(rows), "## Latency (median)")
    assert "### fwd · cuda-graph" in lat and "### bwd · cuda-graph" in lat
    fwd = lat.split("### bwd")[0]
    body = table_rows(fwd)
    assert body[0][:6] == ["Model Config", "Seqlens", "h_qk", "h_v", "qla [fwd]", "flash_qla [fwd]"]
    assert len(body) == 1 + 4 and any("UNSUPP" in line for line in body)


def test_numerics_worst_and_relative_to_fla(rows):
    num = section(render_markdown(rows), "## Numerics")
    worst = {(x[0], x[1]): x for x in table_rows(num.split("Error relative")[0])}
    for backend, name in (("fla", "FLA"), ("qla", "qla")):
        expected = max(r.rel_l2["o"] for r in rows if r.backend == backend and r.rel_l2)
        assert float(worst[(name, "o")][2]) == pytest.approx(expected, rel=1e-2)
    relative = {(x[0], x[1]): x for x in table_rows(num.split("Error relative")[1])}
    # qla's error is 1/3 of FLA's on every config both checked (fixture: 0.002 * latency factor)
    assert float(relative[("qla", "o")][2]) == pytest.approx(1 / 3, rel=1e-2)

    # FLA's UNSUPPORTED row was never compared with the reference: it is no baseline for qla
    def checked(backend):
        return {(r.mode, r.h_qk, tuple(r.seqlens)) for r in rows if r.backend == backend and r.passed}

    assert int(relative[("qla", "o")][4]) == len(checked("qla") & checked("fla"))
    assert ("FLA", "o") not in relative


def test_roofline_and_throttled_rows(rows):
    for i, r in enumerate(rows):
        if r.passed:
            r.pct_roofline, r.tflops, r.gbps = 10.0 + i, 50.0 + i, 1000.0
    rows[0].throttled = True
    rows[0].health = {
        "before": {"throttle_reasons": 0x1, "sm_clock_mhz": 1980, "temp_c": 50},
        "after": {"throttle_reasons": 0x8, "sm_clock_mhz": 1755, "temp_c": 61},
    }
    # flagged when measured with an older bit set, but idle + app clocks are benign: not listed
    rows[1].throttled = True
    rows[1].health = {"before": {"throttle_reasons": 0x3}, "after": {"throttle_reasons": 0x1}}
    text = render_markdown(rows)
    roof = table_rows(section(text, "## Roofline"))
    qla = next(x for x in roof if x[:3] == ["qla", "fwd", "cuda-graph"])
    pcts = sorted(r.pct_roofline for r in rows if r.backend == "qla" and r.mode == "fwd")
    assert float(qla[5]) == pytest.approx(max(pcts)) and int(qla[3]) == len(pcts)
    health = section(text, "## Device health")
    assert "1 row(s) measured while throttled" in health
    assert "HW slowdown (after); SM 1755-1980 MHz; 50-61 C" in health
    assert "while throttled" not in section(render_markdown(rows[1:]), "## Device")


def test_describe_health_names_only_slowing_reasons():
    from qla_bench.provenance import describe_health, is_throttled, throttle_names

    assert throttle_names(0x4 | 0x40) == ["SW power cap", "HW thermal"]
    h = {"before": {"throttle_reasons": 0x4, "power_w": 690.0}, "after": {"throttle_reasons": 0x2, "power_w": 700.4}}
    assert describe_health(h) == "SW power cap (before); 690-700 W"
    assert is_throttled(h["before"], h["after"]) and not is_throttled(h["after"], {})
    assert describe_health({}) == "-"


def test_numerics_count_each_config_once_across_timers(rows):
    events = [type(r)(**{**r.to_dict(), "timer": "cuda-events"}) for r in rows]
    worst = {(x[0], x[1]): x for x in table_rows(section(render_markdown(rows + events), "## Numerics"))}
    checked_fla = sum(1 for r in rows if r.backend == "fla" and r.passed and r.rel_l2)
    assert int(worst[("FLA", "o")][-1]) == checked_fla


def test_single_backend_and_uncalibrated_rates(row):
    rows = [row("torch", (256,), 2.0, timer="cpu-wall", tflops=0.01), row("torch", (64, 64), 1.0, timer="cpu-wall")]
    text = render_markdown(rows)
    assert "Only one backend was measured" in section(text, "## Speedups")
    roof = section(text, "## Roofline")
    assert "not calibrated" in roof
    (line,) = [x for x in table_rows(roof) if x[0] == "torch"]
    assert line[3:] == ["1", "-", "-", "0.01", "-"]
