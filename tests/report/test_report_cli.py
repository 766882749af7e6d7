"""`qla-bench report` through Typer's CliRunner, and write_reports behind it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from qla_bench.report.writer import gpu_file_tag, write_reports
from qla_bench.rows import append_row

EXIT_USAGE = 3


@pytest.fixture(scope="module")
def cli():
    """The app with every command registered, and the words that select `report`."""
    from qla_bench import cli as package

    try:
        return package.register_commands(), ["report"]
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("qla_bench.cli."):
            raise
        # Sibling command modules are not written yet: register report alone. Typer runs an app's
        # only command without its name, so the word 'report' is dropped until the others exist.
        import qla_bench.cli.report_cmd  # noqa: F401  (registers on app)

        return package.app, ([] if len(package.app.registered_commands) == 1 else ["report"])


def invoke(cli, *args: str):
    app, prefix = cli
    return CliRunner().invoke(app, [*prefix, *args])


@pytest.fixture
def results(rows, tmp_path):
    folder = tmp_path / "results" / "H200"
    for r in rows:
        append_row(folder / "fwd.jsonl", r)
    return folder


def test_report_writes_table_markdown_and_plots(cli, results, tmp_path):
    out = tmp_path / "out"
    res = invoke(cli, str(results), "--out", str(out), "--no-anchors")
    assert res.exit_code == 0, res.output
    table = out / "benchmark_results_H200.txt"
    assert table.read_text().startswith("GPU: NVIDIA H200")
    assert "## Speedups" in (out / "report.md").read_text()
    assert (out / "latency_fwd_cuda-graph.png").stat().st_size > 0
    assert str(table) in res.output


def test_report_defaults_to_the_results_folder_and_primary(cli, results):
    res = invoke(cli, str(results / "fwd.jsonl"), "--primary", "flashqla", "--gpu", "H200x", "--no-anchors")
    assert res.exit_code == 0, res.output
    text = (results / "benchmark_results_H200x.txt").read_text()
    assert "Primary=flash_qla" in text and "vs qla" in text


def test_report_compares_with_an_explicit_anchors_file(cli, results, h200_anchors, tmp_path):
    res = invoke(cli, str(results), "--out", str(tmp_path / "o"), "--anchors", str(h200_anchors))
    assert res.exit_code == 0, res.output
    md = (tmp_path / "o" / "report.md").read_text()
    assert f"Source: `{h200_anchors}`" in md


@pytest.mark.parametrize(
    "args,message",
    [
        (["{missing}"], "does not exist"),
        (["{empty}"], "no rows"),
        (["{results}", "--primary", "flashinfer"], "--primary"),
        (["{results}", "--anchors", "{missing}"], "--anchors"),
        (["{results}", "--baseline", "flashinfer", "--no-anchors"], "--baseline"),
    ],
)
def test_bad_input_is_a_clean_usage_error(cli, results, tmp_path, args, message):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    paths = {"missing": tmp_path / "nope.jsonl", "empty": empty, "results": results}
    res = invoke(cli, *(a.format(**paths) for a in args))
    assert res.exit_code == EXIT_USAGE
    output = " ".join(res.output.split())  # rich wraps long lines
    assert output.startswith("error:") and message in output and "Traceback" not in output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit)
    assert not (results / "report.md").exists()  # nothing half-written


def test_write_reports_uses_the_default_anchors(rows, tmp_path, monkeypatch, h200_anchors):
    import qla_bench.report.writer as writer

    monkeypatch.setattr(writer, "default_anchors_path", lambda gpu: h200_anchors if "H200" in gpu else None)
    paths = write_reports(rows, tmp_path, gpu="H200")
    assert paths[:2] == [tmp_path / "benchmark_results_H200.txt", tmp_path / "report.md"]
    assert "Source: `" in paths[1].read_text()
    write_reports(rows, tmp_path / "none", gpu="H200", find_anchors=False)
    assert "No anchors file" in (tmp_path / "none" / "report.md").read_text()
    assert gpu_file_tag("NVIDIA H200") == "H200" and gpu_file_tag("RTX 4090/x") == "RTX_4090_x"


def test_report_export_csv_and_parquet(tmp_path):
    import pandas as pd

    from qla_bench.cli import app, register_commands
    from qla_bench.rows import Row, append_row

    register_commands()
    rows_file = tmp_path / "r.jsonl"
    row = Row(
        backend="torch",
        mode="fwd",
        h_qk=1,
        h_v=2,
        k=128,
        v=128,
        seqlens=[64, 1],
        label="64+1",
        status="PASSED",
        timer="cpu-wall",
        median_ms=1.5,
        samples_ms=[1.4, 1.5, 1.6],
        rel_l2={"o": 0.003},
        worst_seed={"o": 12},
        gpu="CPU",
    )
    append_row(rows_file, row)
    res = CliRunner().invoke(
        app,
        [
            "report",
            str(rows_file),
            "--out",
            str(tmp_path / "rep"),
            "--export",
            str(tmp_path / "rows.csv"),
            "--export",
            str(tmp_path / "rows.parquet"),
        ],
    )
    assert res.exit_code == 0, res.output
    for df in (pd.read_csv(tmp_path / "rows.csv"), pd.read_parquet(tmp_path / "rows.parquet")):
        assert df.loc[0, "rel_l2.o"] == 0.003 and df.loc[0, "seqlens"] == "64+1" and df.loc[0, "median_ms"] == 1.5
        assert df.loc[0, "worst_seed.o"] == 12
    bad = CliRunner().invoke(
        app, ["report", str(rows_file), "--out", str(tmp_path / "rep"), "--export", str(tmp_path / "rows.xlsx")]
    )
    assert bad.exit_code == 3
