"""Per-GPU baselines kept in the repository: results/<GPU>/baseline/{rows.jsonl, manifest.json}.

`gate --baseline H200` resolves a GPU name to that folder when the argument is not a path, so CI
compares against committed data and never needs the baseline's machine.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..errors import UsageError
from ..rows import SCHEMA_VERSION, Row, load_rows
from .labels import describe_gpus, gpu_matches, gpu_names

DEFAULT_ROOT = Path("results")
ROWS_FILE = "rows.jsonl"
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class Baseline:
    gpu: str
    folder: Path
    manifest: dict

    @property
    def rows_path(self) -> Path:
        return self.folder / ROWS_FILE


def gpu_folder(gpu: str) -> str:
    """A GPU name as a folder name: 'NVIDIA H200' -> 'NVIDIA-H200'."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", gpu.strip()).strip("-.")
    if not safe:
        raise UsageError("--gpu", f"{gpu!r} is not a usable GPU name", "a name like H200 or GB200")
    return safe


def baseline_dir(gpu: str, root: Path = DEFAULT_ROOT) -> Path:
    return Path(root) / gpu_folder(gpu) / "baseline"


def list_baselines(root: Path = DEFAULT_ROOT) -> list[str]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.parent.parent.name for p in root.glob(f"*/baseline/{ROWS_FILE}"))


def _manifest(rows: list[Row], gpu: str, sources: list[str], skipped: int) -> dict:
    versions: dict[str, set[str]] = {}
    for r in rows:
        for name, ver in r.versions.items():
            versions.setdefault(name, set()).add(ver)
    return {
        "gpu": gpu,
        "rows": len(rows),
        "status": dict(sorted(Counter(r.status for r in rows).items())),
        "backends": sorted({r.backend for r in rows}),
        "modes": sorted({r.mode for r in rows}),
        "sweeps": sorted({r.sweep for r in rows if r.sweep}),
        "timers": sorted({r.timer for r in rows if r.timer}),
        "git_shas": sorted({r.git_sha for r in rows if r.git_sha}),
        "run_ids": sorted({r.run_id for r in rows if r.run_id}),
        "versions": {k: sorted(v) for k, v in sorted(versions.items())},
        "sources": sources,
        "skipped_rows_of_other_gpus": skipped,
        "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "schema_version": SCHEMA_VERSION,
    }


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save_baseline(results: list[str | Path], gpu: str, root: Path = DEFAULT_ROOT) -> Baseline:
    """Copy the rows of `gpu` from `results` into its baseline folder, replacing any earlier one."""
    rows = load_rows(results)
    mine = [r for r in rows if gpu_matches(r.gpu, gpu)]
    if not mine:
        raise UsageError(
            "--gpu",
            f"no rows from GPU {gpu!r} in {', '.join(map(str, results))} (its rows are from "
            f"{describe_gpus(gpu_names(rows))})",
            describe_gpus(gpu_names(rows)),
        )
    folder = baseline_dir(gpu, root)
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in mine)
    _write_atomic(folder / ROWS_FILE, text)
    manifest = _manifest(mine, gpu, [str(p) for p in results], len(rows) - len(mine))
    _write_atomic(folder / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return Baseline(gpu=gpu, folder=folder, manifest=manifest)


def load_baseline(gpu: str, root: Path = DEFAULT_ROOT) -> Baseline:
    folder = baseline_dir(gpu, root)
    if not (folder / ROWS_FILE).is_file():
        raise UsageError("GPU", f"no baseline for {gpu!r} under {Path(root)}/", _available(root))
    manifest_path = folder / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    return Baseline(gpu=gpu, folder=folder, manifest=manifest)


def _available(root: Path) -> str:
    names = list_baselines(root)
    if names:
        return ", ".join(names) + " or a results path"
    return "a results file or folder; no baselines saved yet (qla-bench baseline save RESULTS --gpu GPU)"


def resolve_run(arg: str, root: Path = DEFAULT_ROOT, argument: str = "--baseline") -> tuple[str, list[Path]]:
    """A path, or a GPU name with a stored baseline, -> (label for reports, results paths)."""
    path = Path(arg)
    if path.exists():
        return arg, [path]
    folder = baseline_dir(arg, root) if arg.strip() else None
    if folder is not None and (folder / ROWS_FILE).is_file():
        return f"{arg} baseline", [folder / ROWS_FILE]
    raise UsageError(
        argument,
        f"{arg!r} is neither a results file or folder nor a GPU with a baseline under {Path(root)}/",
        _available(root),
    )


def load_run(arg: str, root: Path = DEFAULT_ROOT, argument: str = "--baseline") -> tuple[str, list[Row]]:
    label, paths = resolve_run(arg, root, argument)
    return label, load_rows(paths)
