"""env_text reads what os.environ.get would, through every way a test or a user changes the environment."""

import os

import pytest

from qla_kernels.gdn.envvars import env_text

NAME = "QLA_TEST_ENVVARS_SWITCH"


def test_unset_reads_empty(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_text(NAME) == ""


@pytest.mark.parametrize("value, text", [("1", "1"), (" ws12 \n", "ws12"), ("", ""), ("é", "é")])
def test_set_values_read_stripped(monkeypatch, value, text):
    monkeypatch.setenv(NAME, value)
    assert env_text(NAME) == text == os.environ.get(NAME, "").strip()


def test_changes_after_a_first_read_are_seen(monkeypatch):
    monkeypatch.setenv(NAME, "0")
    assert env_text(NAME) == "0"
    os.environ[NAME] = "1"
    assert env_text(NAME) == "1"
    del os.environ[NAME]
    assert env_text(NAME) == ""


def test_falls_back_to_os_environ_off_posix(monkeypatch):
    monkeypatch.setenv(NAME, " vs3 ")
    monkeypatch.setattr(os, "name", "nt")
    assert env_text(NAME) == "vs3"
