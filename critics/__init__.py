"""Credit assignment: pure functions that turn rewards into advantages (no I/O).

Imports only ``agentrl.types``/``agentrl.errors``, numpy and torch (design.md). Inputs may
be Python sequences, numpy arrays or torch tensors; outputs are float64 numpy arrays (or
lists of them for ragged, per-trajectory outputs).

* ``grpo_advantages`` / ``rloo_advantages`` / ``drgrpo_advantages``: one reward per sample,
  grouped by ``group_id`` → ``[N]``; ``valid_reward_mask`` flags failed samples.
* ``gigpo_advantages``: per-step rewards and anchor states → one value per step.
* ``turn_gae``: turn-level critic, one episode → ``(advantages [K], returns [K])``.
* ``gae``: token-level critic, ``[B, T]`` with ``loss_mask`` → ``([B, T], [B, T])``.
* ``turn_boundaries``, ``episode_boundaries``, ``split_per_row``, ``turn_critic_advantages``:
  where a turn-level critic reads each turn's value in a token row, and ``turn_gae`` over a
  batch of episodes.
* ``token_value_positions``, ``episode_token_positions``, ``split_tokens_per_row``,
  ``turn_rewards_on_tokens``, ``token_critic_advantages``: the same for a token-level critic
  (the value of sampled token ``p`` read at ``p - 1``) and ``gae`` over a batch of episodes.
* ``dynamic_sampling_keep``, ``overlong_penalty``: DAPO's filter and length shaping.
* ``ESTIMATORS``, ``get_estimator``, ``register_estimator``: the registry by name.
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
from critics.registry import ESTIMATORS, get_estimator, register_estimator
from critics.turn_critic import (
    episode_boundaries,
    episode_token_positions,
    split_per_row,
    split_tokens_per_row,
    token_critic_advantages,
    token_value_positions,
    turn_boundaries,
    turn_critic_advantages,
    turn_rewards_on_tokens,
)

__all__ = [
    "ESTIMATORS",
    "drgrpo_advantages",
    "episode_boundaries",
    "episode_token_positions",
    "dynamic_sampling_keep",
    "gae",
    "get_estimator",
    "gigpo_advantages",
    "grpo_advantages",
    "overlong_penalty",
    "register_estimator",
    "rloo_advantages",
    "split_per_row",
    "split_tokens_per_row",
    "token_critic_advantages",
    "token_value_positions",
    "turn_boundaries",
    "turn_critic_advantages",
    "turn_gae",
    "turn_rewards_on_tokens",
    "valid_reward_mask",
]
