"""Parsing FlashQLA's published tables (the real shared files) and locating them."""

from __future__ import annotations

from pathlib import Path

import pytest

from qla_bench.errors import UsageError
from qla_bench.report.anchors import default_anchors_path, load_anchors, parse_anchors


def raw_forward_lines(path: Path) -> list[list[str]]:
    """Whitespace tokens of every forward data line, read without the parser under test."""
    text = path.read_text().split(">>> FORWARD BENCHMARKS")[1].split(">>> BACKWARD")[0]
    return [line.split() for line in text.splitlines() if line.strip().endswith("x") and "ms" in line]


@pytest.mark.parametrize("gpu", ["H200", "GB200"])
def test_published_file_parses_completely(gpu, published):
    path = published(gpu)
    table = load_anchors(path)
    assert table.gpu == f"NVIDIA {gpu}"
    assert table.timer == "cudagraph" and table.statistic == "mean" and table.head_dim == 128
    assert set(table.versions) == {"torch", "fla", "flashinfer", "tilelang"}
    fwd = [r for r in table.records if r.mode == "fwd"]
    bwd = [r for r in table.records if r.mode == "bwd"]
    assert (len(fwd), len(bwd)) == (171, 32)
    raw = raw_forward_lines(path)
    assert len(raw) == len(fwd)
    for rec, tokens in zip(fwd, raw, strict=True):
        label, h_qk, h_v, fq, fi, fla, vs_fla, vs_fi = tokens[-8:]
        assert (rec.label, rec.h_qk, rec.h_v) == (label, int(h_qk), int(h_v))
        assert rec.latency_ms == {"flashqla": float(fq[:-2]), "flashinfer": float(fi[:-2]), "fla": float(fla[:-2])}
        assert rec.ratios == {"fla": float(vs_fla[:-1]), "flashinfer": float(vs_fi[:-1])}
        assert rec.primary == "flashqla" and sum(rec.seqlens) == rec.total_tokens


def test_published_ratios_match_their_latencies(h200_anchors):
    """'vs X' is X / flash_qla: a swapped column mapping would break this for most lines."""
    for rec in load_anchors(h200_anchors).records:
        for backend, value in rec.ratios.items():
            derived = rec.latency_ms[backend] / rec.latency_ms[rec.primary]
            assert value == pytest.approx(derived, rel=0.03, abs=0.02), (rec.model, rec.label, backend)


def test_published_grid_shape_and_order(h200_anchors):
    table = load_anchors(h200_anchors)
    fwd = [r for r in table.records if r.mode == "fwd"]
    heads = list(dict.fromkeys((r.model, r.h_qk, r.h_v) for r in fwd))
    assert len(heads) == 9 and heads[0] == ("397B/122B TP8", 2, 8) and heads[-1] == ("Sym h32", 32, 32)
    mixes = list(dict.fromkeys(r.label for r in fwd))
    assert len(mixes) == 19 and mixes[:2] == ["1x32768", "1x16384"]
    full = ("1x32768", "28672+4096", "16384+16384", "8192x4")
    assert all(r.total_tokens == 32768 for r in fwd if r.label in full)
    bwd = [r for r in table.records if r.mode == "bwd"]
    assert {(r.total_tokens, r.n_seq) for r in bwd} == {(t, n) for t in (8192, 32768) for n in (1, 2, 4, 8)}
    assert {r.model for r in bwd} == {"hk16_hv32", "hk8_hv16", "hk4_hv8", "hk2_hv4"}
    assert all(set(r.ratios) == {"fla"} for r in bwd)


def test_default_path_is_next_to_the_repo(tmp_path):
    repo = tmp_path / "repo"
    folder = tmp_path / "shared" / "anchors"
    folder.mkdir(parents=True)
    repo.mkdir()
    target = folder / "flashqla_benchmark_results_H200.txt"
    target.write_text("x")
    assert default_anchors_path("H200", root=repo) == target
    assert default_anchors_path("NVIDIA H200", root=repo) == target
    assert default_anchors_path("cpu", root=repo) is None


def test_bad_anchor_input_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_anchors(tmp_path / "missing.txt")
    with pytest.raises(UsageError, match="no benchmark lines"):
        parse_anchors("GPU: X\nnothing else\n")
    broken = ">>> FORWARD BENCHMARKS\nModel Config  Seqlens  h_qk  h_v  FLA [fwd]\n---\nA  1x64  2  8\n"
    with pytest.raises(UsageError, match="cells for"):
        parse_anchors(broken)
