"""One real training iteration through the verifiers adapter (``hub/Verifiers-v0``; real Ray,
vLLM with the tiny model, the FSDP2 trainer, the gateway) for each API of
tests/helpers/verifiers_hub.py: a classic-API multi-turn env with a scripted ``env_response``
(verifiers 0.3.1's venv), and a v1 taskset with its own harness (0.4.0's venv). The runner
runs each episode's rollout with its model calls on the episode's gateway session; every
episode ends scored (no infrastructure error), and its reward is what verifiers computes again
for the same completions, read back from the stored tokens.

The classic single-turn env (``classic-single``) goes through the same runner and training
path with one turn instead of two: its runner is checked against the real 0.3.1 venv in
tests/unit/hubs/test_verifiers_runner.py, and a training run of its own here cost about 45 s
of the CI's critical path."""

from __future__ import annotations

import json

import pytest

from agentrl.hubs.verifiers_env import ENV_ID
from tests.helpers.verifiers_hub import CASES, case_kwargs, replies_of, rescore

pytestmark = pytest.mark.slow
MAX_NEW_TOKENS = 16


@pytest.mark.parametrize("case", [c for c in CASES if c != "classic-single"])
def test_one_iteration_through_the_gateway(ray_session, tmp_path, tiny_model_path, case):
    from transformers import AutoTokenizer

    from agentrl.config import load_config
    from agentrl.driver.controller import train
    from agentrl.replay import ReplayStore

    kwargs = case_kwargs(case)
    cfg = load_config(None, [
        f"run.dir={tmp_path}", "run.iterations=1", f"model.path={tiny_model_path}", f"env.id={ENV_ID}",
        f"env.kwargs={json.dumps(kwargs)}", "env.tasks_per_iteration=1", "env.group_size=2",
        "rollout.max_turns=3", f"rollout.max_new_tokens={MAX_NEW_TOKENS}", "rollout.max_context_tokens=1024",
        "trainer.micro_batch_size=2"])
    summary = train(cfg)
    assert summary.policy_version == 1
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert m["rollout/episodes"] == 2 and m["filter/infra_errors"] == 0 and m["filter/reward_errors"] == 0
    assert m["tokens/trained"] > 0
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        eps = [store.get_episode(e.episode_id) for e in store.list_episodes(summary.run_id)]
    assert len(eps) == 2
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    for ep in eps:
        assert not ep.is_error, ep.error
        assert ep.counters["gateway/calls"] == len(ep.turns)
        if case == "classic-multi":  # the env's own cap is not the run's: both turns ran
            assert len(ep.turns) == 2 and ep.counters["verifiers/metric/num_turns"] == 2
        else:
            assert len(ep.turns) == 1
        again = rescore(kwargs, ep.task_id, replies_of(ep, tok), MAX_NEW_TOKENS)
        assert again.calls == len(ep.turns)
        assert ep.turns[-1].reward == pytest.approx(again.reward, abs=1e-12)
        assert ep.total_reward == pytest.approx(again.reward, abs=1e-12)
        for name, (score, _) in again.rewards.items():  # each reward function's score is a counter too
            assert ep.counters[f"verifiers/reward/{name}"] == pytest.approx(score, abs=1e-12)
    assert any(k.startswith("verifiers/reward/") for k in m)  # summed per iteration in metrics.jsonl
