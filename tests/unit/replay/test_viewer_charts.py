"""The run page's chart geometry and metric series (pure functions of agentrl.replay.viewer)."""

from __future__ import annotations

import math

from agentrl.replay.viewer.charts import MAX_POINTS, line_chart, nice_ticks, stacked_bars, thin
from agentrl.replay.viewer.run_charts import phase_seconds, run_charts, token_table


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    ticks = nice_ticks(3.0, 1234.0)
    assert ticks[0] <= 3.0 and ticks[-1] >= 1234.0 and len(ticks) <= 8
    assert nice_ticks(5.0, 5.0)  # a flat series still gets an axis
    assert nice_ticks(math.nan, 1.0) == []


def test_thin_keeps_first_and_last_and_at_most_about_max_points() -> None:
    pts = list(range(1001))
    out = thin(pts, 100)
    assert out[0] == 0 and out[-1] == 1000 and len(out) <= 102 and out == sorted(set(out))
    assert thin(pts[:50], 100) == pts[:50]


def test_line_chart_maps_points_into_the_plot_and_keeps_links() -> None:
    c = line_chart("c", "t", "iteration", "", [("reward", [(0, 0.0, "/e?i=0"), (1, math.nan, "/e?i=1"), (2, 1.0, "/e?i=2")])])
    (line,) = c.lines
    assert [p.href for p in line.points] == ["/e?i=0", "/e?i=2"]  # NaN left out
    l, t, r, b = c.plot
    assert line.points[0].cx == l and line.points[-1].cx == r
    assert line.points[0].cy > line.points[-1].cy  # higher values are drawn higher
    assert line_chart("e", "t", "x", "", [("s", [])]).empty
    long = line_chart("l", "t", "x", "", [("s", [(i, float(i), None) for i in range(5000)])])
    assert len(long.lines[0].points) <= MAX_POINTS + 1


def test_stacked_bars_stack_segments_per_iteration() -> None:
    c = stacked_bars("p", "t", "s", [0, 1], [("rollout", [2.0, 1.0]), ("update", [1.0, math.nan])], ["/0", "/1"])
    first, second = c.bars
    assert [b.label.split(":")[1].split()[0] for b in first] == ["rollout", "update"]
    assert len(second) == 1  # NaN counts as nothing
    assert math.isclose(first[0].y, first[1].y + first[1].h, abs_tol=0.11)  # update sits on rollout


def test_phase_seconds_prefers_time_metrics_and_moves_checkpoints_back() -> None:
    metrics = {
        "time/rollout_s": [(0, 3.0), (1, 4.0)],
        "timeline/update_start_s": [(0, 10.0), (1, 20.0)], "timeline/update_end_s": [(0, 12.0), (1, 25.0)],
        # the checkpoint after iteration 0 is written after its metrics: it is in iteration 1's line
        "timeline/checkpoint_start_s": [(1, 30.0)], "timeline/checkpoint_end_s": [(1, 31.5)],
    }
    ph = phase_seconds(metrics, [0, 1])
    assert ph["rollout"] == [3.0, 4.0] and ph["update"] == [2.0, 5.0]
    assert ph["checkpoint"][0] == 1.5 and math.isnan(ph["checkpoint"][1])
    assert "sync" not in ph


def test_run_charts_link_every_point_to_its_iteration() -> None:
    metrics = {"rollout/reward_mean": [(0, 0.1), (1, 0.4)], "rollout/success_rate": [(0, 0.0), (1, 0.5)],
               "tokens/generated": [(0, 100.0), (1, 300.0)], "time/iteration_s": [(0, 5.0), (1, 7.0)],
               "async/staleness_mean": [(1, 0.5)]}
    charts = {c.chart_id: c for c in run_charts(metrics, lambda it: f"/episodes?iteration={it}", is_async=True)}
    tokens = charts["reward-tokens"].lines[0].points
    assert [(p.x, p.href) for p in tokens] == [(100.0, "/episodes?iteration=0"), (400.0, "/episodes?iteration=1")]
    assert [p.x for p in charts["reward-wallclock"].lines[0].points] == [5.0, 12.0]
    assert "staleness" in charts and charts["logprob-gap"].empty
    rows = token_table(metrics)  # [(iteration, [generated, trained, discarded])], NaN where not written
    assert [(it, vals[0]) for it, vals in rows] == [(0, 100.0), (1, 300.0)]
    assert all(math.isnan(v) for _, vals in rows for v in vals[1:])
