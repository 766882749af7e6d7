"""Backend registry: adding a backend is one file that defines a Backend subclass with @register."""

from __future__ import annotations

import importlib
import os

from ..errors import UsageError
from .base import BWD_OUTPUTS, FWD_OUTPUTS, Backend, GDNInputs, Prepared

_REGISTRY: dict[str, type[Backend]] = {}
_BUILTIN_MODULES = ("torch_chunked", "fla", "flashqla", "flashinfer", "qla")
_loaded = False


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: make a backend selectable by its name."""
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        for mod in _BUILTIN_MODULES:
            importlib.import_module(f"{__name__}.{mod}")
        # plug-ins: QLA_BENCH_BACKENDS="pkg.module,other.module" (each registers with @register)
        for mod in filter(None, (m.strip() for m in os.environ.get("QLA_BENCH_BACKENDS", "").split(","))):
            try:
                importlib.import_module(mod)
            except ImportError as exc:
                raise UsageError("QLA_BENCH_BACKENDS", f"cannot import {mod!r}: {exc}") from None
        _loaded = True


def backend_names() -> list[str]:
    _load_builtins()
    return list(_REGISTRY)


def get_backend(name: str) -> Backend:
    _load_builtins()
    if name not in _REGISTRY:
        raise UsageError("--backends", f"unknown backend {name!r}", ", ".join(_REGISTRY))
    return _REGISTRY[name]()


def parse_backends(text: str | list[str]) -> list[str]:
    """'fla,flashqla' -> ['fla', 'flashqla'], validated against the registry."""
    names = text if isinstance(text, list) else [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise UsageError("--backends", "no backend given", ", ".join(backend_names()))
    for n in names:
        get_backend(n)
    return names


__all__ = [
    "BWD_OUTPUTS",
    "FWD_OUTPUTS",
    "Backend",
    "GDNInputs",
    "Prepared",
    "backend_names",
    "get_backend",
    "parse_backends",
    "register",
]
