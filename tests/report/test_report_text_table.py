"""The FlashQLA-style text table: columns, ratios, status cells, ordering, header provenance."""

from __future__ import annotations

import re

import pytest

from qla_bench.errors import UsageError
from qla_bench.report.anchors import parse_anchors
from qla_bench.report.text_table import render_text_table


def section(text: str, title: str) -> list[str]:
    """Lines of one '>>> TITLE BENCHMARKS' section up to the next rule or the end marker."""
    lines = text.splitlines()
    start = lines.index(f">>> {title} BENCHMARKS")
    out = []
    for line in lines[start + 1 :]:
        if line.startswith("=") or line.startswith("Benchmark Finished"):
            break
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return out


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def data_lines(sec: list[str]) -> list[list[str]]:
    return [cells(line) for line in sec[2:] if line.strip()]


def test_forward_columns_in_flashqla_order(rows):
    header = section(render_text_table(rows), "FORWARD")[0]
    expected = ["Model Config", "Seqlens", "h_qk", "h_v", "qla [fwd]", "flash_qla [fwd]", "FLA [fwd]"]
    expected += ["vs flash_qla", "vs FLA"]
    positions = [header.index(name) for name in expected]
    assert positions == sorted(positions)
    assert section(render_text_table(rows), "FORWARD")[1] == "-" * len(header)


def test_latencies_and_ratios_come_from_the_rows(rows):
    lines = data_lines(section(render_text_table(rows), "FORWARD"))
    by_key = {(r.model, r.label, r.backend): r for r in rows if r.mode == "fwd"}
    assert len(lines) == 4
    for line in lines:
        model, label, h_qk, h_v, qla, fq, fla, vs_fq, vs_fla = line
        q = by_key[(model, label, "qla")]
        assert (int(h_qk), int(h_v)) == (q.h_qk, q.h_v)
        assert qla == f"{q.median_ms:.3f}ms"
        assert fq == f"{by_key[(model, label, 'flashqla')].median_ms:.3f}ms"
        assert vs_fq == f"{by_key[(model, label, 'flashqla')].median_ms / q.median_ms:.2f}x"
        f = by_key[(model, label, "fla")]
        if f.passed:
            assert fla == f"{f.median_ms:.3f}ms"
            assert vs_fla == f"{f.median_ms / q.median_ms:.2f}x"
        else:
            assert (fla, vs_fla) == ("UNSUPP", "-")


@pytest.mark.parametrize("status,cell", [("INCORRECT", "INCORRECT"), ("ERROR", "ERROR"), ("OOM", "OOM")])
def test_non_passed_cells_show_the_status(row, status, cell):
    rows = [row("qla", (4096,), 0.1), row("fla", (4096,), 0.5, status=status)]
    (line,) = data_lines(section(render_text_table(rows), "FORWARD"))
    assert line[-2:] == [cell, "-"]


def test_order_follows_first_seen_head_then_mix(rows):
    def order(rs):
        lines = data_lines(section(render_text_table(rs), "FORWARD"))
        return [(line[0], line[1]) for line in lines]

    forward = order(rows)
    assert forward == [
        ("397B/122B TP8", "1x32768"),
        ("397B/122B TP8", "8192x4"),
        ("Sym h32", "1x32768"),
        ("Sym h32", "8192x4"),
    ]
    assert order(list(reversed(rows))) == list(reversed(forward))


def test_blank_line_between_head_configs(rows):
    sec = section(render_text_table(rows), "FORWARD")
    blanks = [i for i, line in enumerate(sec) if not line.strip()]
    assert len(blanks) == 1
    assert cells(sec[blanks[0] - 1])[0] != cells(sec[blanks[0] + 1])[0]


def test_primary_choice(rows):
    text = render_text_table(rows, primary="flashqla")
    header = cells(section(text, "FORWARD")[0])
    assert header[4:] == ["flash_qla [fwd]", "qla [fwd]", "FLA [fwd]", "vs qla", "vs FLA"]
    first = data_lines(section(text, "FORWARD"))[0]
    assert first[7] == f"{1.0 / 1.25:.2f}x"  # vs qla = qla / flash_qla
    without_qla = [r for r in rows if r.backend != "qla"]
    assert "Primary=flash_qla" in render_text_table(without_qla)
    with pytest.raises(UsageError, match="--primary"):
        render_text_table(rows, primary="flashinfer")


def test_header_carries_gpu_timer_versions_and_env(rows, row):
    rows = [*rows, row("qla", (4096,), 0.1, versions={"torch": "2.12.0", "tilelang": "0.1.15"})]
    text = render_text_table(rows, models_line="Qwen3.5 family, d=128")
    head = text.split(">>> FORWARD")[0]
    assert head.startswith("GPU: NVIDIA H200\nModels: Qwen3.5 family, d=128\n")
    assert "Timer=cuda-graph" in head and "Statistic=median" in head and "Repeats=20" in head
    versions = head.split("Library Versions:\n")[1].splitlines()[0]
    assert "torch: 2.11.0+cu130/2.12.0" in versions
    assert "fla-core: 0.6.0" in versions and "flash-qla: 0.1.3" in versions
    assert "FLA_FLASH_QLA=0" in head and "0123abc" in head
    assert render_text_table(rows, gpu="H200").startswith("GPU: H200\n")
    assert text.rstrip().endswith("Benchmark Finished.")


def test_backward_section_in_flashqla_layout(rows):
    sec = section(render_text_table(rows), "BACKWARD")
    header = cells(sec[0])
    assert header == ["Model Config", "SeqLen", "h_qk", "h_v", "#seq", "flash_qla [bwd]", "FLA [bwd]", "Speedup"]
    (line,) = data_lines(sec)
    assert line == ["hk16_hv32", "8k_2seq", "16", "32", "2", "0.800ms", "1.600ms", "2.00x"]


def test_mixed_timers_give_one_block_each(rows):
    events = [
        type(r)(**{**r.to_dict(), "timer": "cuda-events", "median_ms": r.median_ms * 2}) for r in rows if r.passed
    ]
    text = render_text_table(rows + events)
    assert "Timers=cuda-graph, cuda-events" in text
    assert text.count(">>> FORWARD BENCHMARKS") == 2
    blocks = text.split("[Timer=")[1:]
    assert [b.split(",")[0] for b in blocks] == ["cuda-graph", "cuda-events"]
    for block in blocks:  # the never-timed UNSUPPORTED row shows under both timers
        assert "UNSUPP" in block
    graph_first = data_lines(section("[Timer=" + blocks[0], "FORWARD"))[0]
    events_first = data_lines(section("[Timer=" + blocks[1], "FORWARD"))[0]
    assert float(events_first[4][:-2]) == pytest.approx(2 * float(graph_first[4][:-2]), abs=1e-3)


def test_round_trip_through_the_anchor_parser(rows):
    table = parse_anchors(render_text_table(rows))
    fwd = [r for r in table.records if r.mode == "fwd"]
    assert len(fwd) == 4 and table.timer == "cuda-graph" and table.statistic == "median"
    by_key = {(r.h_qk, tuple(r.seqlens), r.backend): r for r in rows}
    for rec in fwd:
        assert rec.primary == "qla"
        for backend, ms in rec.latency_ms.items():
            assert ms == pytest.approx(by_key[(rec.h_qk, rec.seqlens, backend)].median_ms, abs=5e-4)
    (bwd,) = [r for r in table.records if r.mode == "bwd"]
    assert (bwd.total_tokens, bwd.n_seq, bwd.ratios) == (8192, 2, {"fla": 2.0})
