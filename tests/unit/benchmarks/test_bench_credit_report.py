"""The credit benchmark's report (``tests/benchmarks/credit_report.py``, ``credit_plot.py``) on
synthetic result files, its suites' configs, and the bench's skip logic (``bench_credit.py``)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(_DIR))  # credit_plot imports credit_report by name, as the bench does


def _load(name):
    spec = importlib.util.spec_from_file_location(name, _DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return sys.modules[name]


rep = _load("credit_report")
suites = _load("credit_suites")


def _row(it, tokens, successes, scored, **extra):
    return {"iteration": it, "tokens/generated": tokens, "rollout/successes": successes,
            "rollout/scored_episodes": scored, **extra}


def _result(suite, est, seed, *, tokens=(100, 100), after_tasks=None, before=0.25, after=0.5, diag=None):
    diag = diag or {}
    h = [_row(1, tokens[0], 2, 8, **{"eval_before/pass@1": before, "eval_before/pass@1_low": 0.1,
                                     "eval_before/pass@1_high": 0.4}, **diag),
         _row(2, tokens[1], 4, 8, **{"eval/pass@1": after, "eval/pass@1_low": after - 0.1,
                                     "eval/pass@1_high": after + 0.1, "eval/iteration": 2}, **diag)]
    tasks = after_tasks or {"t1": [1.0, 0.0], "t2": [0.0, 1.0]}
    return {"complete": True, "suite": suite, "estimator": est, "seed": seed, "fingerprint": "f", "wall_s": 60.0,
            "history": h, "eval_tasks": {"before": {"t1": [0.0, 0.0], "t2": [1.0, 0.0]}, "after": tasks}}


def _write(out: Path, res):
    d = out / res["suite"] / f"{res['estimator']}-s{res['seed']}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "result.json").write_text(json.dumps(res))


def test_paired_difference_hand_computed():
    a = {"t1": [1.0, 1.0], "t2": [0.0, 1.0], "t3": [0.0, 0.0]}
    b = {"t1": [1.0, 0.0], "t2": [0.0, 1.0], "t3": [0.0, 0.0], "t4": [1.0]}  # t4: not scored by a, left out
    d = rep.paired_difference(a, b)
    assert d["diff"] == pytest.approx(0.5 / 3) and d["tasks"] == 3
    assert 0.0 <= d["low"] <= d["diff"] <= d["high"] <= 0.5  # every per-task difference is 0 or 0.5
    assert (d["differ"], d["both_solved"], d["both_failed"]) == (1, 0, 1)  # t1 differs; t3 failed by both
    alike = rep.paired_difference({"t": [1.0, 1.0], "u": [0.0], "v": [1.0, 0.0]}, {"t": [1.0], "u": [0.0], "v": [0.0, 1.0]})
    assert (alike["diff"], alike["differ"], alike["both_solved"], alike["both_failed"]) == (0.0, 0, 1, 1)
    assert "differ on 0 of 3 tasks (both: 1 solved in every sample, 1 in none)" in rep._diff(alike)
    same = rep.paired_difference({"t": [1.0], "u": [0.0]}, {"t": [0.0], "u": [-1.0]})
    assert (same["diff"], same["low"], same["high"]) == (1.0, 1.0, 1.0)
    assert rep.paired_difference({"t": [1.0]}, {"u": [1.0]}) is None


def test_mean_interval_is_a_t_interval():
    m = rep.mean_interval([0.1, 0.3])
    half = 12.706 * math.sqrt(0.02) / math.sqrt(2)  # t(0.975, 1) x sd / sqrt(n)
    assert m["mean"] == pytest.approx(0.2) and m["low"] == pytest.approx(0.2 - half)
    assert math.isnan(rep.mean_interval([0.4])["low"]) and rep.mean_interval([])["n"] == 0


def test_at_budget_and_curves():
    h = [_row(1, 100, 1, 10), _row(2, 300, 3, 10)]
    rate, n, used, eps = rep.at_budget(h, 250)  # all of 1, half of 2
    assert (n, used, eps) == (2, 250, 15) and rate == pytest.approx(2.5 / 15)
    assert rep.training_curve(h) == [(100, 0.1), (400, 0.3)]
    h = _result("s", "grpo", 0)["history"]
    assert rep.held_out_curve(h) == [(0.0, 0.25, 0.1, 0.4), (200.0, 0.5, 0.4, 0.6)]


def test_diagnostics_and_zero_gradient_share():
    h = [{"credit/zero_grad_update": 1.0, "credit/turn_adv_differs_frac": 0.0, "critic/explained_variance": -0.5},
         {"credit/zero_grad_update": 0.0, "credit/turn_adv_differs_frac": 0.5, "critic/explained_variance": 0.1}]
    d = rep.diagnostics(h)
    assert d["zero_grad_updates"] == 0.5 and d["turn_adv_differs_frac"] == 0.25
    assert d["critic_ev_mean"] == pytest.approx(-0.2) and d["critic_ev_last"] == 0.1
    # an older run without credit/zero_grad_update: the trainer's skipped zero-gradient steps
    old = [{"actor/no_signal_steps": 1.0}, {"actor/no_signal_steps": 0.0}, {"actor/no_signal_steps": 0.0}]
    assert rep.diagnostics(old)["zero_grad_updates"] == pytest.approx(1 / 3)
    assert rep.diagnostics([{}])["zero_grad_updates"] is None


def test_critic_diagnosis_says_when_the_values_give_no_baseline():
    h = [{"critic/explained_variance": 0.0, "critic/values_mean": 0.0, "critic/returns_mean": 0.5,
          "advantages/mean": 0.5, "actor/entropy": 0.05, "rollout/turns_mean": 3.0},
         {"critic/explained_variance": 0.002, "critic/values_mean": 0.02, "critic/returns_mean": 0.9,
          "advantages/mean": 0.9, "actor/entropy": 0.005, "rollout/turns_mean": 4.0}]
    d = rep.diagnostics(h)
    assert (d["critic_values_last"], d["critic_returns_last"], d["adv_mean"]) == pytest.approx((0.02, 0.9, 0.7))
    text = rep.critic_diagnosis(d)
    assert "explained variance mean 0.001, last 0.002" in text
    assert "last values +0.020 against returns +0.900: no baseline yet, the advantages are about the returns (mean +0.700)" in text
    assert text.endswith("entropy 0.050 -> 0.005; turns per episode 3.00 -> 4.00")
    assert "no baseline" not in rep.critic_diagnosis({**d, "critic_values_last": 0.6})  # near the returns: a baseline
    wrong_sign = rep.critic_diagnosis({**d, "critic_values_last": -0.6, "adv_mean": None})  # far off the other way
    assert "last values -0.600 against returns +0.900: no baseline yet;" in wrong_sign
    assert rep.critic_diagnosis({}) == "no critic/explained_variance"


def test_gigpo_diagnosis_names_empty_groups_or_small_step_advantages():
    base = {"gigpo_steps_in_groups_ge2_frac": 0.3, "gigpo_step_group_size_mean": 1.4}
    empty = rep.gigpo_diagnosis({**base, "gigpo_later_steps_in_groups_ge2_frac": 0.0,
                                 "gigpo_step_adv_abs_mean": 0.2, "gigpo_episode_adv_abs_mean": 0.5})
    small = rep.gigpo_diagnosis({**base, "gigpo_later_steps_in_groups_ge2_frac": 0.4,
                                 "gigpo_step_adv_abs_mean": 0.01, "gigpo_episode_adv_abs_mean": 0.5})
    present = rep.gigpo_diagnosis({**base, "gigpo_later_steps_in_groups_ge2_frac": 0.4,
                                   "gigpo_step_adv_abs_mean": 0.2, "gigpo_episode_adv_abs_mean": 0.5})
    assert empty.startswith("step groups empty") and small.startswith("step advantages small")
    assert present.startswith("step term present") and "30% of steps" in present
    assert rep.gigpo_diagnosis({}) == "no gigpo/* metrics in this run"
    one_turn = rep.gigpo_diagnosis({**base, "multi_turn_frac": 0.0, "gigpo_later_steps_in_groups_ge2_frac": 0.0,
                                    "gigpo_step_adv_abs_mean": 0.0, "gigpo_episode_adv_abs_mean": 0.0})
    assert one_turn.startswith("one-turn episodes only")


def test_report_from_result_files(tmp_path):
    win = {"t1": [1.0, 1.0], "t2": [1.0, 1.0]}
    lose = {"t1": [0.0, 0.0], "t2": [0.0, 0.0]}
    gdiag = {"gigpo/later_steps_in_groups_ge2_frac": 0.5, "gigpo/step_adv_abs_mean": 0.2,
             "gigpo/episode_adv_abs_mean": 0.4, "gigpo/steps_in_groups_ge2_frac": 0.6,
             "gigpo/step_group_size_mean": 2.0, "credit/zero_grad_update": 0.0}
    for seed in (0, 1):
        _write(tmp_path, _result("s", "grpo", seed, after_tasks=lose, after=0.0))
        _write(tmp_path, _result("s", "gigpo", seed, after_tasks=win, after=1.0, tokens=(100, 300), diag=gdiag))
        _write(tmp_path, _result("s", "turn_critic", seed, after_tasks=lose, after=0.0))
    broken = tmp_path / "s" / "grpo-s2"
    broken.mkdir()
    (broken / "result.json").write_text(json.dumps({"complete": False, "suite": "s"}))  # unfinished: not read
    by_suite = rep.load_results(tmp_path)
    assert [(r["seed"], r["estimator"]) for r in by_suite["s"]][:3] == [(0, "gigpo"), (0, "grpo"), (0, "turn_critic")]
    report = rep.build_report(by_suite)["s"]
    rows = {(r["seed"], r["estimator"]): r for r in report["rows"]}
    g = rows[(0, "gigpo")]
    assert g["budget"] == 200 and g["tokens"] == 400 and g["tokens_over_budget"] == pytest.approx(1.0)
    # within B = 200: all of iteration 1 (2/8) and 100/300 of iteration 2 (4/8 scaled)
    assert g["train_at_budget"] == pytest.approx((2 + 4 / 3) / (8 + 8 / 3))
    assert g["diff_after"]["diff"] == 1.0 and g["diff_after"]["low"] == 1.0
    assert g["gigpo_diagnosis"].startswith("step term present")
    assert rows[(0, "turn_critic")]["diff_after"]["diff"] == 0.0
    assert report["pooled"]["gigpo"]["separated"] == "better"
    assert report["pooled"]["turn_critic"]["separated"] is None
    text = rep.format_report(rep.build_report(by_suite))
    assert "separated from GRPO (better) in every seed" in text and "not separated from GRPO" in text
    assert "400 (+100%) (200)" in text and "over 10% more rollout tokens" in text
    summary = rep.format_summary(rep.build_report(by_suite)).splitlines()
    assert len(summary) == 2 + 6  # header, rule, 2 seeds x 3 estimators
    assert summary[2].startswith("| s | 0 | grpo | ") and summary[3].startswith("| s | 0 | gigpo | ")
    assert "| +1.000 [+1.000, +1.000] |" in summary[3]
    rows_md = [line for line in text.splitlines() if line.startswith("| 0 | gigpo")]
    assert rows_md and "\\|omega A_S\\|" in rows_md[0]  # a cell's own bars are escaped
    assert len(re.findall(r"(?<!\\)\|", rows_md[0])) == 12  # 11 columns


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    plot = _load("credit_plot")
    runs = [_result("s", e, s) for e in ("grpo", "gigpo") for s in (0, 1)]
    path = plot.plot_curves({"s": runs}, tmp_path / "x" / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no complete result.json"):
        plot.plot_curves({}, tmp_path / "y.png")


def test_every_suite_loads_and_holds_the_shared_settings_equal():
    from agentrl.config import load_config

    root = _DIR.parents[1]
    for table in (suites.SUITES, suites.GPU_SUITES):
        for s in table.values():
            cfgs = {e: load_config(root / s.config if s.config else None, s.run_overrides(e, 3, "/tmp/r"))
                    for e in suites.ESTIMATORS}
            for e, c in cfgs.items():
                assert c.algorithm.advantage == e and c.run.seed == 3 and c.run.iterations == s.iterations
                dump = c.model_dump()
                dump.pop("algorithm")
                other = cfgs["grpo"].model_dump()
                other.pop("algorithm")
                assert dump == other  # only the algorithm section differs between estimators
            assert cfgs["gigpo"].algorithm.gigpo.mode == "mean_std_norm"
            smoke = load_config(root / s.config if s.config else None, s.run_overrides("grpo", 0, "/tmp/r",
                                                                                    extra=suites.SMOKE))
            assert smoke.run.iterations == 1 and smoke.model.path == "tiny-random-smollm2"


def test_report_publishes_the_tables_and_the_png(tmp_path):
    pytest.importorskip("matplotlib")
    bench = _load("bench_credit")
    for e in ("grpo", "gigpo"):
        _write(tmp_path, _result("s", e, 0))
    assert bench.main(["--report", "--out", str(tmp_path), "--publish", str(tmp_path / "docs")]) == 0
    text = (tmp_path / "docs" / "report.md").read_text()
    assert text == (tmp_path / "report.md").read_text() and text.startswith("## Summary\n\n| suite | seed |")
    assert "## Every run, with its diagnostics" in text
    assert (tmp_path / "docs" / "curves.png").read_bytes() == (tmp_path / "curves.png").read_bytes()
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- credit-table -->\nold table\n<!-- /credit-table -->\n\nafter\n")
    assert bench.main(["--report", "--out", str(tmp_path), "--readme", str(readme)]) == 0
    summary = text.split("## Summary\n\n", 1)[1].split("\n\n", 1)[0]
    assert readme.read_text() == f"# x\n\n<!-- credit-table -->\n{summary}\n<!-- /credit-table -->\n\nafter\n"
    assert not bench.refresh_readme(tmp_path / "none.md", summary)
    (tmp_path / "report.md").unlink()
    with pytest.raises(SystemExit, match="no lines <!-- credit-table -->"):
        bench.main(["--report", "--out", str(tmp_path), "--readme", str(tmp_path / "none.md")])
    assert not (tmp_path / "report.md").exists()  # checked before anything is written
    with pytest.raises(SystemExit):  # argparse's error: a copy without a report would start the training
        bench.main(["--publish", str(tmp_path / "docs")])
    published = sorted(p.relative_to(tmp_path / "docs") for p in (tmp_path / "docs").rglob("result.json"))
    assert [str(p) for p in published] == ["results/s/gigpo-s0/result.json", "results/s/grpo-s0/result.json"]


def test_resume_from_a_published_copy_skips_its_runs(tmp_path, capsys):
    bench = _load("bench_credit")
    shell = bench.suites_for(False)["shell"]
    pub = tmp_path / "docs" / "results"
    for est in ("grpo", "gigpo"):
        _write(pub, {**_result("shell", est, 0), "fingerprint": shell.fingerprint((), None)})
    _write(pub, _result("shell", "grpo", 1))  # fingerprint "f": another setting, never a finished run
    _write(pub, {**_result("guess", "grpo", 0), "fingerprint": "x"})  # a suite not asked for: not copied
    broken = bench.result_path(pub, "shell", "turn_critic", 0)
    broken.parent.mkdir(parents=True)
    broken.write_text(json.dumps({"complete": False}))  # an unfinished file is never copied
    out = tmp_path / "runs"
    mine = bench.result_path(out, "shell", "gigpo", 0)
    mine.parent.mkdir(parents=True)
    mine.write_text(json.dumps({"complete": True, "mine": 1}))  # a local finished run is kept
    assert bench.main(["--out", str(out), "--resume-from", str(pub), "--suites", "shell", "--seeds", "0,1",
                       "--max-runs", "0"]) == 0
    said = capsys.readouterr().out
    assert "1 finished run(s) copied" in said and "1 left out, run with other settings" in said
    assert "2 of 6 runs already done; 0 to run now" in said  # grpo-s0 copied, gigpo-s0 local
    assert bench.is_done(bench.result_path(out, "shell", "grpo", 0))
    assert json.loads(mine.read_text()) == {"complete": True, "mine": 1}
    assert not bench.result_path(out, "shell", "turn_critic", 0).exists()
    assert not bench.result_path(out, "shell", "grpo", 1).exists() and not (out / "guess").exists()
    written, other = bench.copy_results(pub, tmp_path / "all", overwrite=False)  # no filter: every complete file
    assert len(written) == 4 and other == []
    with pytest.raises(SystemExit, match="no such folder of result files"):
        bench.copy_results(tmp_path / "nowhere", out, overwrite=False)
    with pytest.raises(SystemExit, match=r"--publish puts them in .*docs/results"):
        bench.copy_results(tmp_path / "docs", out, overwrite=False)  # the publish folder, not its results/
    fresh = tmp_path / "fresh"  # a fresh checkout's report of the published runs: the same filter, then the report
    assert bench.main(["--report", "--out", str(fresh), "--resume-from", str(pub), "--suites", "shell"]) == 0
    said = capsys.readouterr().out
    assert "2 finished run(s) copied" in said and "1 left out, run with other settings" in said
    assert sorted(p.relative_to(fresh).as_posix() for p in fresh.rglob("result.json")) == [
        "shell/gigpo-s0/result.json", "shell/grpo-s0/result.json"]
    assert (fresh / "report.md").read_text().startswith("## Summary\n\n| suite | seed |")


def test_eval_outcomes_counts_scored_episodes_and_their_action_sequences(tmp_path):
    from agentrl.replay import ReplayStore
    from agentrl.types.episode import Episode, TerminationReason
    from agentrl.types.turn import Turn

    bench = _load("bench_credit")

    def ep(eid, task, guesses, reward, error=False):
        turns = [Turn([1, 2], [3, 4], [-0.1, -0.1], reward=0.0, action_text=f"{g}\nrest") for g in guesses]
        turns[-1].reward = reward
        return Episode(group_id="g", env_id="e", task_id=task, seed=0, turns=turns, terminated=not error,
                       termination_reason=TerminationReason.INFRA_ERROR if error else TerminationReason.ENV_TERMINATED,
                       error={"type": "x", "message": "y"} if error else None, episode_id=eid)

    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("r", {})
        store.add_episodes("r", 0, [ep("r/eval-before/a", "t1", [1], 0.0), ep("r/eval-before/b", "t2", [1], 1.0)],
                           kind="eval")
        store.add_episodes("r", 1, [ep("r/eval/it1/a", "t1", [9], 0.0)], kind="eval")  # not the last eval
        store.add_episodes("r", 2, [ep("r/eval/it2/a", "t1", [1, 2], 0.0), ep("r/eval/it2/b", "t1", [1, 2], 1.0),
                                    ep("r/eval/it2/c", "t2", [3], 1.0), ep("r/eval/it2/d", "t2", [5], 0.0, error=True)],
                           kind="eval")
    tasks, top = bench.eval_outcomes(tmp_path, "r")
    assert tasks == {"before": {"t1": [0.0], "t2": [1.0]}, "after": {"t1": [0.0, 1.0], "t2": [1.0]}}
    assert top == {"before": [["1", 2, 1]], "after": [["1 -> 2", 2, 1], ["3", 1, 1]]}  # the errored one left out


def test_bench_skips_finished_runs_and_orders_seed_by_seed(tmp_path):
    bench = _load("bench_credit")
    args = bench.argparse.Namespace(gpu=False, suites="shell,guess", estimators="grpo,gigpo", seeds="0,1", smoke=False)
    todo = bench.plan(args)
    assert [(t[1], t[2], t[3]) for t in todo[:4]] == [("shell", "grpo", 0), ("shell", "gigpo", 0),
                                                      ("shell", "grpo", 1), ("shell", "gigpo", 1)]
    path = bench.result_path(tmp_path, "shell", "grpo", 0)
    assert not bench.is_done(path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert not bench.is_done(path)
    path.write_text(json.dumps({"complete": True}))
    assert bench.is_done(path)
    with pytest.raises(SystemExit, match="not a suite"):
        bench.plan(bench.argparse.Namespace(gpu=True, suites="guess", estimators="grpo", seeds="0", smoke=False))


def test_turn_action_keeps_the_agents_commands_and_the_first_line():
    from agentrl.types.turn import ExecResult, Turn

    bench = _load("bench_credit")

    def turn(text, results=(), calls=0):
        return Turn([1], [2], [-0.1], action_text=text, exec_results=list(results), tool_calls=calls)

    ran = ExecResult(command=("bash", "-c", "cat note.txt"), exit_code=0, stdout="", stderr="", duration_s=0.1)
    check = ExecResult(command=("bash", "-c", "test -d x"), exit_code=1, stdout="", stderr="", duration_s=0.1)
    assert bench.turn_action(turn("<tool_call>...", [ran, check], calls=1)) == "cat note.txt"  # not the check
    assert bench.turn_action(turn("\n  7\nFFF")) == "7"
    multi = ExecResult(command=("bash", "-c", "echo a\n\n# b"), exit_code=0, stdout="", stderr="", duration_s=0.1)
    assert bench.turn_action(turn("", [multi], calls=1)) == "echo a # b"  # one line: the report's Markdown holds
    assert bench.turn_action(turn("")) == ""
    long = bench.turn_action(turn("x" * 100))
    assert len(long) == bench.ACTION_CHARS and long.endswith("...")
    argv = ExecResult(command=["ls", "-l"], exit_code=0, stdout="", stderr="", duration_s=0.1)
    assert bench.turn_action(turn("", [argv], calls=1)) == "ls -l"


def test_behaviours_show_what_each_policy_does():
    by_suite = {"g": []}
    for est, after in (("grpo", [["1 -> 2 -> 3", 3, 1], ["1", 1, 1]]), ("gigpo", [["2 -> 1", 3, 2], ["a`b|c\n\n# d", 1, 0]])):
        r = _result("g", est, 0)  # 4 episodes before and after, as its eval_tasks
        r["eval_behaviours"] = {"before": [["hello", 3, 0]], "after": after}
        by_suite["g"].append(r)
    by_suite["g"].append(_result("g", "turn_critic", 0))  # a file from before the field: left out
    text = rep.format_behaviours(by_suite, shown=2)
    lines = [x for x in text.splitlines() if x]
    assert lines[0] == "### g"
    assert lines[1] == "- seed 0, before training (4 episodes): `hello` x3 (0 solved)"
    assert lines[2] == "- seed 0, **grpo** after (4 episodes): `1 -> 2 -> 3` x3 (1 solved); `1` x1 (1 solved)"
    assert lines[3] == "- seed 0, **gigpo** after (4 episodes): `2 -> 1` x3 (2 solved); `a'b|c # d` x1 (0 solved)"
    assert len(lines) == 4
    assert "turn_critic" not in text
    assert rep.format_behaviours({"g": [_result("g", "grpo", 0)]}) == ""
