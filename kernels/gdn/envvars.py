"""Reading the QLA_* switches cheaply: the forward reads about ten per call, and small configs are host-bound.

os.environ.get encodes the key and goes through the Mapping machinery on every read (~1 us each on the GPU
host). On POSIX, os.environ keeps its entries as bytes in a plain dict (`_data`) that every write through
os.environ (monkeypatch.setenv included) updates, so a read there with the key encoded once is a dict lookup.
Anywhere else, or if that attribute is not a dict, the plain os.environ.get is used.
"""

from __future__ import annotations

import os

_ENCODED: dict[str, bytes] = {}


def env_text(name: str) -> str:
    """os.environ.get(name, "").strip()."""
    data = getattr(os.environ, "_data", None)
    if os.name != "posix" or type(data) is not dict:
        return os.environ.get(name, "").strip()
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = os.fsencode(name)
    value = data.get(key)
    return "" if value is None else os.fsdecode(value).strip()
