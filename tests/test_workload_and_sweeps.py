"""Workload parsing and sweep files: the grids match FlashQLA's published tables; bad input is exit-3 clean."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qla_bench.errors import UsageError
from qla_bench.sweeps import available_sweeps, load_sweep, override_sweep, parse_sweep, random_split
from qla_bench.workload import HeadConfig, Workload, parse_heads, parse_seqlens, seqlens_label

ANCHORS = Path(__file__).resolve().parents[2] / "shared" / "anchors" / "flashqla_benchmark_results_H200.txt"


@pytest.mark.parametrize(
    "text,lens",
    [
        ("32768", (32768,)),
        ("1x32768", (32768,)),
        ("8192x4", (8192,) * 4),
        ("28672+4096", (28672, 4096)),
        ("1", (1,)),
        ("1+1+1", (1, 1, 1)),
    ],
)
def test_parse_seqlens(text, lens):
    assert parse_seqlens(text) == lens


@pytest.mark.parametrize(
    "lens,label",
    [((32768,), "1x32768"), ((8192,) * 4, "8192x4"), ((16384, 16384), "16384+16384"), ((1000, 3096), "1000+3096")],
)
def test_label_round_trip(lens, label):
    assert seqlens_label(lens) == label and parse_seqlens(label) == lens


@pytest.mark.parametrize("bad", ["", "abc", "0", "12x", "-5", "3+0"])
def test_bad_seqlens(bad):
    with pytest.raises(UsageError, match="seqlens"):
        parse_seqlens(bad)


def test_heads():
    assert parse_heads("16/64") == HeadConfig(16, 64)
    assert HeadConfig(16, 48).ratio == 3
    with pytest.raises(UsageError, match="not a multiple"):
        parse_heads("16/40")
    with pytest.raises(UsageError, match="H_QK/H_V"):
        parse_heads("16")


def test_workload_seed_is_stable_and_config_dependent():
    a = Workload(HeadConfig(2, 8), (100, 28))
    b = Workload(HeadConfig(2, 8), (100, 28))
    c = Workload(HeadConfig(2, 8), (28, 100))
    assert a.seed() == b.seed() != c.seed()
    assert a.n_chunks == 2 + 1 and a.total_tokens == 128


def test_every_shipped_sweep_loads():
    names = set(available_sweeps())
    assert {"qwen35-fwd", "qwen35-bwd", "qwen35-tp", "smoke", "ci", "cpu-smoke", "edge"} <= names
    for n in names:
        s = load_sweep(n)
        assert s.points, n


def test_qwen35_fwd_is_flashqla_grid():
    s = load_sweep("qwen35-fwd")
    assert len(s.points) == 171 and all(p.workload for p in s.points)
    heads = list(dict.fromkeys((p.model, p.h_qk, p.h_v) for p in s.points))
    assert len(heads) == 9
    assert ("397B/122B TP8", 2, 8) in heads and ("27B TP1", 16, 48) in heads and ("Sym h32", 32, 32) in heads
    if ANCHORS.is_file():
        fwd = ANCHORS.read_text().split(">>> BACKWARD")[0]
        published = set()
        for line in fwd.splitlines():
            m = re.match(r"^(.+?)\s{2,}(\S+)\s+(\d+)\s+(\d+)\s+[\d.]+ms", line)
            if m:
                published.add((m.group(2), int(m.group(3)), int(m.group(4))))
        ours = {(p.label, p.h_qk, p.h_v) for p in s.points}
        assert ours == published


def test_qwen35_bwd_splits():
    s = load_sweep("qwen35-bwd")
    assert len(s.points) == 32
    for p in s.points:
        total = 8192 if p.label.startswith("8k") else 32768
        n = int(p.label.split("_")[1].removesuffix("seq"))
        assert sum(p.seqlens) == total and len(p.seqlens) == n
    assert load_sweep("qwen35-bwd").points[2].seqlens == s.points[2].seqlens  # seeded


def test_random_split_properties():
    for n in (1, 2, 4, 8):
        parts = random_split(8192, n, seed=3)
        assert len(parts) == n and sum(parts) == 8192 and min(parts) >= 1
    with pytest.raises(UsageError):
        random_split(3, 4, 0)


def test_tp_form_derives_per_gpu_heads():
    s = load_sweep("qwen35-tp")
    h_v = {p.h_v for p in s.points}
    assert {64, 48, 32, 24, 16, 8} <= h_v
    data = {"mode": "fwd", "seqlens": ["1x64"], "heads": [{"model": "odd", "h_qk": 6, "h_v": 12, "tp": [1, 4]}]}
    pts = parse_sweep(data, "t").points
    assert pts[0].workload is not None and pts[1].workload is None
    assert "TP4" in pts[1].skip_reason


@pytest.mark.parametrize(
    "data,match",
    [
        ({"mode": "sideways", "seqlens": ["1x64"], "heads": [{"h_qk": 1, "h_v": 1}]}, "mode"),
        ({"seqlens": ["1x64"]}, "heads"),
        ({"seqlens": ["1x64"], "heads": [{"h_qk": 1}]}, "h_v"),
        ({"heads": [{"h_qk": 1, "h_v": 1}]}, "sequence mixes"),
        ({"seqlens": ["1x64"], "heads": [{"h_qk": 1, "h_v": 1, "tp": [0]}]}, "tp"),
        ({"seqlens": ["1x64"], "gate": "spicy", "heads": [{"h_qk": 1, "h_v": 1}]}, "gate"),
    ],
)
def test_malformed_sweeps(data, match):
    with pytest.raises(UsageError, match=match):
        parse_sweep(data, "bad")


def test_unknown_sweep_and_bad_toml(tmp_path):
    with pytest.raises(UsageError, match="unknown sweep"):
        load_sweep("nope")
    bad = tmp_path / "bad.toml"
    bad.write_text("heads = [[[")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_sweep(str(bad))


def test_override():
    s = override_sweep(load_sweep("smoke"), heads="16/32,2/8", seqlens="1x32768,8192x4")
    assert [(p.h_qk, p.h_v, p.label) for p in s.points] == [
        (16, 32, "1x32768"),
        (16, 32, "8192x4"),
        (2, 8, "1x32768"),
        (2, 8, "8192x4"),
    ]
    with pytest.raises(UsageError, match="not a multiple"):
        override_sweep(load_sweep("smoke"), heads="16/33")
