"""`qla-bench gate` and `compare` through the Typer app: exit codes, messages, report files."""

import json
from dataclasses import replace

import pytest
from gate_fakes import SLOW_ROW, FakeBackend


def flat(text: str) -> str:
    """Undo rich's wrapping at the test terminal's 80 columns."""
    return " ".join(text.split())


@pytest.fixture
def runs(tmp_path, rows_file):
    """Write a baseline and candidates made by the fake backend; returns their paths."""

    def make(name: str, rows) -> str:
        return str(rows_file(tmp_path / name / "rows.jsonl", rows))

    return make


def test_self_gate_passes(run_cli, runs):
    path = runs("base", FakeBackend().run(1))
    res = run_cli("gate", "--baseline", path, "--candidate", path)
    assert res.exit_code == 0, res.output
    assert "PASS" in flat(res.stdout)


def test_folders_are_accepted(run_cli, runs, tmp_path):
    runs("base", FakeBackend().run(1))
    runs("head", FakeBackend().run(2))
    res = run_cli("gate", "--baseline", tmp_path / "base", "--candidate", tmp_path / "head")
    assert res.exit_code == 0, res.output


def test_planted_slowdown_exits_1_and_names_the_row(run_cli, runs):
    base = runs("base", FakeBackend(noise=0.01).run(1))
    head = runs("head", FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(2))
    res = run_cli("gate", "--baseline", base, "--candidate", head)
    assert res.exit_code == 1, res.output
    assert f"1 SLOWER row(s): {SLOW_ROW}" in flat(res.stdout)
    assert "FAIL (performance regression)" in flat(res.stdout)


def test_no_fail_reports_but_exits_0(run_cli, runs):
    base = runs("base", FakeBackend(noise=0.01).run(1))
    head = runs("head", FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(2))
    res = run_cli("gate", "--baseline", base, "--candidate", head, "--no-fail")
    assert res.exit_code == 0
    assert SLOW_ROW in flat(res.stdout) and "exiting 0 instead of 1" in flat(res.stderr)


def test_three_percent_under_five_percent_noise_passes(run_cli, runs):
    base = runs("base", FakeBackend(noise=0.05).run(1))
    head = runs("head", FakeBackend(noise=0.05, slowdown={SLOW_ROW: 1.03}).run(2))
    assert run_cli("gate", "--baseline", base, "--candidate", head).exit_code == 0


def test_numerics_regression_exits_2(run_cli, runs):
    rows = FakeBackend().run(2)
    rows[0] = replace(rows[0], status="INCORRECT", reason="rel L2 0.4", samples_ms=[], median_ms=None)
    res = run_cli("gate", "--baseline", runs("base", FakeBackend().run(1)), "--candidate", runs("head", rows))
    assert res.exit_code == 2, res.output
    assert "NUMERICS" in flat(res.stdout)


def test_missing_rows_exit_2(run_cli, runs):
    res = run_cli(
        "gate", "--baseline", runs("base", FakeBackend().run(1)), "--candidate", runs("head", FakeBackend().run(2)[2:])
    )
    assert res.exit_code == 2
    assert "2 MISSING row(s)" in flat(res.stdout)


def test_different_gpus_exit_3_with_a_clear_message(run_cli, runs):
    base = runs("base", FakeBackend(gpu="H200").run(1))
    head = runs("head", FakeBackend(gpu="GB200").run(2))
    res = run_cli("gate", "--baseline", base, "--candidate", head)
    assert res.exit_code == 3
    assert "error:" in flat(res.stderr) and "GB200" in flat(res.stderr) and "H200" in flat(res.stderr)


def test_no_common_rows_exit_3(run_cli, runs):
    head = [replace(r, backend="other") for r in FakeBackend().run(2)]
    res = run_cli("gate", "--baseline", runs("base", FakeBackend().run(1)), "--candidate", runs("head", head))
    assert res.exit_code == 3
    assert "no rows in common" in flat(res.stderr)


@pytest.mark.parametrize("threshold", ["five", "5", "-5%", "120%"])
def test_bad_threshold_exits_3(run_cli, runs, threshold):
    path = runs("base", FakeBackend().run(1))
    res = run_cli("gate", "--baseline", path, "--candidate", path, "--threshold", threshold)
    assert res.exit_code == 3
    assert "--threshold" in flat(res.stderr)


def test_threshold_changes_the_verdict(run_cli, runs):
    base = runs("base", FakeBackend(noise=0.002).run(1))
    head = runs("head", FakeBackend(noise=0.002, slowdown={SLOW_ROW: 1.04}).run(2))
    assert run_cli("gate", "--baseline", base, "--candidate", head, "--threshold", "5%").exit_code == 0
    assert run_cli("gate", "--baseline", base, "--candidate", head, "--threshold", "0.02").exit_code == 1


def test_malformed_inputs_exit_3(run_cli, runs, tmp_path):
    good = runs("base", FakeBackend().run(1))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"backend": "fla"\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for candidate, words in [(bad, "not valid JSON"), (empty, "no result rows"), (tmp_path / "nope", "neither")]:
        res = run_cli("gate", "--baseline", good, "--candidate", candidate)
        assert res.exit_code == 3, (candidate, res.output)
        assert words in flat(res.stderr)


def test_reports_are_written(run_cli, runs, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base = runs("base", FakeBackend(noise=0.01).run(1))
    head = runs("head", FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(2))
    out = tmp_path / "reports"
    res = run_cli(
        "gate", "--baseline", base, "--candidate", head,
        "--markdown", out / "gate.md", "--junit", out / "gate.xml", "--json", out / "gate.json", "--plot", out / "gate",
    )  # fmt: skip
    assert res.exit_code == 1
    md = (out / "gate.md").read_text()
    assert md.startswith("## qla-bench gate: FAIL (performance regression)") and SLOW_ROW in md
    assert summary.read_text() == "earlier step\n" + md
    assert 'failures="1"' in (out / "gate.xml").read_text()
    data = json.loads((out / "gate.json").read_text())
    assert data["exit_code"] == 1 and data["rows"][0]["name"] == SLOW_ROW
    assert (out / "gate.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "gate.svg").read_text().lstrip().startswith("<?xml")


def test_rerun_without_gpu_hints_and_gates_on_given_data(run_cli, runs, monkeypatch):
    monkeypatch.setattr("qla_bench.gate.rerun.cuda_device_name", lambda: None)
    base = runs("base", FakeBackend(noise=0.01).run(1))
    head = runs("head", FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(2))
    res = run_cli("gate", "--baseline", base, "--candidate", head, "--rerun")
    assert res.exit_code == 1
    assert "hint:" in flat(res.stderr) and "no CUDA GPU" in flat(res.stderr)


@pytest.mark.parametrize(("rerun_factor", "code"), [(1.0, 0), (1.10, 1)])
def test_rerun_remeasures_suspects_once(run_cli, runs, monkeypatch, rerun_factor, code):
    import sys
    import types

    calls = []

    def remeasure(rows):
        calls.append([r.config_key() for r in rows])
        fresh = {r.config_key(): r for r in FakeBackend(noise=0.01, slowdown={SLOW_ROW: rerun_factor}).run(3)}
        return [fresh[r.config_key()] for r in rows]

    monkeypatch.setattr("qla_bench.gate.rerun.cuda_device_name", lambda: "NVIDIA H200")
    monkeypatch.setitem(sys.modules, "qla_bench.runner", types.SimpleNamespace(remeasure=remeasure))
    base = runs("base", FakeBackend(noise=0.01).run(1))
    head = runs("head", FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(2))
    res = run_cli("gate", "--baseline", base, "--candidate", head, "--rerun")
    assert res.exit_code == code, res.output
    assert len(calls) == 1 and len(calls[0]) == 1  # only the suspect, only once
    assert "--rerun: 1 SLOWER row(s) suspected" in flat(res.stderr)
    assert "re-measured 1 suspected row(s) once" in flat(res.stderr)


def test_compare_puts_runs_side_by_side(run_cli, runs, tmp_path):
    a = runs("a", FakeBackend(noise=0.01).run(1))
    b = runs("b", FakeBackend(noise=0.01, slowdown={SLOW_ROW: 1.10}).run(2))
    c = runs("c", FakeBackend(noise=0.01, gpu="GB200").run(3))
    out = tmp_path / "cmp"
    res = run_cli("compare", a, b, c, "--markdown", out / "c.md", "--json", out / "c.json", "--plot", out / "c.png")
    assert res.exit_code == 0, res.output
    md = (out / "c.md").read_text()
    assert f"| {SLOW_ROW} |" in md and "SLOWER" in md
    data = json.loads((out / "c.json").read_text())
    assert [r["label"] for r in data["runs"]] == [b, c]
    assert (out / "c.png").exists() and (out / "c.svg").exists()


def test_compare_needs_two_runs(run_cli, runs):
    res = run_cli("compare", runs("a", FakeBackend().run(1)))
    assert res.exit_code == 3
    assert "at least two runs" in flat(res.stderr)


@pytest.mark.parametrize(
    ("slowdown", "gpu", "code"),
    [(1.0, "H200", 0), (1.10, "H200", 1), (1.0, "GB200", 3)],
    ids=["pass", "slower", "usage"],
)
def test_console_script_keeps_the_exit_code(runs, slowdown, gpu, code):
    """Through qla_bench.cli.main(), the `qla-bench` entry point, not just the Typer app."""
    from qla_bench.cli import main

    base = runs("base", FakeBackend(noise=0.01).run(1))
    head = runs("head", FakeBackend(noise=0.01, gpu=gpu, slowdown={SLOW_ROW: slowdown}).run(2))
    with pytest.raises(SystemExit) as exc:
        main(["gate", "--baseline", base, "--candidate", head])
        raise SystemExit(0)  # main() returns normally on success
    assert exc.value.code == code
