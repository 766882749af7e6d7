"""Stage 0 beside stage 1 ($QLA_BWD_OVERLAP, bwd_api): the switch and the in-turn path, on the CPU. The
side stream itself is checked on the GPU (tests/gpu/test_qla_bwd_cp.py::test_stage0_beside_stage1_equals_in_turn:
bit-equal to the in-turn backward, eager and from a captured CUDA graph)."""

import pytest
import torch

from qla_kernels.gdn import bwd_api


def test_switch_defaults_off_until_measured_and_names_itself(monkeypatch):
    """Off by default (session 22 could not run it on a GPU); "1" and "0" override; a typo is named."""
    monkeypatch.delenv(bwd_api.BWD_OVERLAP_ENV, raising=False)
    assert bwd_api.resolve_bwd_overlap() is bwd_api.DEFAULT_BWD_OVERLAP is False
    monkeypatch.setenv(bwd_api.BWD_OVERLAP_ENV, "1")
    assert bwd_api.resolve_bwd_overlap()
    monkeypatch.setenv(bwd_api.BWD_OVERLAP_ENV, "0")
    assert not bwd_api.resolve_bwd_overlap()
    monkeypatch.setenv(bwd_api.BWD_OVERLAP_ENV, "on")
    with pytest.raises(ValueError, match="QLA_BWD_OVERLAP"):
        bwd_api.resolve_bwd_overlap()


def test_off_runs_in_turn_on_the_callers_stream(monkeypatch):
    """With the switch off no stream is made (so a CPU-only or capture-free caller never touches CUDA) and the
    fork and join are no-ops around the block, which still runs."""
    monkeypatch.setenv(bwd_api.BWD_OVERLAP_ENV, "0")
    assert bwd_api._stage0_stream(torch.device("cuda", 0)) is None
    ran = []
    bwd_api._fork(None)
    with bwd_api._on(None):
        ran.append(1)
    bwd_api._join(None)
    assert ran == [1]
