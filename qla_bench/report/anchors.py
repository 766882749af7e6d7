"""Read FlashQLA's published benchmark tables (benchmark_results_<GPU>.txt) into records.

The published ratios are the numbers users quote; the report compares ours with them. The parser
reads the header (GPU, models, config, library versions) and both sections by their column header,
so it also reads the tables qla-bench writes (a round trip the tests use).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..workload import parse_seqlens
from .grid import DISPLAY_NAMES

# FlashQLA's table is a CUDA-graph benchmark reporting the mean over replays (its 'Backend=cudagraph')
PUBLISHED_STATISTIC = "mean"
CANONICAL = {v.lower(): k for k, v in DISPLAY_NAMES.items()}
_HEADER_TOKEN = re.compile(r"Model Config|#seq|\S+ \[(?:fwd|bwd|train)\]|vs \S+|\S+")
_LATENCY_COL = re.compile(r"^(?P<name>\S+) \[(?P<mode>fwd|bwd|train)\]$")
_SECTION = re.compile(r"^>>> (?P<title>[A-Z()+ ]+) BENCHMARKS")
_BWD_LABEL = re.compile(r"^(?P<size>\d+)(?P<k>k?)_(?P<n>\d+)seq$")
_SECTION_MODES = {"FORWARD": "fwd", "BACKWARD": "bwd", "TRAIN (FWD+BWD)": "train"}


def canonical_backend(display: str) -> str:
    """'flash_qla' -> 'flashqla', 'FI' -> 'flashinfer'; unknown names pass through."""
    return CANONICAL.get(display.lower(), display)


@dataclass(frozen=True)
class AnchorRecord:
    """One published line: a config and its latencies (ms) and ratios (other / primary)."""

    mode: str
    model: str
    label: str
    h_qk: int
    h_v: int
    n_seq: int
    total_tokens: int
    seqlens: tuple[int, ...] | None  # None for backward lines (random splits, only total and count)
    primary: str
    latency_ms: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    timer: str = ""  # block timer when the file holds several; else the table's


@dataclass
class AnchorTable:
    source: str
    gpu: str = ""
    models: str = ""
    config: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    records: list[AnchorRecord] = field(default_factory=list)

    @property
    def timer(self) -> str:
        """'cudagraph' for FlashQLA's file ('Backend=...'), 'Timer=...' in ours."""
        return self.config.get("Timer") or self.config.get("Backend", "")

    @property
    def statistic(self) -> str:
        return self.config.get("Statistic", PUBLISHED_STATISTIC)

    @property
    def head_dim(self) -> int | None:
        m = re.search(r"\bd=(\d+)", self.models)
        return int(m.group(1)) if m else None


def _key_values(text: str) -> dict[str, str]:
    """'Warmup=10, Repeats=100, Backend=cudagraph' -> dict (values may hold spaces)."""
    out: dict[str, str] = {}
    for part in re.split(r",\s*(?=[A-Za-z_][\w ]*=)", text.strip().strip("[]")):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _versions(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split("|"):
        if ":" in part:
            k, v = part.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def _bwd_total(label: str) -> tuple[int, int] | None:
    m = _BWD_LABEL.match(label)
    if not m:
        return None
    size = int(m.group("size")) * (1024 if m.group("k") else 1)
    return size, int(m.group("n"))


def _number(cell: str, suffix: str) -> float | None:
    cell = cell.strip()
    if not cell.endswith(suffix):
        return None
    try:
        return float(cell[: -len(suffix)])
    except ValueError:
        return None


def _record(mode: str, header: list[str], cells: list[str], timer: str, where: str) -> AnchorRecord:
    row = dict(zip(header, cells, strict=True))
    lat_cols = [(h, _LATENCY_COL.match(h)) for h in header]
    backends = [(h, canonical_backend(m.group("name"))) for h, m in lat_cols if m]
    if not backends:
        raise UsageError("--anchors", f"{where}: no latency columns in {header}")
    label = row.get("Seqlens") or row.get("SeqLen") or ""
    if mode == "fwd":
        seqlens: tuple[int, ...] | None = parse_seqlens(label)
        total, n_seq = sum(seqlens), len(seqlens)
    else:
        parsed = _bwd_total(label)
        if parsed is None:
            raise UsageError("--anchors", f"{where}: cannot read backward label {label!r}", "e.g. 8k_4seq")
        seqlens, (total, n_seq) = None, parsed
    primary = backends[0][1]
    latency = {b: v for h, b in backends if (v := _number(row[h], "ms")) is not None}
    ratios: dict[str, float] = {}
    for h in header:
        value = _number(row[h], "x")
        if value is None:
            continue
        if h.startswith("vs "):
            ratios[canonical_backend(h[3:])] = value
        elif h == "Speedup" and len(backends) == 2:
            ratios[backends[1][1]] = value
    return AnchorRecord(
        mode=mode,
        model=row["Model Config"],
        label=label,
        h_qk=int(row["h_qk"]),
        h_v=int(row["h_v"]),
        n_seq=int(row.get("#seq", n_seq)),
        total_tokens=total,
        seqlens=seqlens,
        primary=primary,
        latency_ms=latency,
        ratios=ratios,
        timer=timer,
    )


def parse_anchors(text: str, source: str = "<text>") -> AnchorTable:
    """Parse a FlashQLA-style table (header, forward and backward sections) into an AnchorTable."""
    table = AnchorTable(source=source)
    mode: str | None = None
    header: list[str] | None = None
    block_timer = ""
    lines = text.splitlines()
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        stripped = line.strip()
        where = f"{source}:{lineno}"
        if mode is None and header is None:
            if line.startswith("GPU:"):
                table.gpu = line[4:].strip()
            elif line.startswith("Models:"):
                table.models = line[7:].strip()
            elif line.startswith("Config:"):
                table.config.update(_key_values(line[7:]))
            elif line.startswith("Library Versions:") and lineno < len(lines):
                table.versions.update(_versions(lines[lineno]))  # the next line holds them
        if stripped.startswith("[Timer="):
            block_timer = _key_values(stripped).get("Timer", "")
            mode = header = None
            continue
        m = _SECTION.match(stripped)
        if m:
            mode, header = _SECTION_MODES.get(m.group("title").strip(), m.group("title").lower()), None
            continue
        if stripped.startswith("Benchmark Finished"):
            break
        if mode is None or not stripped or set(stripped) <= {"-", "="}:
            if stripped.startswith("="):
                mode = header = None  # a rule closes a section
            continue
        if header is None:
            if stripped.startswith("Model Config"):
                header = _HEADER_TOKEN.findall(stripped)
            continue
        cells = re.split(r"\s{2,}", stripped)
        if len(cells) != len(header):
            raise UsageError("--anchors", f"{where}: {len(cells)} cells for {len(header)} columns")
        table.records.append(_record(mode, header, cells, block_timer or table.timer, where))
    if not table.records:
        raise UsageError("--anchors", f"{source}: no benchmark lines found", "a FlashQLA benchmark_results file")
    return table


def load_anchors(path: str | Path) -> AnchorTable:
    p = Path(path)
    if not p.is_file():
        raise UsageError("--anchors", f"{p} does not exist", "a FlashQLA benchmark_results_<GPU>.txt")
    return parse_anchors(p.read_text(encoding="utf-8"), source=str(p))


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_anchors_path(gpu: str, root: str | Path | None = None) -> Path | None:
    """../shared/anchors/flashqla_benchmark_results_<GPU>.txt next to the repo, if it exists.

    'NVIDIA H200' and 'H200' both find the H200 file.
    """
    base = Path(root) if root is not None else repo_root()
    folder = base.parent / "shared" / "anchors"
    names = [gpu, gpu.removeprefix("NVIDIA ").strip(), gpu.split()[-1] if gpu.split() else gpu]
    for name in dict.fromkeys(n for n in names if n):
        candidate = folder / f"flashqla_benchmark_results_{name.replace(' ', '_')}.txt"
        if candidate.is_file():
            return candidate
    return None
