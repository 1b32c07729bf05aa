"""From episodes to a ``TokenBatch``: selection, shaping, the estimator by name, packing.

``assign_credit`` is the one entry point (the controller calls it once per iteration). It

1. sets aside errored episodes (``infra_error`` / ``reward_error`` / ``aborted``): they are
   counted and excluded from the loss, never scored 0; with ``error_policy="drop_group"``
   the whole group of an infra or reward error goes too (not of an aborted episode, whose
   request was rolled out again), else the group's statistics use its valid samples only
   (a failed reward is never scored 0; docs/cases.md, C12);
2. shapes each remaining episode's per-turn rewards once (``shaped_turn_rewards``);
3. optionally drops groups whose shaped rewards are all equal (DAPO dynamic sampling, Yu
   et al. 2025, §3.2), counting their tokens as discarded;
4. looks ``algorithm.advantage`` up in ``critics``' registry and calls it with its level's
   signature; an estimator that needs a critic gets the value model's values through the
   ``values_fn`` callback (the controller's call to the trainer actors);
5. puts the advantages on the sampled tokens through ``loss_mask`` (observation tokens get
   0; with ``overlong_filtering`` a completion cut by ``max_new_tokens`` or by the context
   budget gets 0 too, DAPO §3.4) and packs rows with ``TokenBatch.pack``
   (``Episode.rows``: one row per episode in full-history mode, one per step in
   per-step mode); for a critic it also packs the critic's own ``ValueBatch`` (returns as
   targets, rollout-time values as ``old_values``).

``missing_groups`` tells the controller how many groups dynamic sampling left it short.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

import critics
from agentrl.config import AlgorithmConfig
from agentrl.credit.diagnostics import gigpo_step_metrics, turn_spread_metrics, zero_grad_update
from agentrl.credit.rows import (
    Level,
    check_level,
    critic_rows,
    drop_turns_from_loss,
    to_stream_order,
    token_sequences,
    turn_means,
    turn_token_counts,
)
from agentrl.errors import ConfigError, ContractError
from agentrl.types import Episode, SamplingRecord, TerminationReason, TokenBatch, ValueBatch

ValuesFn = Callable[[ValueBatch], object]
"""``values_fn(batch) -> [batch.num_positions]`` values (tensor, array or list): the value
model's values at ``batch.positions``, in order."""


@dataclass
class CreditResult:
    """What ``assign_credit`` returns.

    Attributes:
        batch: the packed policy batch, or ``None`` when nothing is left to train on.
        turn_advantages: ``episode_id -> [K]`` advantage per turn (for the replay store);
            for a token-level estimator the mean over each turn's sampled tokens; ``None``
            for a turn whose completion was left out of the loss (DAPO overlong filtering):
            it trained nothing, and the store and viewer show it so.
        metrics: token accounting, filter counts and advantage statistics
            (``tokens/...``, ``filter/...``, ``shaping/...``, ``advantages/...``,
            ``critic/values_mean_rollout`` for a critic) and, from ``assign_credit``, the
            update's diagnostics (``credit/...``; ``gigpo/...`` for gigpo:
            ``agentrl.credit.diagnostics``).
        value_batch: the critic's batch (returns, rollout-time ``old_values``) when the
            estimator needs a critic and some value position is left; else ``None``.
    """

    batch: TokenBatch | None
    turn_advantages: dict[str, list[float | None]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    value_batch: ValueBatch | None = None


def shaped_turn_rewards(episode: Episode, cfg: AlgorithmConfig, max_new_tokens: int | None = None) -> list[float]:
    """Per-turn rewards the estimators see: the env reward, minus
    ``invalid_action_penalty`` on a step whose action was invalid (that step only), plus
    DAPO's soft overlong punishment of that turn's completion length (Yu et al. 2025,
    Eq. 13) when ``overlong_buffer_tokens > 0``. The recorded env rewards are unchanged.

    Raises:
        ContractError: a turn without a reward in a non-errored episode.
    """
    out = []
    for k, t in enumerate(episode.turns):
        if t.reward is None:
            raise ContractError(f"episode {episode.episode_id}: turn {k} has no reward")
        r = float(t.reward)
        if t.invalid_action:
            r -= cfg.invalid_action_penalty
        if cfg.overlong_buffer_tokens > 0 and max_new_tokens:
            r += float(critics.overlong_penalty([len(t.completion_ids)], max_len=max_new_tokens,
                                                cache_len=cfg.overlong_buffer_tokens, penalty=cfg.overlong_penalty)[0])
        out.append(r)
    return out


ShapedCache = dict[str, list[float]]
"""``episode_id -> [K]`` shaped rewards, shared by one iteration's ``missing_groups`` and
``assign_credit`` calls (same ``cfg`` and ``max_new_tokens``) so each episode is shaped once
across the refill checks and the credit."""


def _select(episodes: Sequence[Episode], cfg: AlgorithmConfig, max_new_tokens: int | None,
            shaped_cache: ShapedCache | None = None
            ) -> tuple[list[Episode], dict[str, list[float]], dict[str, float]]:
    """Steps 1-3: the episodes that go into the loss, their shaped rewards by episode id
    (each computed once, or taken from and added to ``shaped_cache``), and the token
    accounting so far."""
    m: dict[str, float] = defaultdict(float)
    m["tokens/generated"] = float(sum(e.num_generated_tokens() for e in episodes))
    errored = [e for e in episodes if e.is_error]
    m["filter/infra_errors"] = float(sum(1 for e in errored if e.termination_reason.value == "infra_error"))
    m["filter/reward_errors"] = float(sum(1 for e in errored if e.termination_reason.value == "reward_error"))
    m["filter/aborted_episodes"] = float(sum(1 for e in errored if e.termination_reason.value == "aborted"))
    # An aborted episode (its engine was lost) has been rolled out again with attempt + 1, so
    # its group is not short a sample: it never drops the group under drop_group.
    bad_groups = ({e.group_id for e in errored if e.termination_reason.value != "aborted"}
                  if cfg.error_policy == "drop_group" else set())
    kept = [e for e in episodes if not e.is_error and e.group_id not in bad_groups and e.turns]
    m["filter/error_dropped_episodes"] = float(len(episodes) - len(kept))
    shaped = {} if shaped_cache is None else shaped_cache
    for e in kept:  # once per episode (per iteration, with a shared cache)
        if e.episode_id not in shaped:
            shaped[e.episode_id] = shaped_turn_rewards(e, cfg, max_new_tokens)
    if cfg.dynamic_sampling and kept:
        totals = [sum(shaped[e.episode_id]) for e in kept]
        keep = np.asarray(critics.dynamic_sampling_keep(totals, [e.group_id for e in kept]), dtype=bool)
        m["filter/dynamic_sampling_dropped_groups"] = float(len({e.group_id for e, k in zip(kept, keep) if not k}))
        kept = [e for e, k in zip(kept, keep) if k]
    m["tokens/discarded"] = m["tokens/generated"] - float(sum(e.num_generated_tokens() for e in kept))
    if kept and (cfg.invalid_action_penalty or cfg.overlong_buffer_tokens):
        raw = sum(float(t.reward) for e in kept for t in e.turns)
        m["shaping/reward_delta_sum"] = sum(sum(shaped[e.episode_id]) for e in kept) - raw
    return kept, shaped, dict(m)


def missing_groups(episodes: Sequence[Episode], cfg: AlgorithmConfig, *, groups_wanted: int,
                   max_new_tokens: int | None = None, shaped_cache: ShapedCache | None = None) -> int:
    """How many more task groups to roll out so that ``groups_wanted`` survive selection
    (DAPO dynamic sampling's refill); 0 without ``dynamic_sampling`` or when enough survive.

    ``shaped_cache``: one dict per iteration, passed to every refill check and to
    ``assign_credit``, so an episode's rewards are shaped once (``ShapedCache``).

    Raises:
        ContractError: a turn without a reward in a non-errored episode.
    """
    if not cfg.dynamic_sampling:
        return 0
    kept, _, _ = _select(episodes, cfg, max_new_tokens, shaped_cache)
    return max(0, groups_wanted - len({e.group_id for e in kept}))


def pack_batch(kept: Sequence[Episode], advantages: Sequence[Sequence[float]], sampling: SamplingRecord,
               metrics: dict[str, float], *, level: Level = "turn",
               loss_dropped_turns: Mapping[str, set[int]] | None = None) -> CreditResult:
    """Step 5's packing: put the advantages on each episode's sampled tokens (0 on every
    ``loss_mask`` 0 token) and pack the rows (``Episode.training_sequences`` layout).

    Args:
        kept: the episodes to train on.
        advantages: per episode of ``kept``: with ``level="turn"`` one advantage per turn
            ``[K_i]``, broadcast onto that turn's sampled tokens; with ``level="token"`` one
            per sampled token ``[N_i]`` in stream order, placed token by token, across the
            rows of a ``per_step`` episode.
        sampling: the sampling transform every row was drawn with.
        metrics: accounting so far; copied, then extended.
        level: ``"turn"`` or ``"token"``.
        loss_dropped_turns: ``episode_id -> turn indices`` whose completion tokens stay out
            of the loss (``drop_turns_from_loss``; DAPO overlong filtering); their tokens
            are added to ``tokens/discarded``. The episodes' advantages are unchanged; the
            dropped turns' entries in ``turn_advantages`` are ``None``.

    Returns:
        The ``CreditResult`` (no ``value_batch``). Its ``turn_advantages`` hold one value
        per turn: the turn's advantage, or with ``level="token"`` the *mean* advantage over
        that turn's sampled tokens (0.0 for a turn without any); ``None`` for a turn in
        ``loss_dropped_turns``. The ``advantages/*``
        metrics are over turns (``"turn"``) or sampled tokens (``"token"``).

    Raises:
        ContractError: an episode breaks the token contract (a bug, never silenced), an
            advantage count that does not match the episode, or a bad ``level``.
    """
    check_level(level)
    m = dict(metrics)
    if not kept:
        m["tokens/trained"] = 0.0
        return CreditResult(batch=None, metrics=m)
    if len(advantages) != len(kept):
        raise ContractError(f"got advantages for {len(advantages)} episodes but {len(kept)} are kept")
    rows = []
    turn_adv: dict[str, list[float]] = {}
    for e, adv in zip(kept, advantages):
        e.validate()
        adv = [float(a) for a in (adv.tolist() if hasattr(adv, "tolist") else adv)]
        if level == "turn":
            turn_adv[e.episode_id] = adv
            ep_rows = e.training_sequences(adv)
        else:
            ep_rows = token_sequences(e, adv)
            turn_adv[e.episode_id] = turn_means(e, adv)
        dropped = (loss_dropped_turns or {}).get(e.episode_id)
        if dropped:
            ep_rows = drop_turns_from_loss(e, ep_rows, dropped)
            turn_adv[e.episode_id] = [None if k in dropped else a for k, a in enumerate(turn_adv[e.episode_id])]
            m["tokens/discarded"] = m.get("tokens/discarded", 0.0) + float(
                sum(len(e.turns[k].completion_ids) for k in dropped))
        rows.extend(ep_rows)
    if not rows:
        m["tokens/trained"] = 0.0
        return CreditResult(batch=None, turn_advantages=turn_adv, metrics=m)
    batch = TokenBatch.pack(rows, sampling)
    m["tokens/trained"] = float(batch.num_loss_tokens)
    m["tokens/packed"] = float(batch.num_tokens)
    flat = np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in advantages])
    m["advantages/mean"] = float(flat.mean()) if flat.size else 0.0
    m["advantages/abs_max"] = float(np.abs(flat).max()) if flat.size else 0.0
    m["advantages/nonzero_frac"] = float((flat != 0).mean()) if flat.size else 0.0
    return CreditResult(batch=batch, turn_advantages=turn_adv, metrics=m)


def estimator_params(cfg: AlgorithmConfig) -> critics.EstimatorParams:
    """The settings the estimators read, from the algorithm config (``algorithm.gigpo.*`` as
    the ``gigpo_*`` fields)."""
    return critics.EstimatorParams(gamma=cfg.gamma, lam=cfg.lam, token_gamma=cfg.token_gamma,
                                   token_lam=cfg.token_lam, norm_by_std=cfg.norm_by_std,
                                   gigpo_step_weight=cfg.gigpo.step_weight, gigpo_mode=cfg.gigpo.mode,
                                   gigpo_episode_stats=cfg.gigpo.episode_stats)


def _per_episode(est: critics.Estimator, what: str, got: object, want: Sequence[int],
                 kept: Sequence[Episode]) -> list:
    """``got`` as a list of one sequence per episode of ``kept``, each of ``want[i]``
    finite real numbers (turn level: per turn; token level: per sampled token).

    Raises:
        ContractError: anything else, naming the estimator, its level, the episode (id and
            index) and the expected vs actual count or type.
    """
    unit = "turn" if est.level == "turn" else "sampled token"
    who = f"estimator {est.name!r}"
    if isinstance(got, (str, bytes)) or not isinstance(got, Iterable) or getattr(got, "ndim", 1) == 0:
        raise ContractError(f"{who} returned {what} as {type(got).__name__} {got!r:.80}; expected one sequence "
                            f"per episode ({len(want)}; level={est.level!r})")
    items = list(got)
    if len(items) != len(want):
        raise ContractError(f"{who} returned {what} for {len(items)} episodes; expected {len(want)} (one "
                            f"sequence per episode; level={est.level!r})")
    for i, (e, g, n) in enumerate(zip(kept, items, want)):
        ep, ctx = f"episode {e.episode_id}", f"episode index {i}, level={est.level!r}"
        if isinstance(g, (str, bytes)) or not isinstance(g, Iterable) or getattr(g, "ndim", 1) == 0:
            raise ContractError(f"{who} returned {type(g).__name__} {g!r:.80} as {what} for {ep}; expected a "
                                f"sequence of {n} numbers (one per {unit}; {ctx})")
        try:
            arr = np.asarray(g)
        except (TypeError, ValueError, RuntimeError) as exc:  # ragged, or a tensor numpy cannot read
            raise ContractError(f"{who} returned {type(g).__name__} as {what} for {ep} that numpy cannot read "
                                f"({exc}); expected {n} real numbers (one per {unit}; {ctx})") from None
        if arr.ndim != 1 or arr.dtype.kind not in "biuf":
            raise ContractError(f"{who} returned an array of shape {arr.shape} and dtype {arr.dtype} as {what} "
                                f"for {ep}; expected {n} real numbers (one per {unit}; {ctx})")
        if arr.shape[0] != n:
            raise ContractError(f"{who} returned {arr.shape[0]} {what} for {ep}; expected {n} (one per {unit}; "
                                f"{ctx})")
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise ContractError(f"{who} returned {arr[bad[0]]} as {what} at {unit} {int(bad[0])} of {ep}; "
                                f"expected finite numbers ({ctx})")
    return items


def assign_credit(episodes: Sequence[Episode], cfg: AlgorithmConfig, sampling: SamplingRecord, *,
                  max_new_tokens: int | None = None, values_fn: ValuesFn | None = None,
                  shaped_cache: ShapedCache | None = None,
                  reward_penalties: Mapping[str, Sequence[float]] | None = None) -> CreditResult:
    """Turn an iteration's episodes into the policy batch (and, for a critic, the critic's
    batch) with the estimator named ``cfg.advantage`` (module docstring, steps 1-5).

    Args:
        episodes: the iteration's episodes, errored ones included (they are counted).
        cfg: the algorithm section.
        sampling: the transform every episode was sampled with.
        max_new_tokens: the rollout's per-turn cap (for the overlong shaping); ``None``
            turns that shaping off.
        values_fn: for an estimator registered with ``needs_values``: given the critic's
            ``ValueBatch`` (no returns), the value at each of its positions.
        shaped_cache: the iteration's ``ShapedCache`` that its ``missing_groups`` calls
            filled, so no episode is shaped twice; ``None``: shape here.
        reward_penalties: ``episode_id -> [K]`` per-turn costs subtracted from the shaped
            rewards the estimator sees (the KL-to-reference penalty of ``trainer.kl.mode:
            reward``, from ``agentrl.credit.kl_reward.turn_penalties``); applied after
            shaping and after the dynamic-sampling filter (which keeps judging the task's
            own rewards), never written into the episodes or ``shaped_cache``. Every kept
            episode needs an entry. ``None``: no penalty.

    Returns:
        The ``CreditResult``.

    Raises:
        ConfigError: an unknown estimator, or one that needs values without ``values_fn``.
        ContractError: an episode breaks the token contract, a turn has no reward,
            ``values_fn`` returned a count that does not match the value positions, or the
            estimator's return breaks its contract (not one sequence per episode, not one
            finite number per turn / sampled token, or with ``needs_values`` not an
            ``(advantages, returns)`` pair); the message names the estimator and episode;
            ``reward_penalties`` missing a kept episode or not one finite number per turn.
    """
    est = critics.get_estimator(cfg.advantage)
    if est.needs_values and values_fn is None:
        raise ConfigError(
            f"algorithm.advantage={cfg.advantage!r} needs a learned critic's values; assign_credit "
            "needs values_fn (the controller passes the critic trainer's)"
        )
    kept, shaped, m = _select(episodes, cfg, max_new_tokens, shaped_cache)
    if not kept:
        return _diagnosed(pack_batch(kept, [], sampling, m, level=est.level))
    rewards = [shaped[e.episode_id] for e in kept]  # [N][K_i]
    if reward_penalties is not None:
        rewards = [_penalised(e, r, reward_penalties) for e, r in zip(kept, rewards)]  # [N][K_i]
    anchors = [[t.anchor for t in e.turns] for e in kept]
    group_ids = [e.group_id for e in kept]
    counts = [len(e.turns) if est.level == "turn" else e.num_generated_tokens() for e in kept]
    values = None
    if est.needs_values:
        flat = np.asarray(values_fn(ValueBatch.pack(critic_rows(kept, level=est.level))),  # type: ignore[misc]
                          dtype=np.float64).reshape(-1)  # [sum(counts)]
        if flat.size != sum(counts):
            raise ContractError(f"values_fn returned {flat.size} values for {sum(counts)} value positions")
        values = [to_stream_order(e, v, est.level)  # read in each episode's row order
                  for e, v in zip(kept, np.split(flat, np.cumsum(counts)[:-1]))]  # [N][K_i] or [N][N_i]
    params = estimator_params(cfg)
    if est.level == "turn":
        out = est.fn(rewards, anchors, group_ids, values, params)
    else:
        out = est.fn(rewards, anchors, group_ids, values, [turn_token_counts(e) for e in kept], params)
    if est.needs_values and not (isinstance(out, tuple) and len(out) == 2):
        raise ContractError(
            f"estimator {est.name!r} (level={est.level!r}, needs_values=True) returned {type(out).__name__}"
            f"{f' of length {len(out)}' if isinstance(out, (tuple, list)) else ''}; expected a 2-tuple "
            "(advantages, returns)"
        )
    adv, rets = out if est.needs_values else (out, None)
    adv = _per_episode(est, "advantages", adv, counts, kept)
    if est.needs_values:
        rets = _per_episode(est, "returns", rets, counts, kept)
    dropped = _overlong_filtered(kept, cfg, m)
    credit = _diagnosed(pack_batch(kept, adv, sampling, m, level=est.level, loss_dropped_turns=dropped))
    if est.name == "gigpo":
        credit.metrics.update(gigpo_step_metrics(rewards, anchors, group_ids, params))
    if est.needs_values:
        vb = ValueBatch.pack(critic_rows(kept, returns=rets, old_values=values, level=est.level))
        credit.metrics["critic/values_mean_rollout"] = float(flat.mean()) if flat.size else 0.0
        credit.value_batch = vb if vb.num_positions else None  # no value position: nothing to fit
    return credit


def _diagnosed(credit: CreditResult) -> CreditResult:
    """``credit`` with ``credit/turn_adv_differs_frac``, ``credit/multi_turn_frac`` and
    ``credit/zero_grad_update`` in its metrics (``agentrl.credit.diagnostics``)."""
    credit.metrics.update(turn_spread_metrics(credit.turn_advantages))
    credit.metrics["credit/zero_grad_update"] = zero_grad_update(credit.batch)
    return credit


def _overlong_filtered(kept: Sequence[Episode], cfg: AlgorithmConfig, metrics: dict[str, float]) -> dict[str, set[int]]:
    """DAPO overlong filtering (Yu et al. 2025, §3.4), per turn: ``episode_id -> {k}`` for
    each turn ``k`` of a kept episode whose completion was cut by a token budget, i.e. its
    ``finish_reason`` is ``length``: ``rollout.max_new_tokens`` (the episode's termination
    is ``length``) or the room left in ``rollout.max_context_tokens`` (termination
    ``context_limit``). A ``context_limit`` episode that ended before sampling a turn (the
    next prompt left no room) has no cut completion and nothing is filtered. That
    completion leaves the loss, the episode's other turns stay, and its reward still counts
    in its group's statistics. Counts ``filter/overlong_filtered_turns`` (all cut turns)
    and ``filter/overlong_filtered_turns_context_limit`` (those of ``context_limit``
    episodes). Empty unless ``cfg.overlong_filtering``."""
    if not cfg.overlong_filtering:
        return {}
    out: dict[str, set[int]] = {}
    by_context = 0
    for e in kept:
        cut = {k for k, t in enumerate(e.turns) if t.finish_reason == "length"}
        if cut:
            out[e.episode_id] = cut
            by_context += len(cut) if e.termination_reason == TerminationReason.CONTEXT_LIMIT else 0
    metrics["filter/overlong_filtered_turns"] = float(sum(len(v) for v in out.values()))
    metrics["filter/overlong_filtered_turns_context_limit"] = float(by_context)
    return out


def _penalised(episode: Episode, rewards: Sequence[float], penalties: Mapping[str, Sequence[float]]) -> list[float]:
    """``rewards[k] - penalties[episode_id][k]`` per turn (a new list).

    Raises:
        ContractError: no entry for the episode, or not one finite number per turn.
    """
    if episode.episode_id not in penalties:
        raise ContractError(f"reward_penalties has no entry for kept episode {episode.episode_id}")
    p = [float(x) for x in penalties[episode.episode_id]]
    if len(p) != len(rewards) or not all(np.isfinite(p)):
        raise ContractError(
            f"reward_penalties[{episode.episode_id!r}]={p!r:.120}; expected {len(rewards)} finite numbers (one per turn)"
        )
    return [r - x for r, x in zip(rewards, p)]


def critic_step_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The critic trainer's step metrics under ``critic/`` (``losses/value_loss`` →
    ``critic/value_loss``; names already under ``critic/`` kept), so they never collide
    with the policy trainer's."""
    return {(k if k.startswith("critic/") else f"critic/{k.split('/', 1)[-1]}"): v for k, v in metrics.items()}
