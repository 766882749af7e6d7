"""`prepare --jobs N`: head configs compile in parallel processes, GPU-autotuning backends in one job."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from qla_bench.cli import app, main, register_commands
from qla_bench.cli.prepare_jobs import head_specs, plan_jobs
from qla_bench.rows import iter_rows
from qla_bench.sweeps import load_sweep

register_commands()
runner = CliRunner()


def test_plan_keeps_device_tuned_backends_in_one_job():
    heads = head_specs(load_sweep("qwen35-fwd"))
    assert heads == ["2/8", "4/16", "8/32", "16/64", "16/32", "8/24", "16/48", "16/16", "32/32"]
    jobs = plan_jobs(["flashqla", "fla", "qla"], heads)
    assert jobs[0].backends == ["fla"] and jobs[0].heads == heads  # FLA autotunes: never two at once
    assert [j.heads for j in jobs[1:]] == [[h] for h in heads]
    assert all(j.backends == ["flashqla", "qla"] for j in jobs[1:])
    assert [j.name for j in plan_jobs(["fla"], heads)] == ["device-tuned"]


def test_jobs_write_the_rows_one_process_would(tmp_path):
    res = runner.invoke(app, ["prepare", "--jobs", "2", "--backends", "torch", "--out", str(tmp_path / "par")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["prepare", "--backends", "torch", "--out", str(tmp_path / "one")])
    assert res.exit_code == 0, res.output

    def keys(folder):
        return sorted(r.config_key() for r in iter_rows(tmp_path / folder / "numerics" / "prepare-fwd.jsonl"))

    assert keys("par") == keys("one") and len(keys("par")) == 12
    assert len(list((tmp_path / "par" / "prepare-jobs").glob("*.log"))) == 3


def test_a_crashing_job_fails_the_command_and_names_its_log(tmp_path, fake_backends):
    argv = ["prepare", "--jobs", "2", "--backends", "fake-segv,torch", "--no-isolate", "--out", str(tmp_path)]
    res = runner.invoke(app, argv)
    assert res.exit_code == 1
    assert "killed by SIGSEGV" in res.output and "prepare-jobs" in res.output
    assert len(list((tmp_path / "prepare-jobs").glob("*.log"))) == 3


def test_jobs_must_be_positive():
    with pytest.raises(SystemExit) as info:
        main(["prepare", "--jobs", "0"])
    assert info.value.code == 3
