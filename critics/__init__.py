"""Credit assignment: pure functions that turn rewards into advantages (no I/O).

Imports only ``agentrl.types``/``agentrl.errors``, numpy and torch (docs/design.md). Inputs may
be Python sequences, numpy arrays or torch tensors; outputs are float64 numpy arrays (or
lists of them for ragged, per-trajectory outputs).

* ``grpo_advantages`` / ``rloo_advantages`` / ``drgrpo_advantages``: one reward per sample,
  grouped by ``group_id`` → ``[N]``; ``valid_reward_mask`` flags failed samples.
* ``gigpo_advantages``: per-step rewards and anchor states → one value per step.
* ``turn_gae``: turn-level critic, one episode → ``(advantages [K], returns [K])``.
* ``gae``: token-level critic, ``[B, T]`` with ``loss_mask`` → ``([B, T], [B, T])``.
* ``turn_boundaries``, ``turn_critic_advantages``: where a turn-level critic reads each
  turn's value in a token row, and ``turn_gae`` over a batch of episodes.
* ``token_value_positions``, ``turn_rewards_on_tokens``, ``token_critic_advantages``: the
  same for a token-level critic (the value of sampled token ``p`` read at ``p - 1``) and
  ``gae`` over a batch of episodes (from each turn's sampled-token count).
* ``dynamic_sampling_keep``, ``overlong_penalty``: DAPO's filter and length shaping.
* ``ESTIMATORS``, ``Estimator``, ``EstimatorParams``, ``get_estimator``,
  ``register_estimator``, ``estimator_names``: the registry training looks estimators up in
  (``critics.registry`` documents the one signature per level).

No ``Episode`` here: which token rows an episode has is ``agentrl.types.Episode.rows``,
and ``agentrl.credit`` maps episodes onto these arrays.
"""

from critics.dapo import dynamic_sampling_keep, overlong_penalty
from critics.gae import gae, turn_gae
from critics.gigpo import gigpo_advantages
from critics.grpo import (
    drgrpo_advantages,
    grpo_advantages,
    rloo_advantages,
    valid_reward_mask,
)
from critics.registry import (
    ESTIMATORS,
    Estimator,
    EstimatorParams,
    estimator_names,
    get_estimator,
    register_estimator,
)
from critics.turn_critic import (
    token_critic_advantages,
    token_value_positions,
    turn_boundaries,
    turn_critic_advantages,
    turn_rewards_on_tokens,
)

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "EstimatorParams",
    "drgrpo_advantages",
    "estimator_names",
    "dynamic_sampling_keep",
    "gae",
    "get_estimator",
    "gigpo_advantages",
    "grpo_advantages",
    "overlong_penalty",
    "register_estimator",
    "rloo_advantages",
    "token_critic_advantages",
    "token_value_positions",
    "turn_boundaries",
    "turn_critic_advantages",
    "turn_gae",
    "turn_rewards_on_tokens",
    "valid_reward_mask",
]
