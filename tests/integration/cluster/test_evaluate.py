"""Held-out evaluation on real Ray and vLLM (tiny model, GuessNumber, no sandboxes), in one
run to keep CI short: the same evaluation twice with the same seed, once during training on
the run's engines (``eval.after_training``, the path ``eval.every`` takes too) and once by
``agentrl eval``'s path on the run's checkpoint (exported, a fresh engine), samples the same
tokens and gives the same numbers; both are stored as ``kind='eval'`` with policy version 1
and their ``eval/*`` metrics. The same run evaluates its untrained policy first
(``eval.before_training``: version 0 only, ``eval_before/*``), and the summary's last lines
print both.
The bare-model path differs only in ``resolve_target`` / ``eval_config`` (unit tests:
tests/unit/commands/test_evaluate_args.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

OVERRIDES = ["eval.num_tasks=2", "eval.samples=2", "eval.seed=3", "eval.max_turns=2", "eval.max_new_tokens=8",
             "eval.max_context_tokens=512", "rollout.kv_cache_gb=1", "rollout.max_num_seqs=8"]


def test_eval_during_training_measures_the_new_version_like_agentrl_eval(ray_session, tmp_path, tiny_model_path):
    """``eval.before_training`` and ``eval.after_training`` in a one-iteration sync run: the
    eval before iteration 1 measures policy version 0 and the one after the update version 1,
    on the run's engines (episodes stored with iteration 1's rows as ``kind='eval'``,
    ``eval_before/*`` and ``eval/*`` in metrics.jsonl, both printed by the summary's last
    lines); ``agentrl eval`` of the run's checkpoint afterwards, on a fresh engine with the
    same eval settings, samples exactly the same tokens as the after-training eval."""
    import json

    from agentrl.driver.controller import train
    from agentrl.commands.evaluate import evaluate
    from agentrl.config import load_config
    from agentrl.eval.report import training_eval_lines
    from agentrl.replay import ReplayStore

    run_dir = tmp_path / "run"
    cfg = load_config(None, [f"run.dir={run_dir}", "run.iterations=1", f"model.path={tiny_model_path}",
                             "env.id=agentrl/GuessNumber-v0", "env.tasks_per_iteration=2", "env.group_size=2",
                             # the training's own limits differ from the eval's: the eval's budget must win
                             "rollout.max_turns=1", "rollout.max_new_tokens=16", "rollout.max_context_tokens=1024",
                             "trainer.lr=1e-3", "trainer.micro_batch_size=2", "eval.before_training=true",
                             "eval.after_training=true", *OVERRIDES])
    summary = train(cfg)
    assert summary.policy_version == 1
    m = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["eval/policy_version"] == 1.0 and m["eval/samples_scored"] == 4 and "eval/pass@2" in m
    assert m["time/eval_s"] > 0 and m["time/eval_before_s"] > 0
    assert m["eval_before/policy_version"] == 0.0 and m["eval_before/samples_scored"] == 4
    lines = training_eval_lines(summary.history)  # what `agentrl train` prints last
    assert [line.split(":")[0] for line in lines] == ["held-out eval before training (policy version 0)",
                                                     "held-out eval after training (policy version 1)"]
    assert all("over 2 tasks x 2 samples (4 scored, 0 errored)" in line for line in lines)
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
        assert store.iterations(summary.run_id) == [1]  # iterations are numbered from 1
        rows = store.list_episodes(summary.run_id, 1)  # both evals land in iteration 1's line and rows
        evals = [r for r in rows if r.kind == "eval"]
        assert len(evals) == 8 and len(rows) == 12  # 4 training episodes beside them
        versions = sorted((r.policy_version_min, r.policy_version_max) for r in evals)
        assert versions == [(0, 0)] * 4 + [(1, 1)] * 4  # each eval measured exactly one policy version
        # ids: the eval before training at iteration 0, the one after iteration 1's update at 1
        assert all(f"{summary.run_id}/eval-before/it0/" in r.episode_id for r in evals if r.policy_version_min == 0)
        assert all(f"{summary.run_id}/eval/it1/" in r.episode_id for r in evals if r.policy_version_min == 1)
        assert all(r.episode_id.startswith(f"{summary.run_id}/it1/") for r in rows if r.kind == "train")
        evals = [r for r in evals if r.policy_version_min == 1]
        during = {r.task_id: [] for r in evals}
        for r in sorted(evals, key=lambda r: r.episode_id):
            during[r.task_id].append([t.completion_ids for t in store.get_episode(r.episode_id).turns])

    after = evaluate(str(run_dir), OVERRIDES)  # its checkpoint, exported, on a fresh engine
    assert after.target.policy_version == 1 and after.target.kind == "run"
    by_task = {t: [] for t in during}
    for e in sorted(after.episodes, key=lambda e: e.episode_id):
        by_task[e.task_id].append([t.completion_ids for t in e.turns])
    assert by_task == during
    assert max(len(ids) for turns in during.values() for ep in turns for ids in ep) <= 8  # eval.max_new_tokens
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:  # the training episodes kept their limits
        train_eps = [store.get_episode(r.episode_id) for r in store.list_episodes(summary.run_id, 1) if r.kind == "train"]
    assert all(len(e.turns) == 1 for e in train_eps) and max(len(e.turns[0].completion_ids) for e in train_eps) > 8
    got = after.report.metrics()
    assert {k: got[k] for k in got if k.startswith("eval/pass@")} == {k: m[k] for k in got if k.startswith("eval/pass@")}
    assert after.report.tokens_generated == m["eval/tokens_generated"] > 0
    assert after.settings["max_new_tokens"] == 8 and after.settings["temperature"] == 1.0
    with ReplayStore(after.replay_url) as store:  # the run's store, under the eval's own run id
        stored = store.list_episodes(after.run_id)
        assert len(stored) == 4 and {r.kind for r in stored} == {"eval"}
        assert {(r.policy_version_min, r.policy_version_max) for r in stored} == {(1, 1)}
        assert store.metrics(after.run_id)[0]["eval/samples_scored"] == 4  # agentrl eval's rows: iteration 0
        assert store.iterations(after.run_id) == [0] and all(r.episode_id.startswith(f"{after.run_id}/it0/") for r in stored)
        assert store.get_run(after.run_id).config["policy_version"] == 1
