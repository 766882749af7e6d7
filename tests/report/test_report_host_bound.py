"""Host-bound rows: events well above graph for one config at one commit, never across commits."""

from qla_bench.report.host_bound import host_bound_rows
from qla_bench.report.markdown import render_markdown


def _pair(row, mix, events_ms, graph_ms, *, sha="0123abc", backend="qla"):
    return [
        row(backend, mix, events_ms, timer="cuda-events", git_sha=sha, q1_ms=events_ms * 0.9, q3_ms=events_ms * 1.2),
        row(backend, mix, graph_ms, timer="cuda-graph", git_sha=sha),
    ]


def test_flags_pairs_at_or_above_the_ratio_worst_first(row):
    rows = _pair(row, (2048,), 0.120, 0.070) + _pair(row, (1024,) * 8, 0.066, 0.064) + _pair(row, (8192,), 0.30, 0.25)
    flagged, pairs = host_bound_rows(rows)
    assert pairs == 3
    assert [p.events.label for p in flagged] == ["1x2048", "1x8192"]
    assert abs(flagged[0].ratio - 0.120 / 0.070) < 1e-12


def test_rows_of_different_commits_or_backends_are_not_paired(row):
    rows = [
        row("qla", (2048,), 0.120, timer="cuda-events", git_sha="aaa"),
        row("qla", (2048,), 0.070, timer="cuda-graph", git_sha="bbb"),
        row("fla", (2048,), 0.070, timer="cuda-graph", git_sha="aaa"),
    ]
    assert host_bound_rows(rows) == ([], 0)


def test_the_latest_row_of_each_timer_counts(row):
    old = row("qla", (2048,), 0.200, timer="cuda-events", timestamp="2026-12-01T00:00:00")
    new = row("qla", (2048,), 0.075, timer="cuda-events", timestamp="2026-12-02T00:00:00")
    graph = row("qla", (2048,), 0.070, timer="cuda-graph", timestamp="2026-12-01T00:00:00")
    assert host_bound_rows([new, old, graph]) == ([], 1)


def test_report_lists_them_and_says_when_there_is_nothing_to_pair(row, rows):
    text = render_markdown(rows + _pair(row, (2048,), 0.120, 0.070, backend="flashqla"))
    section = text.split("## Host-bound rows")[1].split("\n## ")[0]
    assert "**1 of 1**" in section and "1.71x" in section and "0.108" in section
    assert "No config was timed with both" in render_markdown(rows)


def test_events_rows_that_record_their_host_time_are_flagged_by_its_share(row):
    """host_timed_rows needs no graph row: an events row whose host time per call reaches 90 % of its median."""
    from qla_bench.report.host_bound import host_timed_rows

    host_bound = row("qla", (2048,), 0.075, timer="cuda-events", host_median_ms=0.072)
    gpu_bound = row("qla", (8192,), 0.300, timer="cuda-events", host_median_ms=0.070)
    unrecorded = row("fla", (2048,), 0.500, timer="cuda-events")
    graph = row("qla", (1024,), 0.070, timer="cuda-graph", host_median_ms=0.070)  # not an events row
    flagged, recorded = host_timed_rows([host_bound, gpu_bound, unrecorded, graph])
    assert recorded == 2 and [r.label for r in flagged] == ["1x2048"]
    section = render_markdown([host_bound, gpu_bound]).split("## Host-bound rows")[1].split("\n## ")[0]
    assert "**1 of 2**" in section and "0.96" in section and "0.072" in section
    quiet = render_markdown([gpu_bound]).split("## Host-bound rows")[1].split("\n## ")[0]
    assert "none spends >= 90% of its median in the host" in quiet
