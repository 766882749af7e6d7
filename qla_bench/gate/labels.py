"""Short human names for rows and runs, shared by every output (tables, Markdown, JUnit, plots)."""

from __future__ import annotations

from ..rows import Row

_DEFAULTS = {"k": 128, "v": 128, "dtype": "bfloat16", "gate": "flashqla", "zero_gate_frac": 0.25}


def row_name(row: Row, with_gpu: bool = False) -> str:
    """'fla fwd h16/64 1x32768', plus only the key fields that differ from the common defaults."""
    parts = [row.backend, row.mode, f"h{row.h_qk}/{row.h_v}", row.label or "+".join(map(str, row.seqlens))]
    if (row.k, row.v) != (_DEFAULTS["k"], _DEFAULTS["v"]):
        parts.append(f"K{row.k}V{row.v}")
    if row.dtype != _DEFAULTS["dtype"]:
        parts.append(row.dtype)
    if row.gate != _DEFAULTS["gate"]:
        parts.append(f"gate={row.gate}")
    if round(float(row.zero_gate_frac), 6) != _DEFAULTS["zero_gate_frac"]:
        parts.append(f"zero={row.zero_gate_frac:g}")
    if with_gpu:
        parts.insert(0, row.gpu or "?")
    return " ".join(parts)


def gpu_names(rows: list[Row]) -> list[str]:
    return sorted({r.gpu for r in rows})


def describe_gpus(names: list[str]) -> str:
    shown = [n or "(no GPU name)" for n in names]
    return ", ".join(shown) if shown else "(none)"


def _norm(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def gpu_matches(full_name: str, short: str) -> bool:
    """'NVIDIA H200' matches 'H200' and 'nvidia h200', but not 'GH200' (whole words only)."""
    if not full_name or not short:
        return False
    want = _norm(short)
    return want == _norm(full_name) or want in {_norm(w) for w in full_name.replace("-", " ").split()}
