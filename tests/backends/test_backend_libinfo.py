"""Version parsing and the availability checks shared by the library adapters."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from qla_bench.backends.libinfo import (
    import_or_reason,
    is_installed,
    library_reason,
    version_tuple,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3.6.0", (3, 6, 0)),
        ("3.7.1+git1a2b3c", (3, 7, 1)),
        ("0.7.4rc1", (0, 7, 4)),
        ("2.11.0+cu130", (2, 11, 0)),
        ("0.6.9", (0, 6, 9)),
        ("", ()),
        ("abc", ()),
    ],
)
def test_version_tuple(text: str, expected: tuple[int, ...]) -> None:
    assert version_tuple(text) == expected


def test_version_tuple_orders_like_the_gates() -> None:
    assert (3, 4, 0) <= version_tuple("3.6.0") < (3, 7, 1)
    assert not version_tuple("3.7.1") < (3, 7, 1)
    assert version_tuple("0.7.0") >= (0, 7)
    assert version_tuple("0.6.9") < (0, 7)


def _write_package(root: Path, name: str, body: str) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)


def test_is_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert is_installed("json")
    assert not is_installed("qla_bench_no_such_module_xyz")
    monkeypatch.setitem(sys.modules, "json", None)  # None in sys.modules means "blocked"
    assert not is_installed("json")
    _write_package(tmp_path, "qla_fake_pkg_a", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert is_installed("qla_fake_pkg_a")


def test_import_or_reason_turns_any_import_error_into_a_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # flash_qla raises ValueError (not ImportError) at import on a machine without a GPU
    _write_package(tmp_path, "qla_fake_pkg_b", "raise ValueError('No CUDA architecture was specified')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod, reason = import_or_reason("qla_fake_pkg_b")
    assert mod is None
    assert reason is not None
    assert "ValueError" in reason and "No CUDA architecture" in reason
    mod, reason = import_or_reason("json")
    assert reason is None and mod is not None


def test_library_reason_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write_package(tmp_path, "qla_fake_pkg_c", "X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = library_reason("qla_no_such_lib", "no-such-lib", "qla_no_such_lib.ops")
    assert reason is not None and "no-such-lib is not installed" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = library_reason("qla_fake_pkg_c", "fake-c", "qla_fake_pkg_c")
    assert reason is not None and "CUDA" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert library_reason("qla_fake_pkg_c", "fake-c", "qla_fake_pkg_c") is None
    reason = library_reason("qla_fake_pkg_c", "fake-c", "qla_fake_pkg_c.missing")
    assert reason is not None and "cannot import qla_fake_pkg_c.missing" in reason
