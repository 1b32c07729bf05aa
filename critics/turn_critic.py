"""Turn-level critic helpers (pure): where a turn's state value is read in a token row,
and turn-level GAE over a batch of episodes.

The critic model itself (a Hugging Face backbone plus a scalar head) lives in
``agentrl.trainer.value_model``: it needs ``transformers``, which ``critics`` may not import
(design.md, "Who may import whom").

Turn boundary convention (ArCHer, Zhou et al. 2024, §4: the high-level critic values the
state *before* each utterance). A row is the concatenation
``prompt_0, completion_0, prompt_1, completion_1, ...`` where ``prompt_k`` are the ids
appended before turn k's action (the initial prompt, or the observation plus chat-template
glue: ``Turn.prompt_ids``) and ``completion_k`` the sampled ids (``Turn.completion_ids``).
The state ``s_k`` is everything before ``completion_k``; under a causal model the hidden
state at the *last token before completion_k* has seen exactly ``s_k`` and nothing of the
action, so that position is turn k's boundary::

    boundary_k = sum_{j<k} (p_j + c_j) + p_k - 1
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

from agentrl.errors import ContractError
from agentrl.types import Episode
from critics._common import check_unit_interval
from critics.gae import turn_gae


def _as_count_list(x: Any, name: str) -> list[int]:
    try:
        seq = list(x.tolist() if hasattr(x, "tolist") else x)
    except TypeError as exc:
        raise ContractError(f"{name} is a {type(x).__name__}; expected a sequence of ints") from exc
    out = []
    for i, v in enumerate(seq):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ContractError(f"{name}[{i}]={v!r}; expected an int >= 0")
        if v < 0:
            raise ContractError(f"{name}[{i}]={v}; expected an int >= 0")
        out.append(int(v))
    return out


def turn_boundaries(turn_prompt_lens: Sequence[int], turn_completion_lens: Sequence[int]) -> list[int]:
    """Token index (0-based, within the row) of each turn's boundary: the last token
    before the turn's completion, whose hidden state summarises the state ``s_k``.

    Args:
        turn_prompt_lens: ``[K]`` ``len(turn.prompt_ids)`` per turn; turn 0's must be >= 1
            (a row starts with a prompt), later ones may be 0 (then the boundary is the
            previous completion's last token).
        turn_completion_lens: ``[K]`` ``len(turn.completion_ids)`` per turn, >= 0.

    Returns:
        ``[K]`` ints, non-decreasing, each < the row length ``sum(p) + sum(c)``.
        ``K = 0`` gives ``[]``.

    Raises:
        ContractError: lengths differ, a negative or non-integer count, or
            ``turn_prompt_lens[0] == 0``.

    Example: prompts ``[3, 2]``, completions ``[4, 5]`` → ``[2, 8]`` (row of 14 tokens:
    ``PPP CCCC OO CCCCC``; boundaries on the last ``P`` and the last ``O``).
    """
    p = _as_count_list(turn_prompt_lens, "turn_prompt_lens")
    c = _as_count_list(turn_completion_lens, "turn_completion_lens")
    if len(p) != len(c):
        raise ContractError(
            f"turn_prompt_lens has {len(p)} values but turn_completion_lens has {len(c)}; "
            "expected one per turn"
        )
    if p and p[0] == 0:
        raise ContractError(
            "turn_prompt_lens[0]=0; a row must start with at least one prompt token (the "
            "state before the first action has to be read somewhere)"
        )
    out: list[int] = []
    offset = 0
    for pk, ck in zip(p, c):
        out.append(offset + pk - 1)
        offset += pk + ck
    return out


def episode_boundaries(episode: Episode) -> list[list[int]]:
    """Turn boundaries of each trainer row of ``episode``, in the row order and layout of
    ``Episode.training_sequences``.

    * ``full_history``: one row holding every turn → ``[turn_boundaries(p, c)]``.
    * ``per_step``: one row per turn, ``prompt_ids + completion_ids`` →
      ``[[len(prompt_ids) - 1]]`` per turn.

    Either way the rows' boundaries, concatenated, hold one entry per turn in turn order,
    so critic values over these rows split back per episode by ``len(episode.turns)``.

    Raises:
        ContractError: a turn (row start) without prompt tokens.
    """
    p = [len(t.prompt_ids) for t in episode.turns]
    c = [len(t.completion_ids) for t in episode.turns]
    if episode.prompt_mode == "per_step":
        out = []
        for k, n in enumerate(p):
            if n == 0:
                raise ContractError(
                    f"episode {episode.episode_id} turn {k} has no prompt_ids; in per_step mode "
                    "every turn is a row and must start with its prompt"
                )
            out.append([n - 1])
        return out
    try:
        return [turn_boundaries(p, c)]
    except ContractError as exc:
        raise ContractError(f"episode {episode.episode_id}: {exc}") from exc


def split_per_row(episode: Episode, per_turn: Sequence[float]) -> list[list[float]]:
    """Per-turn numbers (returns, old values) split like ``episode_boundaries``: one list
    for a ``full_history`` episode, one single-element list per turn for ``per_step``.

    Raises:
        ContractError: ``len(per_turn) != len(episode.turns)``.
    """
    vals = [float(v) for v in (per_turn.tolist() if hasattr(per_turn, "tolist") else per_turn)]
    if len(vals) != len(episode.turns):
        raise ContractError(
            f"got {len(vals)} per-turn values for episode {episode.episode_id} of {len(episode.turns)} turns"
        )
    return [[v] for v in vals] if episode.prompt_mode == "per_step" else [vals]


def turn_critic_advantages(
    rewards: Sequence[Sequence[float]],
    values: Sequence[Sequence[float]],
    *,
    gamma: float,
    lam: float,
    bootstrap_values: Sequence[float] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Turn-level GAE (``critics.turn_gae``) applied episode by episode: the ``turn_critic``
    estimator for a batch (ArCHer §4; the turn level of RAGEN's bi-level GAE).

    Args:
        rewards: per episode, ``[K_i]`` finite env rewards after each turn.
        values: per episode, ``[K_i]`` critic values ``V(s_k)`` (e.g. from
            ``CriticTrainer.compute_values``, split by episode).
        gamma: discount per turn, in [0, 1].
        lam: GAE lambda, in [0, 1].
        bootstrap_values: per episode, ``V(s_K)``: 0 for a terminated episode, the
            critic's value of the final state for a truncated one. ``None``: all 0.

    Returns:
        ``(advantages, returns)``: two lists with one float64 ``[K_i]`` array per episode;
        ``returns`` are the critic's regression targets (lambda-returns).

    Raises:
        ContractError: different episode counts, an episode whose reward and value counts
            differ (its index named), non-finite input.
        ConfigError: ``gamma`` or ``lam`` outside [0, 1].
    """
    gamma = check_unit_interval(gamma, "gamma")
    lam = check_unit_interval(lam, "lam")
    rewards, values = list(rewards), list(values)
    if len(rewards) != len(values):
        raise ContractError(
            f"rewards has {len(rewards)} episodes but values has {len(values)}; expected one "
            "value list per episode"
        )
    if bootstrap_values is None:
        boots = [0.0] * len(rewards)
    else:
        boots = list(bootstrap_values.tolist() if hasattr(bootstrap_values, "tolist") else bootstrap_values)
        if len(boots) != len(rewards):
            raise ContractError(
                f"bootstrap_values has {len(boots)} values but there are {len(rewards)} episodes"
            )
    advantages: list[np.ndarray] = []
    returns: list[np.ndarray] = []
    for i, (r, v, b) in enumerate(zip(rewards, values, boots)):
        if not isinstance(b, numbers.Real) or not math.isfinite(b):
            raise ContractError(f"bootstrap_values[{i}]={b!r}; expected a finite number")
        try:
            adv, ret = turn_gae(r, v, gamma=gamma, lam=lam, bootstrap_value=float(b))
        except ContractError as exc:
            raise ContractError(f"episode {i}: {exc}") from exc
        advantages.append(adv)
        returns.append(ret)
    return advantages, returns
