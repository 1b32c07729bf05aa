"""The data contract of agentrl: ``EpisodeRequest``, ``Turn``, ``Episode``, ``TokenBatch``,
``ValueBatch`` (value targets for a critic), and the sandbox's ``ExecResult``. Nothing else
defines these (design.md).

Token bookkeeping rules enforced here:

1. Token-in, token-out: an episode's token stream is
   ``turns[0].prompt_ids + turns[0].completion_ids + turns[1].prompt_ids + ...``; the
   completion ids are exactly what the engine sampled, never re-encoded text.
2. ``loss_mask`` is 1 exactly on ``completion_ids`` (the stop token the engine produced
   included), 0 on ``prompt_ids`` (prompt, observations, chat-template glue).
3. ``sum(loss_mask) == len(behavior_log_probs)`` per episode.

This module imports only ``agentrl.errors`` of ours, the standard library, and torch
(lazily, for ``TokenBatch``).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Hashable, Literal, Mapping, Sequence

from agentrl.errors import ConfigError, ContractError

FinishReason = Literal["stop", "length", "abort"]
PromptMode = Literal["full_history", "per_step"]
"""``full_history``: one token stream per episode, each turn's ``prompt_ids`` the delta
since the previous completion. ``per_step``: each turn's ``prompt_ids`` is that step's
*whole* prompt (task, the last few steps, the current observation), and each turn is its
own training row (verl-agent's per-step mode; context stays flat over long episodes)."""


class TerminationReason(str, Enum):
    """Why an episode ended (design.md, "Episode")."""

    ENV_TERMINATED = "env_terminated"
    """The environment said ``terminated=True`` (task solved, failed or submitted)."""
    ENV_TRUNCATED = "env_truncated"
    """The environment said ``truncated=True`` (its own step limit)."""
    MAX_TURNS = "max_turns"
    """The rollout's ``max_turns`` was reached."""
    CONTEXT_LIMIT = "context_limit"
    """The context budget ``max_context_tokens`` ended the episode: either the next turn's
    prompt left no room (no engine call was made; every recorded turn is complete), or the
    last completion was cut by the room left, fewer tokens than ``max_new_tokens`` (that
    turn's ``finish_reason == "length"``, a cut reply like ``length``)."""
    LENGTH = "length"
    """A completion hit ``max_new_tokens`` (``finish_reason == "length"``)."""
    INFRA_ERROR = "infra_error"
    """Sandbox, engine or environment infrastructure failed. Excluded from the loss."""
    REWARD_ERROR = "reward_error"
    """The reward function failed. Excluded from the loss."""
    ABORTED = "aborted"
    """The rollout engine running the episode was lost (its node removed, its actor killed)
    before the episode finished. An infrastructure fault: excluded from the loss like
    ``infra_error``, stored and counted, and the same request is rolled out again with
    ``attempt + 1`` on another engine (``agentrl.cluster.engine_pool``); ``Episode.error``
    names the engine and its node."""

    @property
    def is_error(self) -> bool:
        """Excluded from the loss and never scored: ``infra_error``, ``reward_error``, ``aborted``."""
        return self in (TerminationReason.INFRA_ERROR, TerminationReason.REWARD_ERROR, TerminationReason.ABORTED)


@dataclass(frozen=True)
class SamplingRecord:
    """The sampling transform that produced ``behavior_log_probs``.

    The trainer recomputes log-probs under the same transform (design.md, invariant 4):
    ``log_softmax(logits / temperature)``. ``top_p < 1`` or ``top_k > 0`` change the
    sampling distribution; the trainer refuses them rather than silently mis-scoring.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


@dataclass(frozen=True)
class ExecResult:
    """Result of one command run in a sandbox.

    Attributes:
        command: argv list or shell string as given.
        exit_code: process exit status; ``-9``/``137`` style values when killed. ``None``
            only when the command never started.
        stdout, stderr: decoded output (invalid UTF-8 replaced by U+FFFD, never raising),
            capped at the sandbox's output cap; ``truncated_bytes`` counts what was cut.
        duration_s: wall time in seconds.
        timed_out: the command was killed at its ``timeout_s``.
        truncated_bytes: bytes dropped from stdout+stderr by the output cap.
    """

    command: str | tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated_bytes: int = 0


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to roll out: the arrow from the ``TaskSource`` to the rollout engines
    (design.md, "One round, as data").

    Attributes:
        env_id, task_id, seed: passed to the environment's ``reset(seed=..., options={"task_id": ...})``.
        group_id: shared by all rollouts of one task instance and seed.
        sample_seed: base seed of the engine's sampling for this episode (turn k uses
            ``sample_seed * 1009 + k``), so a resumed run samples the same tokens.
        run_id: the training run (``""`` for requests made outside a run, e.g. in tests).
        iteration: the run's 0-based iteration the episode is rolled out for (the replay
            store's ``iteration``).
        index: the rollout's index in its group, ``0 <= index < group_size``.
        attempt: how many times this same request (same run, iteration, group and index)
            was rolled out before, 0 the first time; a retry of one request raises it so
            that each rollout has its own id. Dynamic-sampling refills are new task
            instances (new ``group_id``), so they start at 0 too.

    ``episode_id`` is derived from these fields (see there): a run resumed from a checkpoint
    re-issues the same requests, so a re-run iteration's episodes keep their ids.
    """

    env_id: str
    task_id: str
    seed: int
    group_id: str
    sample_seed: int
    run_id: str = ""
    iteration: int = 0
    index: int = 0
    attempt: int = 0

    @property
    def episode_id(self) -> str:
        """``"{run_id}/it{iteration}/{group_id}/{index}/a{attempt}"``, e.g.
        ``"demo-1a2b3c4d/it3/HumanEval/7@12/1/a0"`` (without the ``"{run_id}/"`` prefix when
        ``run_id`` is empty). Deterministic, and unique in a run as long as group ids are
        (``TaskSource``'s are ``"{task_id}@{position}"``, one position per task instance).
        An id longer than ``EPISODE_ID_MAX_LEN`` characters keeps its first 150 and ends
        in ``"#"`` plus 40 hex digits of the SHA-256 of the whole id (still deterministic)."""
        key = f"it{self.iteration}/{self.group_id}/{self.index}/a{self.attempt}"
        if self.run_id:
            key = f"{self.run_id}/{key}"
        if len(key) > EPISODE_ID_MAX_LEN:
            key = key[:150] + "#" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return key


EPISODE_ID_MAX_LEN = 200
"""Longest ``episode_id`` the replay store accepts (its id columns are ``String(200)``)."""


@dataclass
class Turn:
    """One agent turn: the tokens appended before the completion, then the completion.

    Attributes:
        prompt_ids: ids appended since the previous turn's completion: the initial prompt
            (turn 0) or the observation plus chat-template glue. ``loss_mask`` 0.
        completion_ids: ids exactly as the engine sampled them, the stop token included
            when the engine emitted one. ``loss_mask`` 1.
        behavior_log_probs: log-prob (nats) of each completion id under the engine's
            sampling distribution (``sampling`` transform applied). ``len ==
            len(completion_ids)``.
        sampling: the transform used (temperature, top_p, top_k).
        policy_version: weight version that sampled the turn's first token (0 = initial
            weights); ``== min(policy_versions)``.
        policy_versions: ``[len(completion_ids)]`` the weight version that sampled each
            completion id (design.md: a turn spans versions when a rollout continues across
            a weight update); never decreasing. Left empty when built by hand, it is filled
            with ``policy_version`` for every completion id.
        finish_reason: ``stop`` (a stop id or stop string), ``length`` (max new tokens)
            or ``abort``.
        reward: environment reward after this turn's action; ``None`` until known or when
            the reward failed (see ``Episode.error``).
        anchor: hashable state key *before* this turn's action, for GiGPO
            (``info["anchor"]`` or else the observation text).
        action_text: decoded completion (for humans, parsers and the replay viewer).
        observation_text: the environment's observation after the action ("" if none).
        invalid_action: the completion could not be parsed into a valid action
            (the model's fault; it may be penalised).
        exec_results: sandbox commands run while executing this turn's action.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    behavior_log_probs: list[float]
    sampling: SamplingRecord = field(default_factory=SamplingRecord)
    policy_version: int = 0
    finish_reason: FinishReason = "stop"
    reward: float | None = None
    anchor: Hashable = ""
    action_text: str = ""
    observation_text: str = ""
    invalid_action: bool = False
    exec_results: list[ExecResult] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.policy_versions and self.completion_ids:
            self.policy_versions = [int(self.policy_version)] * len(self.completion_ids)

    def validate(self) -> None:
        """Raise ``ContractError`` if this turn breaks the token contract."""
        if len(self.completion_ids) != len(self.behavior_log_probs):
            raise ContractError(
                f"turn has {len(self.completion_ids)} completion ids but "
                f"{len(self.behavior_log_probs)} behavior_log_probs; expected equal counts"
            )
        if len(self.policy_versions) != len(self.completion_ids):
            raise ContractError(
                f"turn has {len(self.completion_ids)} completion ids but {len(self.policy_versions)} "
                "policy_versions; expected one version per sampled id"
            )
        if any(b < a for a, b in zip(self.policy_versions, self.policy_versions[1:])):
            raise ContractError(f"turn policy_versions={self.policy_versions[:20]} decrease; a later token "
                                "cannot come from older weights")
        if self.policy_versions and self.policy_versions[0] != self.policy_version:
            raise ContractError(f"turn policy_version={self.policy_version} but its first token's version is "
                                f"{self.policy_versions[0]}; expected the version of the first sampled token")
        for lp in self.behavior_log_probs:
            if not (math.isfinite(lp) and lp <= 1e-4):
                raise ContractError(
                    f"behavior_log_prob={lp!r} is not a finite log-probability (<= 0)"
                )
        if self.finish_reason not in ("stop", "length", "abort"):
            raise ContractError(
                f"finish_reason={self.finish_reason!r}; expected 'stop', 'length' or 'abort'"
            )
        try:
            hash(self.anchor)
        except TypeError as exc:
            raise ContractError(f"anchor={self.anchor!r} is not hashable") from exc


@dataclass(frozen=True)
class TurnSpan:
    """Where one turn sits in its trainer row (row-local token indices).

    Attributes:
        turn: index of the turn in ``Episode.turns``.
        prompt_start: first index of the turn's ``prompt_ids``.
        completion_start: first index of its ``completion_ids`` (= ``prompt_start +
            len(prompt_ids)``); the token before it is the turn's boundary, the last token
            of the state ``s_k``.
        completion_end: one past its last completion id (= ``completion_start +
            len(completion_ids)``).
    """

    turn: int
    prompt_start: int
    completion_start: int
    completion_end: int

    @property
    def prompt_len(self) -> int:
        return self.completion_start - self.prompt_start

    @property
    def completion_len(self) -> int:
        return self.completion_end - self.completion_start


@dataclass(frozen=True)
class RowLayout:
    """One trainer row of an episode (``Episode.row_layout``).

    Attributes:
        turns: the turns the row holds, in order, with their segment offsets.
        length: the row's token count ``L``.
        key: the row's id in a ``TokenBatch`` (the episode id; ``"{episode_id}:{k}"`` for
            turn k's row in ``per_step`` mode).
    """

    turns: tuple[TurnSpan, ...]
    length: int
    key: str

    @property
    def num_sampled(self) -> int:
        """Sampled tokens in this row (its ``sum(loss_mask)``)."""
        return sum(s.completion_len for s in self.turns)

    def loss_mask(self) -> list[int]:
        """``[L]`` 0/1: 1 exactly on the row's completion ids."""
        out: list[int] = []
        for s in self.turns:
            out.extend([0] * s.prompt_len + [1] * s.completion_len)
        return out


@dataclass
class Episode:
    """One rollout of one task instance.

    Attributes:
        episode_id: unique id. The rollout loop sets it from its request
            (``EpisodeRequest.episode_id``: deterministic from run, iteration, request and
            attempt); an episode built by hand gets a uuid4 hex by default.
        group_id: shared by all rollouts of one task instance and seed (the GRPO group).
        env_id, task_id, seed: what was rolled out.
        turns: in order.
        terminated, truncated: Gymnasium semantics for the whole episode.
        termination_reason: why it ended.
        error: ``None``, or ``{"type": ..., "message": ...}`` for infra/reward errors and
            aborted episodes.
        success: the task was solved, as the environment says (``info["success"]`` of the
            last step); ``None`` when it does not say (then ``total_reward >= 1`` counts).
        prompt_mode: ``full_history`` (one row) or ``per_step`` (one row per turn); see
            ``PromptMode``. ``token_ids``/``loss_mask``/``behavior_log_probs`` are the
            rows concatenated in either mode.

    The episode's reward is ``total_reward`` (alias ``reward``): computed from the turns,
    read-only.
    """

    group_id: str
    env_id: str
    task_id: str
    seed: int
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    termination_reason: TerminationReason | None = None
    error: dict[str, str] | None = None
    episode_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    prompt_mode: PromptMode = "full_history"
    success: bool | None = None

    @property
    def total_reward(self) -> float | None:
        """Sum of turn rewards; ``None`` for an errored episode or a missing reward."""
        if self.is_error:
            return None
        rewards = [t.reward for t in self.turns]
        if any(r is None for r in rewards):
            return None
        return float(sum(rewards))  # type: ignore[arg-type]

    @property
    def reward(self) -> float | None:
        """The episode's reward, read-only: the same value as ``total_reward`` (the sum of
        its turns' rewards, ``turns[k].reward``; ``None`` for an errored episode or a missing
        reward). Nothing extra is stored; set rewards on the turns."""
        return self.total_reward

    @property
    def is_error(self) -> bool:
        """True for infra or reward errors and aborted episodes: excluded from the loss, never scored 0."""
        return self.termination_reason is not None and self.termination_reason.is_error

    def token_ids(self) -> list[int]:
        """The full stream: prompt/observation ids and sampled ids interleaved. ``[L]``."""
        out: list[int] = []
        for t in self.turns:
            out.extend(t.prompt_ids)
            out.extend(t.completion_ids)
        return out

    def loss_mask(self) -> list[int]:
        """``[L]`` of 0/1: 1 exactly on sampled ids."""
        out: list[int] = []
        for t in self.turns:
            out.extend([0] * len(t.prompt_ids))
            out.extend([1] * len(t.completion_ids))
        return out

    def behavior_log_probs(self) -> list[float]:
        """Log-probs of the sampled ids, in stream order. ``[sum(loss_mask)]``."""
        out: list[float] = []
        for t in self.turns:
            out.extend(t.behavior_log_probs)
        return out

    def row_layout(self) -> list["RowLayout"]:
        """The trainer-row layout of this episode, derived here and nowhere else: which
        turns each row holds and where each turn's prompt and completion segments sit in it.

        * ``full_history``: one row, the whole stream ``prompt_0, completion_0, prompt_1, ...``.
        * ``per_step``: one row per turn, ``prompt_k + completion_k``.

        ``training_sequences`` and the credit room's value positions and per-row splits all
        read this, so they cannot disagree. Row order is turn order; the rows' turns,
        concatenated, are ``0 .. K-1`` exactly once.

        Returns:
            ``[B]`` ``RowLayout`` (``B = 1`` or ``K``); ``[]`` for an episode without turns.
        """
        rows: list[list[TurnSpan]] = [[]] if self.prompt_mode == "full_history" else []
        offset = 0
        for k, t in enumerate(self.turns):
            if self.prompt_mode != "full_history":
                rows.append([])
                offset = 0
            p, c = len(t.prompt_ids), len(t.completion_ids)
            rows[-1].append(TurnSpan(k, offset, offset + p, offset + p + c))
            offset += p + c
        if not self.turns:
            return []
        suffix = self.prompt_mode != "full_history"
        return [RowLayout(tuple(spans), spans[-1].completion_end if spans else 0,
                          f"{self.episode_id}:{spans[0].turn}" if suffix else self.episode_id)
                for spans in rows]

    def training_sequences(self, per_turn_advantages: Sequence[float], policy_version: int | None = None) -> list["TokenSequence"]:
        """The trainer rows of this episode (``row_layout``) with per-turn advantages
        broadcast onto each turn's sampled tokens (0 on prompt/observation tokens): one row
        in ``full_history`` mode, one per turn in ``per_step`` mode.

        Args:
            per_turn_advantages: ``[K]`` one value per turn.
            policy_version: every row's (and every token's) version; ``None``: each token
                keeps its ``Turn.policy_versions`` entry and the row's version is the
                lowest over its sampled tokens (its staleness is ``trainer_version - that``).

        Raises:
            ContractError: ``len(per_turn_advantages) != len(turns)``.
        """
        if len(per_turn_advantages) != len(self.turns):
            raise ContractError(
                f"got {len(per_turn_advantages)} per-turn values for an episode of {len(self.turns)} turns"
            )
        rows = []
        for row in self.row_layout():
            ids: list[int] = []
            mask: list[int] = []
            lps: list[float] = []
            adv: list[float] = []
            tok_versions: list[int] = []
            for span in row.turns:
                t, a = self.turns[span.turn], float(per_turn_advantages[span.turn])
                ids.extend(t.prompt_ids)
                ids.extend(t.completion_ids)
                mask.extend([0] * len(t.prompt_ids) + [1] * len(t.completion_ids))
                lps.extend(t.behavior_log_probs)
                adv.extend([0.0] * len(t.prompt_ids) + [a] * len(t.completion_ids))
                tok_versions.extend([0] * len(t.prompt_ids))
                tok_versions.extend(t.policy_versions if policy_version is None else [policy_version] * len(t.completion_ids))
            sampled = [v for s in row.turns for v in self.turns[s.turn].policy_versions]
            version = ((min(sampled) if sampled else min(self.turns[s.turn].policy_version for s in row.turns))
                       if policy_version is None else policy_version)
            rows.append(TokenSequence(ids, mask, lps, adv, self.group_id, version, row.key, tok_versions))
        return rows

    def num_generated_tokens(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)

    def policy_version_range(self) -> tuple[int, int] | None:
        """``(oldest, newest)`` weight version over the episode's sampled tokens
        (``Turn.policy_versions``); ``None`` when it has no sampled token. A sample's
        staleness is ``trainer_version - oldest``."""
        versions = [v for t in self.turns for v in t.policy_versions]
        return (min(versions), max(versions)) if versions else None

    def token_policy_versions(self) -> list[int]:
        """``[L]`` aligned with ``token_ids()``: each sampled id's weight version, 0 on
        prompt/observation ids."""
        out: list[int] = []
        for t in self.turns:
            out.extend([0] * len(t.prompt_ids))
            out.extend(t.policy_versions)
        return out

    def validate(self) -> None:
        """Raise ``ContractError`` if the episode breaks invariants 2–3 of design.md."""
        if not self.turns and self.termination_reason is None:
            raise ContractError(f"episode {self.episode_id} has no turns and no termination reason")
        for t in self.turns:
            t.validate()
        n_mask = sum(self.loss_mask())
        n_lp = len(self.behavior_log_probs())
        if n_mask != n_lp:
            raise ContractError(
                f"episode {self.episode_id}: sum(loss_mask)={n_mask} != "
                f"len(behavior_log_probs)={n_lp}"
            )
        if self.prompt_mode not in ("full_history", "per_step"):
            raise ContractError(f"episode {self.episode_id}: prompt_mode={self.prompt_mode!r}; expected 'full_history' or 'per_step'")
        if self.terminated and self.truncated:
            raise ContractError(
                f"episode {self.episode_id} is both terminated and truncated"
            )


def broadcast_turn_values(episode: Episode, per_turn: Sequence[float]) -> list[float]:
    """Spread one value per turn onto that turn's tokens.

    Returns ``[L]`` floats: ``per_turn[k]`` on turn k's completion ids, 0.0 on every
    prompt/observation id, so an observation token never carries an advantage.

    Raises:
        ContractError: ``len(per_turn) != len(episode.turns)``.
    """
    if len(per_turn) != len(episode.turns):
        raise ContractError(
            f"got {len(per_turn)} per-turn values for an episode of {len(episode.turns)} turns"
        )
    out: list[float] = []
    for t, v in zip(episode.turns, per_turn):
        out.extend([0.0] * len(t.prompt_ids))
        out.extend([float(v)] * len(t.completion_ids))
    return out


@dataclass(frozen=True)
class TokenSequence:
    """One trainer row before packing (what ``TokenBatch.pack`` takes).

    Attributes:
        input_ids: ``[L]`` token ids.
        loss_mask: ``[L]`` 0/1.
        behavior_log_probs: ``[sum(loss_mask)]`` engine log-probs of the masked tokens.
        advantages: ``[L]`` per-token advantages (0 where ``loss_mask`` is 0).
        group_id, policy_version, episode_id: metadata; ``policy_version`` is the row's
            OLDEST sampled-token version.
        token_policy_versions: ``[L]`` weight version of each sampled token (0 where
            ``loss_mask`` is 0), or ``None``: every sampled token is ``policy_version``.
    """

    input_ids: Sequence[int]
    loss_mask: Sequence[int]
    behavior_log_probs: Sequence[float]
    advantages: Sequence[float]
    group_id: str
    policy_version: int
    episode_id: str = ""
    token_policy_versions: Sequence[int] | None = None


@dataclass(frozen=True)
class TokenBatch:
    """What the trainer sees, and nothing more: packed sequences without padding.

    All per-token tensors are 1-D over the concatenation of the rows (``T`` = total
    tokens). Build it only with ``TokenBatch.pack`` (the one validating constructor).

    Attributes:
        input_ids: ``[T]`` int64.
        position_ids: ``[T]`` int64, restarting at 0 for every row.
        loss_mask: ``[T]`` float32 of 0.0/1.0.
        behavior_log_probs: ``[T]`` float32, engine log-probs on masked tokens, 0 elsewhere.
        advantages: ``[T]`` float32, 0 where ``loss_mask`` is 0.
        seq_lens: ``[B]`` int64 row lengths, ``sum(seq_lens) == T``.
        group_ids: ``B`` strings. episode_ids: ``B``.
        policy_versions: ``[B]`` int64, each row's OLDEST sampled-token version (the
            sample's staleness is ``trainer_version - policy_versions[b]``).
        token_policy_versions: ``[T]`` int64, the weight version that sampled each token,
            0 where ``loss_mask`` is 0 (a row's tokens may span versions: partial rollouts).
        sampling: the transform every row was sampled with (must be uniform).
        proximal_log_probs: ``[T]`` float32 or ``None``: the trainer's log-probs (nats) at
            the weights the update starts from (design.md, "Three log-probs"), finite on
            loss tokens, 0 elsewhere. ``None`` (on-policy, the synchronous loop): the
            trainer takes them from the first epoch's own forward (today's
            ``old_log_probs``). Set them with ``pack(..., proximal_log_probs=...)`` or
            ``with_proximal_log_probs``, which validate them.
    """

    input_ids: Any
    position_ids: Any
    loss_mask: Any
    behavior_log_probs: Any
    advantages: Any
    seq_lens: Any
    policy_versions: Any
    group_ids: tuple[str, ...]
    episode_ids: tuple[str, ...]
    sampling: SamplingRecord
    proximal_log_probs: Any = None
    token_policy_versions: Any = None

    @property
    def num_rows(self) -> int:
        return len(self.group_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def row_slices(self) -> list[slice]:
        """Token-range slice of each row in the packed tensors."""
        out, start = [], 0
        for n in self.seq_lens.tolist():
            out.append(slice(start, start + n))
            start += n
        return out

    def select_rows(self, rows: Sequence[int]) -> "TokenBatch":
        """A new batch holding only ``rows`` (in that order); used for micro-batching."""
        import torch

        slices = self.row_slices()
        idx = torch.cat([torch.arange(slices[r].start, slices[r].stop) for r in rows]) if rows else torch.zeros(0, dtype=torch.long)

        def take(t: Any) -> Any:
            return None if t is None else t[idx]

        return TokenBatch(
            input_ids=take(self.input_ids),
            position_ids=take(self.position_ids),
            loss_mask=take(self.loss_mask),
            behavior_log_probs=take(self.behavior_log_probs),
            advantages=take(self.advantages),
            seq_lens=self.seq_lens[list(rows)] if rows else self.seq_lens[:0],
            policy_versions=self.policy_versions[list(rows)] if rows else self.policy_versions[:0],
            group_ids=tuple(self.group_ids[r] for r in rows),
            episode_ids=tuple(self.episode_ids[r] for r in rows),
            sampling=self.sampling,
            proximal_log_probs=take(self.proximal_log_probs),
            token_policy_versions=take(self.token_policy_versions),
        )

    def with_proximal_log_probs(self, proximal_log_probs: Any) -> "TokenBatch":
        """This batch with ``proximal_log_probs`` set (``[T]``, e.g. what
        ``PolicyTrainer.compute_log_probs`` returned at the weights the update starts
        from), checked as ``pack`` checks them. ``None`` clears them.

        Raises:
            ContractError: not ``[T]``, or a non-finite value on a loss token.
        """
        from dataclasses import replace

        return replace(self, proximal_log_probs=_checked_proximal(proximal_log_probs, self.loss_mask))

    @classmethod
    def pack(
        cls, rows: Sequence[TokenSequence], sampling: SamplingRecord, *, proximal_log_probs: Any = None
    ) -> "TokenBatch":
        """Validate and pack rows into one batch.

        Args:
            rows: the rows, in order.
            sampling: the transform every row was sampled with.
            proximal_log_probs: optional ``[T]`` (tensor or sequence, ``T`` = the packed
                token count) trainer log-probs at the weights the update starts from;
                stored as float32, set to 0 off the loss tokens.

        Raises:
            ContractError: empty input, mismatched lengths, ``sum(loss_mask) !=
                len(behavior_log_probs)``, a non-finite advantage, a non-zero
                advantage on an unmasked token, ``proximal_log_probs`` not ``[T]`` or
                not finite on a loss token, or ``token_policy_versions`` not ``[L]``, below
                the row's ``policy_version`` on a loss token, or decreasing along the row.
        """
        import torch

        if not rows:
            raise ContractError("TokenBatch.pack got no rows")
        ids, pos, mask, blp, adv, lens, tpv = [], [], [], [], [], [], []
        for i, r in enumerate(rows):
            n = len(r.input_ids)
            if n == 0:
                raise ContractError(f"row {i} ({r.episode_id}) has no tokens")
            if len(r.loss_mask) != n or len(r.advantages) != n:
                raise ContractError(
                    f"row {i} ({r.episode_id}): input_ids has {n} tokens, loss_mask "
                    f"{len(r.loss_mask)}, advantages {len(r.advantages)}; expected equal"
                )
            m = [int(x) for x in r.loss_mask]
            if any(x not in (0, 1) for x in m):
                raise ContractError(f"row {i}: loss_mask must be 0/1")
            if m[0] == 1:
                raise ContractError(
                    f"row {i} ({r.episode_id}): loss_mask is 1 on the first token, which has no "
                    "prefix to be scored from; a row starts with prompt tokens"
                )
            if sum(m) != len(r.behavior_log_probs):
                raise ContractError(
                    f"row {i} ({r.episode_id}): sum(loss_mask)={sum(m)} != "
                    f"len(behavior_log_probs)={len(r.behavior_log_probs)}"
                )
            a = [float(x) for x in r.advantages]
            for k, (x, mk) in enumerate(zip(a, m)):
                if not math.isfinite(x):
                    raise ContractError(f"row {i} ({r.episode_id}): advantage {x} at token {k} is not finite")
                if mk == 0 and x != 0.0:
                    raise ContractError(
                        f"row {i} ({r.episode_id}): advantage {x} on unmasked token {k}; "
                        "observation tokens never get an advantage"
                    )
            tpv.extend(_checked_token_versions(r, i, m))
            full_lp = [0.0] * n
            it = iter(r.behavior_log_probs)
            for k in range(n):
                if m[k]:
                    full_lp[k] = float(next(it))
            ids.extend(int(x) for x in r.input_ids)
            pos.extend(range(n))
            mask.extend(m)
            blp.extend(full_lp)
            adv.extend(a)
            lens.append(n)
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long),
            position_ids=torch.tensor(pos, dtype=torch.long),
            loss_mask=torch.tensor(mask, dtype=torch.float32),
            behavior_log_probs=torch.tensor(blp, dtype=torch.float32),
            advantages=torch.tensor(adv, dtype=torch.float32),
            seq_lens=torch.tensor(lens, dtype=torch.long),
            policy_versions=torch.tensor([r.policy_version for r in rows], dtype=torch.long),
            group_ids=tuple(r.group_id for r in rows),
            episode_ids=tuple(r.episode_id for r in rows),
            sampling=sampling,
            token_policy_versions=torch.tensor(tpv, dtype=torch.long),
        ).with_proximal_log_probs(proximal_log_probs)


def _checked_token_versions(r: TokenSequence, i: int, m: Sequence[int]) -> list[int]:
    """Row ``i``'s per-token versions ``[L]`` (0 off the loss tokens); ``None`` means every
    sampled token is the row's ``policy_version``.

    Raises:
        ContractError: not one per token, a sampled token older than the row's version, or
            versions decreasing along the row's sampled tokens.
    """
    if r.token_policy_versions is None:
        return [int(r.policy_version) if mk else 0 for mk in m]
    if len(r.token_policy_versions) != len(m):
        raise ContractError(f"row {i} ({r.episode_id}): token_policy_versions has {len(r.token_policy_versions)} "
                            f"entries for {len(m)} tokens; expected one per token")
    out = [int(v) if mk else 0 for v, mk in zip(r.token_policy_versions, m)]
    sampled = [v for v, mk in zip(out, m) if mk]
    if sampled and min(sampled) < r.policy_version:
        raise ContractError(f"row {i} ({r.episode_id}): a sampled token has version {min(sampled)}, below the row's "
                            f"policy_version={r.policy_version} (expected the row's oldest token version)")
    if any(b < a for a, b in zip(sampled, sampled[1:])):
        raise ContractError(f"row {i} ({r.episode_id}): token_policy_versions decrease along the row's sampled tokens")
    return out


def _checked_proximal(values: Any, loss_mask: Any) -> Any:
    """``values`` as a ``[T]`` float32 tensor, 0 where ``loss_mask`` is 0 (``None`` stays
    ``None``).

    Raises:
        ContractError: not one value per token, or a non-finite value on a loss token.
    """
    import torch

    if values is None:
        return None
    t = torch.as_tensor(values).detach().to(device="cpu", dtype=torch.float32)  # (T,)
    if t.shape != loss_mask.shape:
        raise ContractError(
            f"proximal_log_probs has shape {tuple(t.shape)}; expected {tuple(loss_mask.shape)} "
            "(one log-prob per packed token, [T] float32)"
        )
    on = loss_mask > 0  # (T,)
    bad = (~torch.isfinite(t) & on).nonzero()
    if bad.numel():
        k = int(bad[0])
        raise ContractError(f"proximal_log_probs[{k}]={float(t[k])} on a loss token; expected a finite log-prob")
    return torch.where(on, t, torch.zeros_like(t))  # (T,)


# ---------------------------------------------------------------------------- value targets


def _slices(lens: Sequence[int]) -> list[slice]:
    out, start = [], 0
    for n in lens:
        out.append(slice(start, start + n))
        start += n
    return out


@dataclass(frozen=True)
class ValueRow:
    """One value-model row before packing (what ``ValueBatch.pack`` takes).

    The one batch type for value targets: a critic reads values at chosen *positions* of
    the same token rows the policy trains on, and is fitted to ``returns`` there.
    ``TokenBatch`` carries no value targets (a per-token ``returns`` would be wrong for the
    turn-level critic, which has one target per turn, not per token).

    Attributes:
        input_ids: ``[L]`` token ids (a row of ``Episode.training_sequences``).
        positions: ``[K]`` row-local token indices in ``[0, L)`` where values are read:
            each turn's boundary (the last token before turn k's completion) for
            ``turn_critic``, or ``p - 1`` for every sampled token ``p`` for ``gae``.
        returns: ``[K]`` value targets, or ``None`` for a batch that is only evaluated.
        old_values: ``[K]`` values at rollout time (for value clipping), or ``None``.
        episode_id: for error messages.
    """

    input_ids: Sequence[int]
    positions: Sequence[int]
    returns: Sequence[float] | None = None
    old_values: Sequence[float] | None = None
    episode_id: str = ""


@dataclass(frozen=True)
class ValueBatch:
    """Packed value-model input (no padding). Build it only with ``ValueBatch.pack``.

    Attributes:
        input_ids: ``[T]`` int64, rows concatenated.
        position_ids: ``[T]`` int64, restarting at 0 per row.
        seq_lens: ``[B]`` int64 row lengths, ``sum(seq_lens) == T``.
        positions: ``[N]`` int64 row-local token index of every value position, rows in
            order (``N`` = total value positions).
        positions_per_row: ``[B]`` int64, ``sum == N``.
        returns: ``[N]`` float32 targets, or ``None`` (evaluation only).
        old_values: ``[N]`` float32 rollout-time values, or ``None``.
        episode_ids: ``B`` strings.
    """

    input_ids: Any
    position_ids: Any
    seq_lens: Any
    positions: Any
    positions_per_row: Any
    returns: Any
    old_values: Any
    episode_ids: tuple[str, ...]

    @property
    def num_rows(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_positions(self) -> int:
        return int(self.positions.shape[0])

    def row_slices(self) -> list[slice]:
        """Token-range slice of each row in the packed token tensors."""
        return _slices(self.seq_lens.tolist())

    def position_slices(self) -> list[slice]:
        """Range of each row's value positions in ``positions`` / ``returns`` / ``old_values``."""
        return _slices(self.positions_per_row.tolist())

    @classmethod
    def pack(cls, rows: Sequence[ValueRow]) -> "ValueBatch":
        """Validate and pack rows (position ids ``0..L-1`` per row).

        Raises:
            ContractError: no rows, an empty row, a position outside its row,
                ``len(returns) != len(positions)`` (or ``old_values``), a non-finite
                return or old value, ``returns`` or ``old_values`` on some rows only.
        """
        import torch

        if not rows:
            raise ContractError("ValueBatch.pack got no rows")
        with_old = rows[0].old_values is not None
        with_ret = rows[0].returns is not None
        ids: list[int] = []
        pos: list[int] = []
        lens: list[int] = []
        where: list[int] = []
        ret: list[float] = []
        old: list[float] = []
        counts: list[int] = []
        for i, r in enumerate(rows):
            n = len(r.input_ids)
            if n == 0:
                raise ContractError(f"row {i} ({r.episode_id}) has no tokens")
            p = [int(x) for x in r.positions]
            k = len(p)
            bad = [x for x in p if not 0 <= x < n]
            if bad:
                raise ContractError(f"row {i} ({r.episode_id}): position {bad[0]} outside the row's tokens [0, {n})")
            if (r.old_values is not None) != with_old:
                raise ContractError("either every row carries old_values or none does")
            if (r.returns is not None) != with_ret:
                raise ContractError("either every row carries returns or none does")
            for name, vals, out in (("returns", r.returns, ret), ("old_values", r.old_values, old)):
                if vals is None:
                    continue
                v = [float(x) for x in vals]
                if len(v) != k:
                    raise ContractError(
                        f"row {i} ({r.episode_id}): {len(v)} {name} for {k} positions; expected one per position"
                    )
                if not all(math.isfinite(x) for x in v):
                    raise ContractError(f"row {i} ({r.episode_id}): {name} {v} are not all finite")
                out.extend(v)
            ids.extend(int(x) for x in r.input_ids)
            pos.extend(range(n))
            lens.append(n)
            where.extend(p)
            counts.append(k)
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long),
            position_ids=torch.tensor(pos, dtype=torch.long),
            seq_lens=torch.tensor(lens, dtype=torch.long),
            positions=torch.tensor(where, dtype=torch.long),
            positions_per_row=torch.tensor(counts, dtype=torch.long),
            returns=torch.tensor(ret, dtype=torch.float32) if with_ret else None,
            old_values=torch.tensor(old, dtype=torch.float32) if with_old else None,
            episode_ids=tuple(r.episode_id for r in rows),
        )


# --------------------------------------------------------------------------------------
# Step info: what an environment hands the rollout beside the observation
# --------------------------------------------------------------------------------------

ObservationRole = Literal["user", "tool", "system"]
OBSERVATION_ROLES: tuple[str, ...] = ("user", "tool", "system")
EXAMPLE_ROLES: tuple[str, ...] = ("user", "assistant", "tool")
"""Roles a demonstration turn of ``StepInfo.example_messages`` may have."""
_NO_ANCHOR: Any = None
STEP_INFO_KEYS: tuple[str, ...] = (
    "anchor", "observation_role", "tool_outputs", "system_prompt", "tools",
    "system_prompt_describes_tools", "example_messages", "invalid_action", "success",
)
"""The ``info`` keys ``StepInfo`` owns; every other key is the env's own."""

_TOOL_SHAPE = '{"type": "function", "function": {"name": ..., "parameters": {"properties": {...}}}}'


def type_name(value: Any) -> str:
    """``value``'s type as ``module.qualname`` (``numpy.float64``), bare for builtins
    (``int``), for error messages: numpy 2 names its bool type plain ``bool``."""
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _safe_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters; a ``repr`` that raises is described."""
    try:
        text = repr(value)
    except Exception as exc:
        return f"<{type_name(value)} whose repr raised {type_name(exc)}>"
    return text if len(text) <= limit else text[:limit] + "..."


def as_bool(value: Any) -> bool | None:
    """``value`` as a Python bool when it is one or numpy's bool scalar (``np.True_``,
    what ``reward >= 1.0`` gives for a numpy reward), else None. numpy is detected by
    ``type(value).__module__ == "numpy"`` and the type's name (``bool`` in numpy 2, ``bool_``
    in numpy 1), so this module never imports numpy; ints (0/1) and numpy ints are not bools."""
    if isinstance(value, bool):
        return value
    t = type(value)
    if t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"):
        return bool(value)
    return None


def tool_function(tool: Any) -> Mapping[str, Any]:
    """The ``function`` part of an OpenAI tool schema (or the schema itself if flat),
    checked so everything that reads it (the prompt's tool description, the tool-call
    parser, ``StepInfo``) can index it without further checks: ``name`` a str; ``parameters``,
    if present and not None, a dict whose ``properties`` (if present) is a dict of dicts
    and whose ``required`` (if present) is a list of str. The one copy of this check.

    Raises:
        ConfigError: the schema breaks one of these; the message names the schema, the
            part that is wrong and the shape expected.
    """
    def bad(what: str) -> ConfigError:
        return ConfigError(f"tool schema {_safe_repr(tool)} {what}; expected {_TOOL_SHAPE}")

    if not isinstance(tool, Mapping):
        raise bad(f"is a {type_name(tool)}, not a dict")
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise bad("has no function name")
    params = fn.get("parameters")
    if params is None:
        return fn
    if not isinstance(params, Mapping):
        raise bad(f"has parameters of type {type_name(params)}, not a dict")
    props = params.get("properties")
    if props is not None:
        if not isinstance(props, Mapping):
            raise bad(f"has parameters.properties of type {type_name(props)}, not a dict")
        for pname, pschema in props.items():
            if not isinstance(pschema, Mapping):
                raise bad(f"has property {pname!r} whose schema is a {type_name(pschema)}, not a dict")
    required = params.get("required")
    if required is not None and not (isinstance(required, (list, tuple)) and all(isinstance(r, str) for r in required)):
        raise bad(f"has parameters.required={_safe_repr(required)}, not a list of str")
    return fn


class StepInfoError(ContractError):
    """An environment's ``info`` broke the step-info contract. ``env_id``, ``key`` and
    ``value`` name what was wrong; the message also says what was expected."""

    def __init__(self, message: str, *, env_id: str, key: str, value: Any) -> None:
        super().__init__(message)
        self.env_id = env_id
        self.key = key
        self.value = value


@dataclass(frozen=True)
class StepInfo:
    """The part of Gymnasium's ``info`` dict that the rollout reads (design.md, "Step
    info"). An env returns a plain dict (Gymnasium's API); build it with ``to_info()`` so
    the key strings live here only, and read it with ``from_info()``, the one validator the
    rollout loop and ``environments.checker`` share. Other keys of ``info`` (``task_id``,
    ``split``, counters) are the env's own and pass through untouched.

    Attributes:
        anchor: hashable key of the state before the next action (GiGPO's anchor state,
            Feng et al. 2025, arXiv:2505.10978). None (or absent): the observation text is
            the anchor.
        observation_role: chat role of the observation message: ``user`` (default),
            ``tool`` or ``system``.
        tool_outputs: with role ``tool``, one string per tool call run; each becomes its
            own tool message (chat templates expect one per call). None: absent.
        system_prompt: (reset) the system message of the episode; None: absent.
        tools: (reset) OpenAI-style function schemas offered to the model, as dicts, each
            passing ``tool_function``. None: absent; ``()``: no tools.
        system_prompt_describes_tools: (reset) the system prompt already explains the
            tools in words, so the rollout must not append a generated description.
        example_messages: (reset) a worked example as chat turns (few-shot prompting; Brown
            et al. 2020, "Language Models are Few-Shot Learners", Sec. 2), placed between the
            system message and the task: each a ``{"role": ..., "content": str}`` dict with a
            role of ``EXAMPLE_ROLES``. They are prompt tokens (``loss_mask`` 0), repeated in
            every per-step prompt. None: absent.
        invalid_action: the action could not be parsed (the model's format fault).
        success: whether the episode's task was achieved (on the step that ends it);
            None: the env does not say.
    """

    anchor: Hashable = _NO_ANCHOR
    observation_role: ObservationRole = "user"
    tool_outputs: tuple[str, ...] | None = None
    system_prompt: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    system_prompt_describes_tools: bool = False
    example_messages: tuple[dict[str, str], ...] | None = None
    invalid_action: bool = False
    success: bool | None = None

    def anchor_or(self, observation: str) -> Hashable:
        """The anchor, or ``observation`` when the env gave none."""
        return observation if self.anchor is None else self.anchor

    def to_info(self, **extra: Any) -> dict[str, Any]:
        """The ``info`` dict an env returns: ``anchor``, ``observation_role`` and
        ``invalid_action`` always, the other fields when set (``system_prompt_describes_tools``
        when True), then the env's own keys ``extra``.

        Raises:
            ContractError: a key of ``extra`` is one of ``STEP_INFO_KEYS``.
        """
        clash = sorted(k for k in extra if k in STEP_INFO_KEYS)
        if clash:
            raise ContractError(f"info keys {clash} are StepInfo fields; pass them to StepInfo(...), not as extra keys")
        info: dict[str, Any] = {"anchor": self.anchor, "observation_role": self.observation_role,
                                "invalid_action": self.invalid_action}
        if self.tool_outputs is not None:
            info["tool_outputs"] = list(self.tool_outputs)
        if self.system_prompt is not None:
            info["system_prompt"] = self.system_prompt
        if self.tools is not None:
            info["tools"] = [dict(t) for t in self.tools]
        if self.system_prompt_describes_tools:
            info["system_prompt_describes_tools"] = True
        if self.example_messages is not None:
            info["example_messages"] = [dict(m) for m in self.example_messages]
        if self.success is not None:
            info["success"] = self.success
        info.update(extra)
        return info

    @classmethod
    def from_info(cls, info: Any, *, env_id: str, where: str = "step") -> "StepInfo":
        """Parse and validate the step-info keys of an env's ``info`` dict.

        Accepted beyond the plain types: ``tool_outputs`` and ``tools`` as a list or a
        tuple; numpy's bool (``np.True_``) for the flags, stored as a Python bool
        (``as_bool``).

        Args:
            info: what ``reset`` or ``step`` returned as ``info``.
            env_id: the env, for messages.
            where: ``"reset"`` or ``"step"`` (or e.g. ``"step 3"``), for messages.

        Raises:
            StepInfoError (a ContractError): ``info`` is not a dict, or a key has a value of
                the wrong type (an anchor whose ``hash`` raises anything, an
                ``observation_role`` that is not one of the role strings, a tool schema
                ``tool_function`` refuses, an example turn that is not a dict with a role of
                ``EXAMPLE_ROLES`` and str content); the message names the env, the key, the value
                and what was expected. Nothing else is raised.
        """
        def bad(key: str, value: Any, expected: str) -> StepInfoError:
            return StepInfoError(f"{env_id} {where}: info[{key!r}]={_safe_repr(value)} {expected}",
                                 env_id=env_id, key=key, value=value)

        if not isinstance(info, dict):
            raise StepInfoError(f"{env_id} {where}: info of type {type_name(info)}; expected dict",
                                env_id=env_id, key="info", value=info)
        anchor = info.get("anchor")
        try:
            hash(anchor)
        except TypeError:
            raise bad("anchor", anchor, "is not hashable; use a tuple/str/int state key (GiGPO groups steps by it)") from None
        except Exception as exc:
            raise bad("anchor", anchor, f"is not hashable: hash() raised {type_name(exc)}: {exc}; "
                      "use a tuple/str/int state key (GiGPO groups steps by it)") from exc
        role = info.get("observation_role", "user")
        if not isinstance(role, str) or role not in OBSERVATION_ROLES:
            raise bad("observation_role", role, f"is not one of {OBSERVATION_ROLES}")
        outputs = info.get("tool_outputs")
        if outputs is not None and not (isinstance(outputs, (list, tuple)) and all(isinstance(o, str) for o in outputs)):
            raise bad("tool_outputs", outputs, "must be a list of str (one per tool call)")
        prompt = info.get("system_prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise bad("system_prompt", prompt, f"must be str, got {type_name(prompt)}")
        tools = info.get("tools")
        if tools is not None:
            if not (isinstance(tools, (list, tuple)) and all(isinstance(t, dict) for t in tools)):
                raise bad("tools", tools, "must be a list of dict (OpenAI-style function schemas)")
            for i, tool in enumerate(tools):
                try:
                    tool_function(tool)
                except ConfigError as exc:
                    raise bad("tools", tools, f"has a bad tool {i}: {exc}") from exc
        examples = info.get("example_messages")
        if examples is not None:
            if not isinstance(examples, (list, tuple)):
                raise bad("example_messages", examples, "must be a list of {'role': ..., 'content': str} dicts")
            for i, m in enumerate(examples):
                if not (isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in EXAMPLE_ROLES
                        and isinstance(m["content"], str)):
                    raise bad("example_messages", examples,
                              f"has a bad turn {i} ({_safe_repr(m, 80)}): expected a dict with exactly 'role' (one of "
                              f"{EXAMPLE_ROLES}) and 'content' (str)")
        flags: dict[str, bool | None] = {}
        for key, default in (("system_prompt_describes_tools", False), ("invalid_action", False), ("success", None)):
            value = info.get(key, default)
            flag = as_bool(value)
            if flag is None and not (value is None and default is None):
                raise bad(key, value, f"must be bool, got {type_name(value)}")
            flags[key] = flag
        return cls(anchor=anchor, observation_role=role,
                   tool_outputs=tuple(outputs) if outputs is not None else None,
                   system_prompt=prompt, tools=tuple(tools) if tools is not None else None,
                   example_messages=tuple(dict(m) for m in examples) if examples is not None else None, **flags)
