"""Per-GPU baselines: save copies rows of one GPU with a manifest; gate --baseline GPU finds them."""

import json

import pytest
from gate_fakes import SLOW_ROW, FakeBackend

from qla_bench.errors import UsageError
from qla_bench.gate import list_baselines, load_baseline, resolve_run, save_baseline


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def mixed_results(tmp_path, rows_file):
    """A results folder holding an H200 run and a GB200 run."""
    rows_file(tmp_path / "out" / "h200.jsonl", FakeBackend(gpu="H200").run(1))
    rows_file(tmp_path / "out" / "gb200.jsonl", FakeBackend(gpu="GB200").run(1))
    return tmp_path / "out"


def test_save_keeps_only_that_gpu_and_writes_a_manifest(mixed_results, tmp_path):
    root = tmp_path / "results"
    saved = save_baseline([mixed_results], "H200", root)
    assert saved.rows_path == root / "H200" / "baseline" / "rows.jsonl"
    lines = saved.rows_path.read_text().splitlines()
    assert len(lines) == 8 and all(json.loads(x)["gpu"] == "H200" for x in lines)
    manifest = json.loads((root / "H200" / "baseline" / "manifest.json").read_text())
    assert manifest["rows"] == 8 and manifest["status"] == {"PASSED": 8}
    assert manifest["skipped_rows_of_other_gpus"] == 8
    assert manifest["backends"] == ["fla", "flashqla"] and manifest["timers"] == ["cuda-events"]
    assert list_baselines(root) == ["H200"]
    assert load_baseline("H200", root).manifest["rows"] == 8


def test_save_replaces_the_previous_baseline(mixed_results, tmp_path, rows_file):
    root = tmp_path / "results"
    save_baseline([mixed_results], "H200", root)
    newer = rows_file(tmp_path / "newer.jsonl", FakeBackend(gpu="H200").run(9)[:3])
    save_baseline([newer], "H200", root)
    assert len((root / "H200" / "baseline" / "rows.jsonl").read_text().splitlines()) == 3


def test_save_of_an_absent_gpu_is_a_usage_error(mixed_results, tmp_path):
    with pytest.raises(UsageError, match="no rows from GPU 'H100'") as exc:
        save_baseline([mixed_results], "H100", tmp_path / "results")
    assert exc.value.exit_code == 3


def test_gpu_names_match_whole_words(tmp_path, rows_file):
    path = rows_file(tmp_path / "r.jsonl", FakeBackend(gpu="NVIDIA H200").run(1))
    assert save_baseline([path], "H200", tmp_path / "results").manifest["rows"] == 8
    gh = rows_file(tmp_path / "gh.jsonl", FakeBackend(gpu="GH200").run(1))
    with pytest.raises(UsageError):
        save_baseline([gh], "H200", tmp_path / "results2")


def test_resolve_prefers_paths_then_baselines(mixed_results, tmp_path):
    root = tmp_path / "results"
    save_baseline([mixed_results], "H200", root)
    assert resolve_run(str(mixed_results), root) == (str(mixed_results), [mixed_results])
    assert resolve_run("H200", root) == ("H200 baseline", [root / "H200" / "baseline" / "rows.jsonl"])
    with pytest.raises(UsageError, match=r"neither .* \(accepted: H200 or a results path\)"):
        resolve_run("B200", root)


def test_results_folder_scan_skips_the_stored_baseline(mixed_results, tmp_path):
    """`gate --candidate results/` must not read results/<GPU>/baseline/ as part of the run."""
    from qla_bench.rows import load_rows

    root = tmp_path / "results"
    save_baseline([mixed_results], "H200", root)
    with pytest.raises(UsageError, match=r"no \.jsonl results"):
        load_rows([root])


def test_cli_save_show_and_gate_on_the_stored_baseline(run_cli, mixed_results, tmp_path, rows_file):
    root = tmp_path / "results"
    res = run_cli("baseline", "save", mixed_results, "--gpu", "H200", "--root", root)
    assert res.exit_code == 0, res.output
    assert "saved 8 rows of H200" in flat(res.stdout)
    res = run_cli("baseline", "show", "--root", root)
    assert res.stdout.split() == ["H200"]
    res = run_cli("baseline", "show", "H200", "--root", root)
    assert res.exit_code == 0 and "skipped_rows_of_other_gpus" in res.stdout

    same = rows_file(tmp_path / "ci" / "rows.jsonl", FakeBackend(gpu="H200").run(2))
    assert run_cli("gate", "--baseline", "H200", "--candidate", same, "--root", root).exit_code == 0
    slow = rows_file(tmp_path / "ci2" / "rows.jsonl", FakeBackend(slowdown={SLOW_ROW: 1.2}).run(2))
    res = run_cli("gate", "--baseline", "H200", "--candidate", slow, "--root", root)
    assert res.exit_code == 1 and "H200 baseline" in flat(res.stdout)


def test_cli_unknown_baseline_and_show_exit_3(run_cli, tmp_path):
    root = tmp_path / "results"
    res = run_cli("gate", "--baseline", "H200", "--candidate", tmp_path, "--root", root)
    assert res.exit_code == 3
    assert "no baselines saved yet" in flat(res.stderr)
    assert run_cli("baseline", "show", "H200", "--root", root).exit_code == 3
    assert run_cli("baseline", "save", tmp_path / "missing", "--gpu", "H200", "--root", root).exit_code == 3
