"""``agentrl eval``'s path on real Ray and vLLM (tiny model, GuessNumber, no sandboxes): the
same evaluation twice, each with its own engine, gives the same episodes (token for token)
and the same numbers; its episodes are stored once (the second replaces the first) as
``kind='eval'`` with the policy version and the ``eval/*`` metrics."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

OVERRIDES = ["eval.num_tasks=2", "eval.samples=2", "eval.seed=3", "eval.max_turns=2", "eval.max_new_tokens=8",
             "eval.max_context_tokens=512", "rollout.kv_cache_gb=1", "rollout.max_num_seqs=8"]


def test_same_seed_same_numbers_and_stored_as_eval(ray_session, tmp_path, tiny_model_path):
    from agentrl.cluster.evaluate import evaluate
    from agentrl.replay import ReplayStore

    url = f"sqlite:///{tmp_path / 'replay.db'}"
    a = evaluate(tiny_model_path, OVERRIDES, env_id="agentrl/GuessNumber-v0", replay_url=url)
    b = evaluate(tiny_model_path, OVERRIDES, env_id="agentrl/GuessNumber-v0", replay_url=url)

    assert a.run_id == b.run_id and a.target.policy_version == 0
    assert len(a.episodes) == 4 and not any(e.is_error for e in a.episodes)
    assert [e.episode_id for e in a.episodes] == [e.episode_id for e in b.episodes]
    assert [[t.completion_ids for t in e.turns] for e in a.episodes] == \
           [[t.completion_ids for t in e.turns] for e in b.episodes]
    assert a.report.metrics() == b.report.metrics()
    assert set(a.report.pass_at) == {1, 2} and a.report.samples_scored == 4
    assert a.report.tokens_generated == sum(e.num_generated_tokens() for e in a.episodes) > 0
    assert a.settings["max_new_tokens"] == 8 and a.settings["temperature"] == 1.0

    with ReplayStore(url) as store:
        stored = store.list_episodes(a.run_id)
        assert len(stored) == 4  # the second evaluation replaced the first's rows
        assert {getattr(s, "kind", "eval") for s in stored} == {"eval"}
        assert {(s.policy_version_min, s.policy_version_max) for s in stored} == {(0, 0)}
        assert store.metrics(a.run_id)[0]["eval/pass@1"] == a.report.metrics()["eval/pass@1"]
        assert store.get_run(a.run_id).config["policy_version"] == 0
