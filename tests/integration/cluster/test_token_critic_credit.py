"""The ``gae`` credit step as the controller wires it (``assign_credit`` with a ``values_fn``
that asks the trainer actors) with a real Ray trainer actor (policy and token-level critic on the tiny SmolLM2-vocab model), on hand-built
multi-turn episodes in both prompt modes: a random tiny model seldom ends a turn by itself,
so a ``train()`` run has one-turn episodes only, and this is where several turns and
several per-step rows of one episode meet the real critic."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _episode(mode: str, episode_id: str, reason: str = "env_terminated"):
    from agentrl.types import Episode, TerminationReason, Turn

    turns = [
        Turn(prompt_ids=[1, 17, 42, 99], completion_ids=[501, 502, 503], behavior_log_probs=[-1.0] * 3, reward=0.0),
        Turn(prompt_ids=[7, 8], completion_ids=[601, 602], behavior_log_probs=[-1.0] * 2, reward=0.25),
        Turn(prompt_ids=[9, 10, 11], completion_ids=[701], behavior_log_probs=[-1.0], reward=1.0),
    ]
    if mode == "per_step":  # each step's row starts with its own prompt (task + history + observation)
        turns[1].prompt_ids = [1, 17, 42, 99, 501, 502, 503, 7, 8]
        turns[2].prompt_ids = [1, 17, 42, 99, 601, 602, 9, 10, 11]
    ep = Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, prompt_mode=mode,
                 episode_id=episode_id, termination_reason=TerminationReason(reason))
    ep.terminated = reason == "env_terminated"
    return ep


def test_token_critic_credit_on_multi_turn_episodes_in_both_modes(ray_session, tiny_model_path):
    import ray

    import critics
    from agentrl.cluster.actors.rollout_actor import sampling_of
    from agentrl.cluster.actors.trainer_group import TrainerGroup
    from agentrl.config import load_config
    from agentrl.credit import assign_credit, critic_rows
    from agentrl.types import ValueBatch

    cfg = load_config(None, [f"model.path={tiny_model_path}", "algorithm.advantage=gae", "algorithm.token_gamma=0.99",
                             "algorithm.token_lam=0.9", "critic.head_init_std=0.05", "critic.lr=1e-3",
                             "trainer.lr=1e-4"])
    group = TrainerGroup(cfg, cfg.model_dump(mode="json"), tiny_model_path, {"num_cpus": 1})
    group.ready()
    trainer = group.actors[0]
    try:
        full, per_step = _episode("full_history", "a"), _episode("per_step", "b")
        broken = _episode("full_history", "c", reason="infra_error")
        credit = assign_credit([full, broken, per_step], cfg.algorithm, sampling_of(cfg),
                               max_new_tokens=cfg.rollout.max_new_tokens,
                               values_fn=lambda vb: ray.get([trainer.critic_values.remote(vb)])[0])
        critic_batch = credit.value_batch

        kept = [full, per_step]
        n_tokens = [e.num_generated_tokens() for e in kept]  # 6 each
        assert credit.metrics["filter/infra_errors"] == 1 and "c" not in credit.turn_advantages
        batch = credit.batch
        assert batch.num_rows == 1 + 3  # one row, then one row per step
        assert critic_batch.num_positions == sum(n_tokens) == batch.num_loss_tokens == 12

        # the values the controller used: the critic's, read before each sampled token
        values = ray.get(trainer.critic_values.remote(ValueBatch.pack(critic_rows(kept, level="token")))).double()
        np.testing.assert_allclose(critic_batch.old_values.double().numpy(), values.numpy(), rtol=0, atol=1e-6)
        assert values.abs().min() > 1e-6  # a non-zero head: the advantages depend on the values
        per_ep = list(values.numpy().reshape(2, 6))
        counts = [[len(t.completion_ids) for t in e.turns] for e in kept]
        adv, ret = critics.token_critic_advantages(counts, [[0.0, 0.25, 1.0]] * 2, per_ep, gamma=0.99, lam=0.9)
        mask = batch.loss_mask.numpy() == 1
        got = batch.advantages.double().numpy()
        np.testing.assert_allclose(got[mask], np.concatenate(adv), rtol=0, atol=1e-5)
        assert np.all(got[~mask] == 0.0)  # prompt and observation tokens: exactly 0
        np.testing.assert_allclose(critic_batch.returns.double().numpy(), np.concatenate(ret), rtol=0, atol=1e-5)
        for e, a in zip(kept, adv):  # replay store: the mean over each turn's tokens
            assert credit.turn_advantages[e.episode_id] == pytest.approx([a[:3].mean(), a[3:5].mean(), a[5]], abs=1e-9)
        assert math.isfinite(credit.metrics["critic/values_mean_rollout"])

        policy = ray.get(trainer.step.remote(batch))
        assert math.isfinite(policy.metrics["actor/pg_loss"])
        m = ray.get(trainer.critic_step.remote(critic_batch))
        assert m["train/num_value_positions"] == 12 and m["losses/value_loss"] > 0
        assert all(math.isfinite(v) for v in m.values())
    finally:
        group.kill()
