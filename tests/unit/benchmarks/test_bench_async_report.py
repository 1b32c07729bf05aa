"""The async benchmark's pure parts (``tests/benchmarks/async_report.py`` and the report of
``bench_async.py``): spans from ``timeline/*`` (or rebuilt from ``time/*``), throughput over
the training loop, the ideal pipelined bound, the staleness histogram, the learning curve and
the SVG timeline, on hand-made metrics whose answers are known."""

from __future__ import annotations

import argparse
import json
import math
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import async_report as rep  # noqa: E402
import bench_async  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def _it(i, rollout, credit, update, sync, start, **extra):
    """Iteration ``i`` whose phases follow one another from ``start`` seconds."""
    m = {"iteration": float(i), "time/rollout_s": rollout, "time/credit_s": credit, "time/update_s": update,
         "time/sync_s": sync, "time/iteration_s": rollout + credit + update + sync}
    t = start
    for p, d in (("rollout", rollout), ("credit", credit), ("update", update), ("sync", sync)):
        m[f"timeline/{p}_start_s"], m[f"timeline/{p}_end_s"] = t, t + d
        t += d
    m.update(extra)
    return m


def _sync_history():
    return [
        _it(1, 4.0, 0.5, 0.5, 0.0, 10.0, **{"rollout/episodes": 16.0, "tokens/trained": 100.0,
                                            "rollout/generated_tokens": 120.0, "rollout/reward_mean": 0.25,
                                            "rollout/success_rate": 0.25}),
        _it(2, 2.0, 0.5, 2.0, 0.5, 15.0, **{"rollout/episodes": 17.0, "rollout/aborted_episodes": 1.0,
                                            "tokens/trained": 60.0, "rollout/generated_tokens": 80.0,
                                            "rollout/reward_mean": 0.5, "rollout/success_rate": 0.5,
                                            "timeline/checkpoint_start_s": 20.0, "timeline/checkpoint_end_s": 29.0}),
    ]


def test_spans_come_from_the_timeline_metrics():
    spans, rebuilt = rep.phase_spans(_sync_history())
    assert not rebuilt
    assert (1, "rollout", 10.0, 14.0) in spans and (2, "sync", 19.5, 20.0) in spans
    assert (2, "checkpoint", 20.0, 29.0) in spans and len(spans) == 9


def test_spans_are_rebuilt_end_to_end_without_a_timeline():
    h = [{k: v for k, v in m.items() if not k.startswith("timeline/")} for m in _sync_history()]
    h[0]["time/iteration_s"] = 6.0  # one second of replay writes and metrics after the sync
    spans, rebuilt = rep.phase_spans(h)
    assert rebuilt
    assert spans[:4] == [(1, "rollout", 0.0, 4.0), (1, "credit", 4.0, 4.5), (1, "update", 4.5, 5.0), (1, "sync", 5.0, 5.0)]
    assert spans[4] == (2, "rollout", 6.0, 8.0)


def test_a_span_ending_before_it_starts_is_an_error():
    h = _sync_history()
    h[1]["timeline/update_end_s"] = 1.0
    with pytest.raises(ValueError, match=r"iteration 2: timeline/update_end_s=1.0 is before"):
        rep.phase_spans(h)


def test_throughput_counts_the_loop_without_start_up_or_the_final_checkpoint():
    h = _sync_history()
    t = rep.throughput(h, rep.phase_spans(h)[0])
    assert t["wall_s"] == 10.0  # 10 s (first rollout start) to 20 s (last sync end); the checkpoint to 29 s left out
    assert t["episodes"] == 32.0  # the aborted attempt is not an episode
    assert t["episodes_per_s"] == 3.2 and t["trained_tokens_per_s"] == 16.0 and t["rollout_tokens_per_s"] == 20.0
    with pytest.raises(ValueError, match="no timeline spans"):
        rep.throughput(h, [])


def test_ideal_pipelined_bound_is_sum_over_slowest_stage():
    b = rep.ideal_pipelined_bound(_sync_history())
    # round 1: rollout 4 vs train 1; round 2: rollout 2 vs train 3. Lock-step 5 + 5, pipelined 4 + 3.
    assert [r["slowest_s"] for r in b["rounds"]] == [4.0, 3.0]
    assert b["lockstep_s"] == 10.0 and b["pipelined_s"] == 7.0 and b["bound"] == pytest.approx(10 / 7)
    with pytest.raises(ValueError, match="no rounds"):
        rep.ideal_pipelined_bound([])


def test_staleness_histogram_sums_over_updates_and_formats_every_lag():
    h = [{"async/staleness_hist/0": 6.0, "async/staleness_hist/2": 2.0, "async/staleness_mean": 0.5},
         {"async/staleness_hist/0": 2.0, "async/staleness_hist/1": 4.0, "async/staleness_hist/2": None}]
    hist = rep.staleness_histogram(h)
    assert hist == {0: 8, 1: 4, 2: 2} and list(hist) == [0, 1, 2]
    lines = rep.format_histogram(hist, width=8)
    assert len(lines) == 3 and lines[0].endswith(" " + "#" * 8) and lines[1].endswith(" " + "#" * 4)
    assert "57.1%" in lines[0] and "d=2" in lines[2]
    assert rep.format_histogram({0: 3, 2: 1}, width=3)[1].split()[1] == "0"  # a lag with no rows is shown as 0
    assert rep.staleness_histogram([{"rollout/episodes": 4.0}]) == {}
    with pytest.raises(ValueError, match="'async/staleness_hist/x'"):
        rep.staleness_histogram([{"async/staleness_hist/x": 1.0}])


def test_learning_curve_is_against_cumulative_rollout_tokens():
    h = _sync_history() + [{"iteration": 3.0, "rollout/generated_tokens": 5.0, "rollout/reward_mean": None}]
    c = rep.learning_curve(h)
    assert [p["rollout_tokens"] for p in c] == [120.0, 200.0, 205.0]
    assert [p["reward_mean"] for p in c[:2]] == [0.25, 0.5] and math.isnan(c[2]["reward_mean"])


@pytest.mark.parametrize("span, step", [(100.0, 10.0), (23.0, 5.0), (0.7, 0.1), (0.0, 1.0), (1999.0, 200.0)])
def test_tick_steps_are_one_two_five(span, step):
    assert rep.nice_tick_step(span) == pytest.approx(step)


def test_timeline_svg_draws_one_bar_per_span_to_scale():
    h = _sync_history()
    spans, _ = rep.phase_spans(h)
    text = rep.timeline_svg(spans, "sync <run>", t0_s=10.0, t_max_s=20.0, width=1000)
    root = ET.fromstring(text)  # well-formed; the title's "<run>" is escaped
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "span"]
    assert len(bars) == len(spans)
    px_per_s = (1000 - 90 - 20) / 20.0
    first = next(b for b in bars if b.get("data-phase") == "rollout" and b.get("data-iteration") == "1")
    assert float(first.get("x")) == pytest.approx(90.0)  # t0 (the first iteration's start) at the axis' origin
    assert float(first.get("width")) == pytest.approx(4.0 * px_per_s)
    assert "10.00 s to 14.00 s" in first.find(f"{SVG}title").text  # hover shows seconds since train() started
    upd2 = next(b for b in bars if b.get("data-phase") == "update" and b.get("data-iteration") == "2")
    assert float(upd2.get("x")) == pytest.approx(90.0 + 7.5 * px_per_s) and float(upd2.get("width")) == pytest.approx(2 * px_per_s)
    lanes = [t.text for t in root.iter(f"{SVG}text") if t.get("text-anchor") == "end" and t.text in rep.PHASES]
    assert lanes == ["rollout", "credit", "update", "sync", "checkpoint"]
    assert any(t.text == "sync <run>" for t in root.iter(f"{SVG}text"))
    # the same span on a twice longer shared axis is half as wide
    wide = ET.fromstring(rep.timeline_svg(spans, "x", t0_s=10.0, t_max_s=40.0))
    w2 = next(r for r in wide.iter(f"{SVG}rect") if r.get("data-phase") == "rollout" and r.get("data-iteration") == "1")
    assert float(w2.get("width")) == pytest.approx(2.0 * px_per_s)
    with pytest.raises(ValueError, match="width=100"):
        rep.timeline_svg(spans, "x", width=100)


def _args(**kw):
    base = dict(max_staleness=2, partial_rollout="continue", tasks=4, iterations=2, out=Path("/tmp/x"))
    base.update(kw)
    return argparse.Namespace(**base)


def _async_history(speed):
    """The sync history's work done ``speed`` times faster, with a staleness histogram."""
    h = json.loads(json.dumps(_sync_history()))
    for m in h:
        for k in list(m):
            if k.startswith("timeline/"):
                m[k] = 10.0 + (m[k] - 10.0) / speed
        m["async/staleness_hist/0"], m["async/staleness_hist/1"] = 3.0, 1.0
    return h


@pytest.mark.parametrize("speed, met", [(2.5, True), (1.5, False)])
def test_report_gives_ratios_against_the_target_and_the_bound(speed, met):
    meta = dict(run_id="r", train_call_s=1.0, load="0/0/0")
    runs = [bench_async.summarise("sync", _sync_history(), **meta),
            bench_async.summarise("async", _async_history(speed), **meta)]
    lines, summary, ok = bench_async.report(_args(), runs, "tiny")
    assert ok is met and summary["target_met"] is met
    assert summary["ratios"]["episodes_per_s"] == pytest.approx(speed)
    assert summary["ratios"]["trained_tokens_per_s"] == pytest.approx(speed)
    assert summary["ideal_bound"] == pytest.approx(10 / 7)
    text = "\n".join(lines)
    assert f"episodes/s {speed:.2f}x" in text and "ideal pipelined bound 1.43x" in text
    assert ("met" if met else "MISSED") in text
    # the async trainer side took (0.5 + 0.5) + (0.5 + 2 + 0.5) = 4 s: ceiling = sync loop 10 s / 4 s
    assert summary["async_trainer_busy_s"] == 4.0 and summary["trainer_ceiling"] == 2.5 and "at most 2.50x" in text
    assert "d=0" in text and "d=1" in text  # the async run's histogram
    assert summary["success_within_budget"]["async"]["iterations"] == 2
    json.dumps(summary, default=str)  # results.json can hold it
    # above the target's staleness the target does not apply
    assert bench_async.report(_args(max_staleness=3), runs, "tiny")[2] is True


def test_success_within_a_token_budget_takes_whole_iterations():
    h = [{"rollout/generated_tokens": 100.0, "rollout/scored_episodes": 16.0, "rollout/successes": 4.0},
         {"rollout/generated_tokens": 50.0, "rollout/scored_episodes": 16.0, "rollout/successes": 12.0},
         {"rollout/generated_tokens": 80.0, "rollout/scored_episodes": 16.0, "rollout/successes": 16.0}]
    b = rep.success_within_budget(h, 200.0)  # the third iteration would pass 200 tokens
    assert b["iterations"] == 2 and b["rollout_tokens"] == 150.0 and b["episodes"] == 32.0
    assert b["success_rate"] == 0.5 and b["se"] == pytest.approx(math.sqrt(0.25 / 32))
    assert rep.success_within_budget(h, 10.0)["iterations"] == 1  # at least the first
    assert math.isnan(rep.success_within_budget([{"rollout/generated_tokens": 5.0}], 5.0)["success_rate"])


def test_repeats_report_every_run_and_the_best_of_each_mode():
    meta = dict(run_id="r", train_call_s=1.0, load="0/0/0")
    runs = [bench_async.summarise("sync", _sync_history(), repeat=1, **meta),
            bench_async.summarise("async", _async_history(1.5), repeat=1, **meta),
            bench_async.summarise("sync", _async_history(1.25), repeat=2, **meta),  # a less disturbed sync run
            bench_async.summarise("async", _async_history(3.0), repeat=2, **meta)]
    best = bench_async.best_runs(runs)
    assert best["sync"] is runs[2] and best["async"] is runs[3]
    lines, summary, ok = bench_async.report(_args(), runs, "tiny")
    assert summary["ratio_per_repeat"] == [pytest.approx(1.5), pytest.approx(3.0 / 1.25)]
    assert summary["ratios"]["trained_tokens_per_s"] == pytest.approx(3.0 / 1.25) and ok
    assert sum(1 for x in lines if x.startswith("  repeat ")) == 4 and len(summary["all_runs"]) == 4


def _final_eval(reward_mean):
    return {"policy_version": 2, "reward_mean": reward_mean, "reward_mean_low": reward_mean - 0.05,
            "reward_mean_high": reward_mean + 0.05, "pass@1": 0.5, "samples_scored": 128.0, "samples_errored": 0.0,
            "eval_s": 3.0}


@pytest.mark.parametrize("async_rewards, within", [((0.80, 0.86), True), ((0.60, 0.62), False)])
def test_report_compares_the_final_policies_eval_over_seeds(async_rewards, within):
    meta = dict(run_id="r", train_call_s=1.0, load="0/0/0")
    runs = []
    for seed, (rs, ra) in enumerate(zip((0.84, 0.90), async_rewards)):
        runs.append(bench_async.summarise("sync", _sync_history(), seed=seed, final_eval=_final_eval(rs), **meta))
        runs.append(bench_async.summarise("async", _async_history(2.5), seed=seed, final_eval=_final_eval(ra), **meta))
    lines, summary, _ = bench_async.report(_args(eval_tasks=32, eval_samples=4), runs, "tiny")
    cmp = summary["final_eval_comparison"]
    assert cmp["modes"]["sync"]["per_seed"] == [0.84, 0.90] and cmp["modes"]["async"]["per_seed"] == list(async_rewards)
    assert cmp["difference"] == pytest.approx(sum(async_rewards) / 2 - 0.87)
    sd_s = math.sqrt(2 * 0.03 ** 2)  # sample sd of (0.84, 0.90)
    assert cmp["noise"] == pytest.approx(max(sd_s, abs(async_rewards[1] - async_rewards[0]) / math.sqrt(2)))
    assert cmp["within_noise"] is within
    text = "\n".join(lines)
    assert "held-out eval of each run's final policy (32 test tasks x 4 samples" in text
    assert ("within the seeds' spread" if within else "WORSE beyond the seeds' spread") in text.split("final-policy")[1]
    assert sum(1 for x in lines if "policy version 2, reward_mean" in x) == 4
    json.dumps(summary, default=str)


def test_compare_values_leaves_out_nan_and_needs_values():
    import async_curves as curves

    cmp = curves.compare_values({"sync": [0.5, math.nan, 0.7], "async": [0.6]})
    assert cmp["modes"]["sync"]["n"] == 2 and cmp["modes"]["sync"]["mean"] == pytest.approx(0.6)
    assert cmp["modes"]["async"]["std"] == 0.0 and cmp["difference"] == pytest.approx(0.0)
    assert cmp["se_difference"] == pytest.approx(math.sqrt(0.02 / 2))  # sync sd^2 = 0.02
    with pytest.raises(ValueError, match="at least one value per mode"):
        curves.compare_values({"sync": [], "async": [0.1]})


def test_policy_curve_counts_each_sample_for_the_version_that_drew_it():
    import async_curves as curves

    # one policy whose reward is 0.1 * version, learned identically in both modes; 4 updates of
    # 100 tokens. Sync trains version i's samples at update i; async (k = 2) trains at update i
    # samples of version i - 2 (the first three updates: version 0's).
    updates = [(i + 1, 100.0) for i in range(4)]
    sync_samples = [(v, 0.1 * v) for v in range(4) for _ in range(2)]
    async_samples = [(max(0, i - 2), 0.1 * max(0, i - 2)) for i in range(4) for _ in range(2)]
    ps = curves.policy_curve(sync_samples, updates, complete_through=3)
    assert [(p["iteration"], p["rollout_tokens"], p["episodes"]) for p in ps] == [(0, 0, 2), (1, 100, 2), (2, 200, 2),
                                                                                  (3, 300, 2)]
    assert [p["reward_mean"] for p in ps] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    pa = curves.policy_curve(async_samples, updates, complete_through=4 - 1 - 2)
    assert [(p["iteration"], p["rollout_tokens"], p["episodes"]) for p in pa] == [(0, 0, 6), (1, 100, 2)]
    # same policy, same curve where both have points: the lag is not counted as slower learning,
    # while the training curve (reward per update: 0, 0, 0, 0.1 against 0, 0.1, 0.2, 0.3) is 0.2 behind at the end
    assert [p["reward_mean"] for p in pa] == pytest.approx([0.0, 0.1])
    # versions past complete_through are left out (their groups may not all have been trained)
    assert [p["iteration"] for p in curves.policy_curve(sync_samples, updates, complete_through=1)] == [0, 1]
    with pytest.raises(ValueError, match="policy version 5; expected 0..4"):
        curves.policy_curve([(5, 1.0)], updates, 4)
    with pytest.raises(ValueError, match="policy version -1"):
        curves.policy_curve([(-1, 1.0)], updates, 4)
    assert curves.policy_curve([], updates, 3) == []


def test_policy_curve_places_versions_by_the_recorded_version_not_the_line_number():
    import async_curves as curves

    # the second iteration trained nothing (no update: the version stays 1); version 2 comes
    # after 300 tokens, not 200
    updates = [(1, 100.0), (1, 100.0), (2, 100.0), (3, 100.0)]
    pts = curves.policy_curve([(0, 0.0), (1, 0.5), (2, 1.0), (3, 1.0)], updates, complete_through=3)
    assert [(p["iteration"], p["rollout_tokens"]) for p in pts] == [(0, 0), (1, 100), (2, 300), (3, 400)]


def test_geometric_mean_of_ratios():
    import async_curves as curves

    assert curves.geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    assert curves.geometric_mean([1.96, 2.20, 2.07]) == pytest.approx((1.96 * 2.20 * 2.07) ** (1 / 3))
    for bad in ([], [1.0, 0.0], [math.nan]):
        with pytest.raises(ValueError, match="expected positive values"):
            curves.geometric_mean(bad)


def _words_runs(sync_tps, async_tps, lag=2, async_slope=0.1):
    """Per seed, one sync and one async run of 6 updates x 100 tokens; the policy's reward is
    ``slope * version`` (sync slope 0.1), and async trains samples ``lag`` versions old."""
    meta = dict(run_id="r", train_call_s=1.0, load="0/0/0")
    runs = []
    for seed, (ts, ta) in enumerate(zip(sync_tps, async_tps)):
        for mode, tps, slope, k in (("sync", ts, 0.1, 0), ("async", ta, async_slope, lag)):
            hist = []
            for i in range(6):
                v = max(0, i - k)
                hist.append(_it(i + 1, 1.0 / tps, 0.0, 0.0, 0.0, 10.0 + i / tps, **{
                    "rollout/episodes": 1.0, "tokens/trained": 1.0, "rollout/generated_tokens": 100.0,
                    "rollout/reward_mean": slope * v + 0.01 * seed, "policy_version": float(i + 1)}))
            samples = [(max(0, i - k), slope * max(0, i - k) + 0.01 * seed) for i in range(6)]
            samples += [(v, 0.0) for v in range(6 - k, 6)]  # in flight at the end: past the cut, left out
            runs.append(bench_async.summarise(mode, hist, seed=seed, policy_version=6,
                                              policy_samples=(samples, {"episodes": 6.0, "mixed": 0.0}),
                                              max_staleness=k, **meta))
    return runs


def test_the_target_takes_each_seeds_ratio_and_the_policy_curve():
    # seed 1's sync run is the fastest sync and seed 0's async the fastest async: best-of-each
    # across seeds would give 2.4 / 1.25 = 1.92x; per seed (same work) 2.4x and 1.8x, geometric mean 2.08x
    runs = _words_runs(sync_tps=(1.0, 1.25), async_tps=(2.4, 2.25))
    assert bench_async.seed_ratios(runs)[0]["trained_tokens_per_s"] == pytest.approx(2.4)
    lines, summary, ok = bench_async.report(_args(iterations=6), runs, "tiny")
    assert summary["ratios"]["trained_tokens_per_s"] == pytest.approx(math.sqrt(2.4 * 1.8))
    text = "\n".join(lines)
    assert "seed 0: 2.40x, seed 1: 1.80x" in text and "geometric mean over 2 seeds" in text
    # async's training curve runs two updates (0.2) behind; its policy curve is the same policy's
    assert summary["seed_comparison"]["difference"] < -0.1 and not summary["seed_comparison"]["within_noise"]
    pc = summary["policy_comparison"]
    assert pc["difference"] == pytest.approx(0.0) and pc["within_noise"] and summary["curve_within_noise"]
    assert ok and summary["target_met"] and "learning target (policy curve not worse beyond the seeds' spread): met" in text
    # a policy that learns at half the rate misses the learning target, whatever the throughput
    slow = _words_runs(sync_tps=(1.0, 1.25), async_tps=(2.4, 2.25), async_slope=0.05)
    lines, summary, ok = bench_async.report(_args(iterations=6), slow, "tiny")
    assert summary["policy_comparison"]["difference"] < -0.05 and not summary["curve_within_noise"]
    assert not ok and not summary["target_met"]
    assert "learning target (policy curve not worse beyond the seeds' spread): MISSED" in "\n".join(lines)


def test_report_cuts_the_async_policy_curve_k_versions_early_and_skips_a_curve_of_version_0_only():
    runs = _words_runs(sync_tps=(1.0, 1.25), async_tps=(2.4, 2.25))
    assert [p["iteration"] for p in runs[0]["policy_curve"]] == [0, 1, 2, 3, 4, 5]  # sync: every version
    assert [p["iteration"] for p in runs[1]["policy_curve"]] == [0, 1, 2, 3]  # async, k = 2: 6 - 1 - 2
    # 3 updates at k = 2: async keeps version 0 only (x = 0): no budget to compare at, and no crash
    short = [bench_async.summarise(r["mode"], r["history"][:3], seed=r["seed"], policy_version=3,
                                   policy_samples=([(0, 0.5)], {"episodes": 1.0, "mixed": 0.0}),
                                   max_staleness=r["max_staleness"], run_id="r", train_call_s=1.0, load="0")
             for r in runs]
    lines, summary, ok = bench_async.report(_args(iterations=3), short, "tiny")
    assert "policy_comparison" not in summary and "policy curve: no comparison" in "\n".join(lines)


def test_a_seed_with_a_throughput_ratio_that_is_not_a_number_misses_the_target():
    runs = _words_runs(sync_tps=(1.0, 1.25), async_tps=(2.4, 2.25))
    for r in runs:
        if r["mode"] == "sync" and r["seed"] == 1:
            r["throughput"] = {**r["throughput"], "trained_tokens_per_s": 0.0}  # trained nothing
    lines, summary, ok = bench_async.report(_args(iterations=6), runs, "tiny")
    assert math.isnan(summary["ratios"]["trained_tokens_per_s"]) and not ok and "MISSED" in "\n".join(lines)


def test_trained_samples_reads_the_consumed_episodes_from_a_real_store(tmp_path):
    from agentrl.replay import ReplayStore
    from agentrl.types import Episode, TerminationReason, Turn

    def ep(eid, versions, reward, reason=TerminationReason.ENV_TERMINATED):
        turns = [Turn(prompt_ids=[1, 2], completion_ids=[3, 4], behavior_log_probs=[-0.5, -0.5], policy_version=v,
                      reward=reward / len(versions)) for v in versions]
        return Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, terminated=True,
                       termination_reason=reason, episode_id=f"run/it0/g/{eid}")

    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("run", {})
        store.add_episodes("run", 0, [
            ep("0/a0", [0], 1.0),  # dropped as stale (its request re-issued as a1): never trained
            ep("1/a0", [1], 0.0),
            ep("2/a0", [1, 2], 1.0),  # spans versions 1 and 2: credited to 2
            ep("3/a0", [2], 0.0, TerminationReason.INFRA_ERROR),  # errored: never scored
        ])
        store.add_episodes("run", 1, [ep("0/a1", [2], 0.5)])
        store.add_episodes("run", 1, [ep("9/a0", [2], 1.0)], kind="eval")
    samples, counts = bench_async.trained_samples(tmp_path, "run")
    assert sorted(samples) == [(1, 0.0), (2, 0.5), (2, 1.0)]
    assert counts == {"episodes": 3.0, "mixed": 1.0}


def test_report_again_summarises_recorded_runs_with_todays_statistics(tmp_path, capsys):
    from agentrl.replay import ReplayStore
    from agentrl.types import Episode, TerminationReason, Turn

    out = tmp_path / "bench"
    all_runs = []
    for seed in (0, 1):
        for mode, k, tps in (("sync", 0, 1.0), ("async", 2, 2.5)):
            run_dir = out / f"{mode}-s{seed}"
            run_dir.mkdir(parents=True)
            hist = [_it(i + 1, 1.0 / tps, 0.0, 0.0, 0.0, 10.0 + i / tps, **{
                "rollout/episodes": 1.0, "tokens/trained": 1.0, "rollout/generated_tokens": 100.0,
                "rollout/reward_mean": 0.1 * max(0, i - k), "policy_version": float(i + 1)}) for i in range(6)]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in hist))
            with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
                store.start_run("run", {})
                for i in range(6):
                    v = max(0, i - k)
                    turn = Turn(prompt_ids=[1], completion_ids=[2], behavior_log_probs=[-0.5], policy_version=v,
                                reward=0.1 * v + 0.01 * seed)
                    store.add_episodes("run", i, [Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=[turn],
                                                          terminated=True,
                                                          termination_reason=TerminationReason.ENV_TERMINATED,
                                                          episode_id=f"run/it{i}/g/0/a0")])
            all_runs.append({"mode": mode, "run_id": "run", "run_dir": str(run_dir), "policy_version": 6,
                             "train_call_s": 9.0, "load": "1/1/1", "repeat": 1, "seed": seed, "final_eval": None})
    args = {**vars(bench_async.parse_args(["--out", str(tmp_path / "unused")])), "out": str(out), "iterations": 6,
            "seeds": [0, 1]}
    (out / "results.json").write_text(json.dumps({"model": "/m/tiny", "args": args, "all_runs": all_runs}))
    assert bench_async.main(["--report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "seed 0: 2.50x, seed 1: 2.50x" in text and "target >= 2.0x: met" in text
    assert "learning target (policy curve not worse beyond the seeds' spread): met" in text
    summary = json.loads((out / "report.json").read_text())
    assert summary["policy_comparison"]["paired_difference"] == pytest.approx(0.0)
    assert "policy_comparison" not in json.loads((out / "results.json").read_text())  # the record is kept
    assert bench_async.main(["--report", str(out)]) == 0  # and reads the same again
    assert (out / "policy_curves.svg").is_file() and (out / "timeline_async.svg").is_file()
    assert bench_async.main(["--report", str(tmp_path)]) == 2  # no results.json there
