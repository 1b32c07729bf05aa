"""Credit assignment: the only place that turns episodes into advantages (docs/design.md).

``assign_credit(episodes, cfg, sampling, max_new_tokens=..., values_fn=...)`` selects,
shapes, runs the estimator named by ``algorithm.advantage`` from ``critics``' registry,
and packs the policy batch (plus the critic's batch for a critic-based estimator);
``missing_groups`` says how many groups dynamic sampling wants refilled (one
``ShapedCache`` dict per iteration, passed to both, shapes each episode once).

* ``agentrl.credit.assign``: selection, shaping, the estimator call, packing.
* ``agentrl.credit.rows``: episodes onto token rows (value positions, per-row splits),
  all read from ``Episode.rows``.
* ``agentrl.credit.group_size``: ``check_group_size``, the start-up check that
  ``env.group_size`` gives the estimator a signal (read from its registration).
* ``agentrl.credit.kl_reward``: the KL-to-reference penalty in the reward
  (``trainer.kl.mode: reward``): the rows the reference scores, and per-turn penalties for
  ``assign_credit(..., reward_penalties=...)``.
"""

from agentrl.credit.assign import (
    CreditResult,
    ShapedCache,
    ValuesFn,
    assign_credit,
    critic_step_metrics,
    estimator_params,
    missing_groups,
    pack_batch,
    shaped_turn_rewards,
)
from agentrl.credit.group_size import check_group_size
from agentrl.credit.kl_reward import reference_batch, turn_penalties
from agentrl.credit.rows import (
    critic_rows,
    episode_boundaries,
    episode_token_positions,
    split_per_row,
    split_tokens_per_row,
)

__all__ = [
    "CreditResult",
    "ShapedCache",
    "ValuesFn",
    "assign_credit",
    "check_group_size",
    "critic_rows",
    "critic_step_metrics",
    "episode_boundaries",
    "episode_token_positions",
    "estimator_params",
    "missing_groups",
    "pack_batch",
    "reference_batch",
    "shaped_turn_rewards",
    "split_per_row",
    "split_tokens_per_row",
    "turn_penalties",
]
