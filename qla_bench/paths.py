"""Where things live by default: results per GPU, the device profile, the compile caches."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def results_dir(gpu: str) -> Path:
    return Path("results") / gpu


def device_profile_path(gpu: str, out_dir: Path | None = None) -> Path:
    """The calibrated ceilings of a GPU: <out>/device_profile.json if present, else results/<GPU>/."""
    if out_dir is not None and (out_dir / "device_profile.json").is_file():
        return out_dir / "device_profile.json"
    return results_dir(gpu) / "device_profile.json"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qla-bench"


def apply_cache_dir(cache_dir: Path | None) -> Path:
    """One cache root for every JIT: TileLang, Triton (FLA) and FlashInfer. Set before libraries import."""
    root = Path(cache_dir or os.environ.get("QLA_CACHE_DIR") or default_cache_dir()).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["QLA_CACHE_DIR"] = str(root)
    os.environ.setdefault("TILELANG_CACHE_DIR", str(root / "tilelang"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(root / "flashinfer"))
    return root
