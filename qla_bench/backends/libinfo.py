"""Small facts about third-party libraries that adapters need before importing them.

Kept import-light (no torch.cuda calls, no library imports at module level) so `available()` can say
*why* a library cannot run on a CPU-only machine instead of crashing on its import side effects
(flash_qla asks TileLang for the GPU's compute version at import; fla needs Triton).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from importlib import metadata
from types import ModuleType


def version_tuple(text: str) -> tuple[int, ...]:
    """'3.7.1+git1a2b' -> (3, 7, 1); '0.7.4rc1' -> (0, 7, 4); '' -> ().

    Only the leading dotted integers count, which is how the version gates we mirror compare
    (a pre-release of 3.7.1 is treated as 3.7.1; none of the gates we read distinguish them).
    """
    out: list[int] = []
    for part in text.strip().split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group(0)))
        if m.end() != len(part):
            break
    return tuple(out)


def dist_version(dist: str) -> str | None:
    """Installed version of a PyPI distribution, or None (never imports it)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def is_installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it (a None entry in sys.modules = absent)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def import_or_reason(module: str) -> tuple[ModuleType | None, str | None]:
    """Import `module`; on any failure return (None, one-line reason).

    Any exception counts, not just ImportError: flash_qla raises ValueError at import without a GPU.
    """
    try:
        return importlib.import_module(module), None
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return None, f"cannot import {module} ({type(e).__name__}: {msg})"


def cuda_reason() -> str | None:
    """None when torch sees a CUDA device, else why not."""
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    return None


def installed_reason(module: str, dist: str) -> str | None:
    """Backend.installed() for a library: present and a CUDA GPU visible, without importing it."""
    if not is_installed(module):
        return f"{dist} is not installed (no module {module!r})"
    return cuda_reason()


def library_reason(module: str, dist: str, entry: str) -> str | None:
    """Common available() check: installed, a CUDA GPU present, and the entry module imports."""
    reason = installed_reason(module, dist)
    if reason:
        return reason
    _, reason = import_or_reason(entry)
    return reason
