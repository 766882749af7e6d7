"""profile_host's config strings: the GPU host is told which configs to profile in one argument."""

import pytest

pytest.importorskip("torch")

from qla_kernels.gdn.profile_host import parse_configs


def test_parse_configs_reads_lengths_repeats_and_mixes():
    assert parse_configs("16/16:2048, 2/8:1024x8,8/24:1000+3096") == [
        (16, 16, [2048]),
        (2, 8, [1024] * 8),
        (8, 24, [1000, 3096]),
    ]


def test_parse_configs_refuses_a_config_without_heads():
    with pytest.raises(ValueError):
        parse_configs("2048")
