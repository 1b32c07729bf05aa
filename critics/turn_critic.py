"""Critic helpers (pure, arrays in, arrays out): where a state value is read in a token
row, for a turn-level critic (``turn_critic``) and a token-level one (``gae``), and GAE over
a batch of episodes. Which rows an episode has (``full_history`` / ``per_step``) is
``agentrl.types.Episode.rows``' business; ``agentrl.credit`` maps it onto these.

The critic model itself (a Hugging Face backbone plus a scalar head) lives in
``agentrl.trainer.value_model``: it needs ``transformers``, which ``critics`` may not import
(docs/design.md, "Who may import whom").

Turn boundary convention (ArCHer, Zhou et al. 2024, §4: the high-level critic values the
state *before* each utterance). A row is the concatenation
``prompt_0, completion_0, prompt_1, completion_1, ...`` where ``prompt_k`` are the ids
appended before turn k's action (the initial prompt, or the observation plus chat-template
glue: ``Turn.prompt_ids``) and ``completion_k`` the sampled ids (``Turn.completion_ids``).
The state ``s_k`` is everything before ``completion_k``; under a causal model the hidden
state at the *last token before completion_k* has seen exactly ``s_k`` and nothing of the
action, so that position is turn k's boundary::

    boundary_k = sum_{j<k} (p_j + c_j) + p_k - 1

Token-level convention (``gae``; PPO with a token critic, as in verl, where
``values = critic(seq)[:, -resp_len-1:-1]``): the value of the sampled token at row
position ``p`` is ``V`` of the state *before* that token is sampled, read from the hidden
state at ``p - 1`` (which has seen the prefix and not the token itself). So a row's value
positions are ``[p - 1 for every p with loss_mask[p] == 1]`` (``token_value_positions``);
for a turn's first sampled token this is the turn boundary above.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

from agentrl.errors import ContractError
from critics._common import as_float_vector, check_unit_interval
from critics.gae import gae, turn_gae


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


# ---------------------------------------------------------------------------- token level


def token_value_positions(loss_mask: Sequence[int] | Any) -> list[int]:
    """Where a token-level critic reads the value of each sampled token of one row: the
    position just before it, ``[p - 1 for p in range(L) if loss_mask[p] == 1]``.

    The hidden state at ``p - 1`` has read the prefix ``ids[:p]`` (the state in which
    token ``p`` is sampled) and not the token itself; this is verl's
    ``values[:, -resp_len-1:-1]`` slice written for rows with several completions.

    Args:
        loss_mask: ``[L]`` 0/1 (int, bool or float; a list, numpy array or torch tensor).

    Returns:
        ``[sum(loss_mask)]`` ints, increasing, each in ``[0, L - 1)``.

    Raises:
        ContractError: a value other than 0/1, or ``loss_mask[0] == 1`` (the first token
            has no state before it; a row starts with prompt tokens).

    Example: ``[0, 0, 1, 1, 0, 1]`` (``P P C C O C``) → ``[1, 2, 4]``.
    """
    m = as_float_vector(loss_mask, "loss_mask", allow_missing=False)  # [L]
    bad = np.flatnonzero((m != 0) & (m != 1))
    if bad.size:
        raise ContractError(f"loss_mask[{bad[0]}]={float(m[bad[0]])!r}; expected 0 or 1")
    if m.size and m[0] == 1:
        raise ContractError(
            "loss_mask[0]=1: the first token of a row has no state before it to read a value "
            "from; a row starts with prompt tokens"
        )
    return (np.flatnonzero(m == 1) - 1).tolist()


def turn_rewards_on_tokens(turn_token_counts: Sequence[int] | Any, turn_rewards: Sequence[float] | Any) -> np.ndarray:
    """Token rewards for token-level GAE: turn k's reward on turn k's *last* sampled token,
    0 on every other sampled token.

    A turn without sampled tokens (an empty completion) has no token of its own; its
    reward goes onto the nearest sampled token before it (the previous action's last one),
    or, when none precedes it, onto the episode's first sampled token, so no reward is
    lost. An episode without any sampled token has nothing to train and gets ``[]``.

    Args:
        turn_token_counts: ``[K]`` sampled tokens per turn (``len(turn.completion_ids)``).
        turn_rewards: ``[K]`` finite rewards, one per turn (e.g.
            ``agentrl.credit.shaped_turn_rewards``).

    Returns:
        ``[N]`` float64 over the episode's sampled tokens in stream order
        (``N = sum(turn_token_counts)``).

    Raises:
        ContractError: ``len(turn_rewards) != len(turn_token_counts)``, a negative or
            non-integer count, or a non-finite reward.
    """
    lens = _as_count_list(turn_token_counts, "turn_token_counts")  # [K]
    r = as_float_vector(turn_rewards, "turn_rewards", allow_missing=False)  # [K]
    if r.shape[0] != len(lens):
        raise ContractError(f"got {r.shape[0]} turn rewards for {len(lens)} turns; expected one per turn")
    out = np.zeros(sum(lens), dtype=np.float64)  # [N]
    if out.size == 0:
        return out
    ends = np.cumsum(lens) - 1  # [K] stream index of each turn's last sampled token (-1: none yet)
    for k, (n, reward) in enumerate(zip(lens, r)):
        if n > 0:
            out[ends[k]] += reward
        else:
            out[max(int(ends[k]), 0)] += reward
    return out


def token_critic_advantages(
    turn_token_counts: Sequence[Sequence[int]],
    turn_rewards: Sequence[Sequence[float]],
    values: Sequence[Sequence[float]],
    *,
    gamma: float,
    lam: float,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token-level GAE (``critics.gae``) for a batch of episodes: the ``gae`` estimator
    (PPO with a token-level critic; GAE, Schulman et al. 2016, Eq. 16, over sampled tokens).

    Per episode the chain runs over all its sampled tokens in stream order, across turns
    (and so across the rows of a ``per_step`` episode): observation and prompt tokens
    (``loss_mask`` 0) are skipped, not discounted, so the next turn's first token is the
    bootstrap of a turn's last one. The rewards are ``turn_rewards_on_tokens``; the value
    after the last sampled token is 0 (no bootstrap, as ``turn_critic``). Because
    ``critics.gae`` skips ``mask == 0`` positions, running it on the sampled tokens packed
    to the left gives exactly the numbers of running it on the episode's full token stream
    with its ``loss_mask``; the packed form is what runs (``max N_i`` steps, not ``max L``).
    Only the turns' token counts enter, so ``full_history`` and ``per_step`` episodes with
    the same turns, rewards and values get the same advantages.

    Args:
        turn_token_counts: per episode, ``[K_i]`` sampled tokens per turn.
        turn_rewards: per episode, ``[K_i]`` finite rewards, one per turn.
        values: per episode, ``[N_i]`` critic values of the sampled tokens in stream order
            (``N_i = sum(turn_token_counts[i])``).
        gamma: discount per sampled token, in [0, 1].
        lam: GAE lambda per sampled token, in [0, 1].

    Returns:
        ``(advantages, returns)``: two lists with one float64 ``[N_i]`` array per episode;
        ``returns = advantages + values`` are the critic's regression targets.

    Raises:
        ContractError: different episode counts, a reward count other than the episode's
            turn count, a value count other than its sampled-token count (episode index
            named), non-finite input.
        ConfigError: ``gamma`` or ``lam`` outside [0, 1].
    """
    gamma = check_unit_interval(gamma, "gamma")
    lam = check_unit_interval(lam, "lam")
    counts, turn_rewards, values = list(turn_token_counts), list(turn_rewards), list(values)
    if not len(counts) == len(turn_rewards) == len(values):
        raise ContractError(
            f"got {len(counts)} token-count lists, {len(turn_rewards)} reward lists and {len(values)} value "
            "lists; expected one of each per episode"
        )
    rew, val = [], []
    for i, (c, r, v) in enumerate(zip(counts, turn_rewards, values)):
        try:
            rew.append(turn_rewards_on_tokens(c, r))  # [N_i]
            vi = as_float_vector(v, "values", allow_missing=False)  # [N_i]
        except ContractError as exc:
            raise ContractError(f"episode {i}: {exc}") from exc
        if vi.shape[0] != rew[-1].shape[0]:
            raise ContractError(
                f"episode {i}: {vi.shape[0]} values for {rew[-1].shape[0]} sampled "
                "tokens; expected one value per sampled token"
            )
        val.append(vi)
    if not counts:
        return [], []
    lens = [x.shape[0] for x in rew]
    width = max(max(lens), 1)
    r2 = np.zeros((len(lens), width), dtype=np.float64)  # (B, N_max)
    v2 = np.zeros((len(lens), width), dtype=np.float64)  # (B, N_max)
    m2 = np.zeros((len(lens), width), dtype=np.float64)  # (B, N_max), 1 on real tokens
    for b, (r, v, n) in enumerate(zip(rew, val, lens)):
        r2[b, :n], v2[b, :n], m2[b, :n] = r, v, 1.0
    adv, ret = gae(r2, v2, m2, gamma=gamma, lam=lam)  # (B, N_max) each
    return [adv[b, :n].copy() for b, n in enumerate(lens)], [ret[b, :n].copy() for b, n in enumerate(lens)]
