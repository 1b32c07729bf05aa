"""Episodes and the requests that produce them: ``EpisodeRequest`` (what to roll out),
``Episode`` (one rollout: its ``Turn`` list, how it ended, its reward, its trainer rows),
``TerminationReason`` and ``PromptMode``.

Token bookkeeping rules enforced here:

1. Token-in, token-out: an episode's token stream is
   ``turns[0].prompt_ids + turns[0].completion_ids + turns[1].prompt_ids + ...``; the
   completion ids are exactly what the engine sampled, never re-encoded text. An episode
   whose environment forked the conversation (``Turn.branch``, ``full_history`` mode) has
   one such stream per branch, over that branch's turns (``Episode.rows``, ``token_ids(branch=b)``).
2. ``loss_mask`` is 1 exactly on ``completion_ids`` (the stop token the engine produced
   included), 0 on ``prompt_ids`` (prompt, observations, chat-template glue).
3. ``sum(loss_mask) == len(behavior_log_probs)`` per episode.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Sequence

from agentrl.errors import ContractError
from agentrl.types.batch import TokenSequence
from agentrl.types.judge import JudgeRecord
from agentrl.types.rows import EpisodeRows, TurnSpan
from agentrl.types.turn import Turn

PromptMode = Literal["full_history", "per_step"]
"""``full_history``: one token stream per episode, each turn's ``prompt_ids`` the delta
since the previous completion. ``per_step``: each turn's ``prompt_ids`` is that step's
*whole* prompt (task, the last few steps, the current observation), and each turn is its
own training row (verl-agent's per-step mode; context stays flat over long episodes)."""


class TerminationReason(str, Enum):
    """Why an episode ended (docs/design.md, "Episode")."""

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
class EpisodeRequest:
    """One episode to roll out: the arrow from the ``TaskSource`` to the rollout engines
    (docs/design.md, "One round, as data").

    Attributes:
        env_id, task_id, seed: passed to the environment's ``reset(seed=..., options={"task_id": ...})``.
        group_id: shared by all rollouts of one task instance and seed.
        sample_seed: base seed of the engine's sampling for this episode (turn k uses
            ``sample_seed * 1009 + k``), so a resumed run samples the same tokens.
        run_id: the training run (``""`` for requests made outside a run, e.g. in tests).
        iteration: the run's iteration the episode is rolled out for, from 1 (0: before
            training, e.g. an eval of the starting policy); the replay store's ``iteration``.
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
            An episode a judge scored (``judgement.judged``) succeeded when its reward is at
            least ``reward.success_threshold`` (``agentrl.rollout.judging``).
        prompt_mode: ``full_history`` (one row per branch: one row unless the environment
            forked the conversation) or ``per_step`` (one row per turn); see ``PromptMode``
            and ``rows``.
        counters: named per-episode counts the environment reported (``StepInfo.counters``,
            e.g. ``"gateway/forks"``), summed over its reset and steps; finite floats.
            ``rollout_metrics`` sums each over the episodes under its own name.
        judgement: the judge's audit record (``JudgeRecord``) when the run's reward has a
            judge (``reward.judge``), else None. The reward it gave is already in the turns
            (the last turn's reward carries the difference to the rule's).

    Branches (``Turn.branch``, ``full_history`` mode only): an environment may fork the
    conversation, e.g. an agent behind the gateway whose next request does not extend the
    tokens so far. Each branch is its own token stream and trainer row; the methods that
    walk turns take ``branch`` (None: every turn, in turn order; for an episode of one branch
    that is its stream, for several it interleaves them and is no sequence any model saw).

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
    counters: dict[str, float] = field(default_factory=dict)
    judgement: JudgeRecord | None = None

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

    def branches(self) -> list[int]:
        """The branch ids of the turns (``Turn.branch``), each once, in order of each
        branch's first turn (``rows`` order in ``full_history`` mode); ``[]`` without turns."""
        return list(dict.fromkeys(t.branch for t in self.turns))

    def branch_turns(self, branch: int | None = None) -> list[int]:
        """Indices into ``turns`` of ``branch``'s turns, in turn order; ``None``: every turn."""
        return [k for k, t in enumerate(self.turns) if branch is None or t.branch == branch]

    def _turns_of(self, branch: int | None) -> list[Turn]:
        return self.turns if branch is None else [t for t in self.turns if t.branch == branch]

    def token_ids(self, branch: int | None = None) -> list[int]:
        """Prompt/observation ids and sampled ids interleaved, turn by turn. ``[L]``.

        ``branch=b``: that branch's token stream (what the engine was prompted with before
        the branch's next turn's prompt ids); ``None``: every turn, in turn order, which is
        the episode's stream when it has one branch (class docstring)."""
        out: list[int] = []
        for t in self._turns_of(branch):
            out.extend(t.prompt_ids)
            out.extend(t.completion_ids)
        return out

    def loss_mask(self, branch: int | None = None) -> list[int]:
        """``[L]`` of 0/1 aligned with ``token_ids(branch)``: 1 exactly on sampled ids."""
        out: list[int] = []
        for t in self._turns_of(branch):
            out.extend([0] * len(t.prompt_ids))
            out.extend([1] * len(t.completion_ids))
        return out

    def behavior_log_probs(self, branch: int | None = None) -> list[float]:
        """Log-probs (nats) of the sampled ids of ``token_ids(branch)``, in its order.
        ``[sum(loss_mask(branch))]``."""
        out: list[float] = []
        for t in self._turns_of(branch):
            out.extend(t.behavior_log_probs)
        return out

    def rows(self) -> list[EpisodeRows]:
        """The trainer-row layout of this episode, derived here and nowhere else: which
        turns each row holds and where each turn's prompt and completion segments sit in it.

        * ``full_history``: one row per branch (``Turn.branch``), in order of the branch's
          first turn, holding that branch's turns in turn order: the stream
          ``prompt_0, completion_0, prompt_1, ...`` of those turns (the first one's
          ``prompt_ids`` is the branch's whole prompt). Keys: branch 0 ``episode_id``,
          branch ``b > 0`` ``f"{episode_id}:b{b}"``. An episode of one branch has one row.
        * ``per_step``: one row per turn, ``prompt_k + completion_k``, key
          ``f"{episode_id}:{k}"`` (every turn is on branch 0 there: ``validate``).

        ``training_sequences`` and the credit room's value positions and per-row splits all
        read this, so they cannot disagree. The rows' turns, concatenated, are ``0 .. K-1``
        exactly once; in turn order except where branches interleave (turns 0 and 2 on
        branch 0, turn 1 on branch 1 give the rows ``[0, 2]`` and ``[1]``): a reader that maps
        rows back to turns goes by ``TurnSpan.turn``.

        Returns:
            ``[B]`` ``EpisodeRows`` (``B`` = the number of branches, or ``K`` in
            ``per_step`` mode); ``[]`` for an episode without turns.
        """
        if not self.turns:
            return []
        if self.prompt_mode != "full_history":
            rows = []
            for k, t in enumerate(self.turns):
                p, c = len(t.prompt_ids), len(t.completion_ids)
                rows.append(EpisodeRows((TurnSpan(k, 0, p, p + c),), p + c, f"{self.episode_id}:{k}"))
            return rows
        spans: dict[int, list[TurnSpan]] = {}  # branch -> its spans, in order of the branch's first turn
        length: dict[int, int] = {}
        for k, t in enumerate(self.turns):
            offset = length.get(t.branch, 0)
            p, c = len(t.prompt_ids), len(t.completion_ids)
            spans.setdefault(t.branch, []).append(TurnSpan(k, offset, offset + p, offset + p + c))
            length[t.branch] = offset + p + c
        return [EpisodeRows(tuple(s), length[b], self.episode_id if b == 0 else f"{self.episode_id}:b{b}")
                for b, s in spans.items()]

    def training_sequences(self, per_turn_advantages: Sequence[float], policy_version: int | None = None) -> list[TokenSequence]:
        """The trainer rows of this episode (``rows``) with per-turn advantages
        broadcast onto each turn's sampled tokens (0 on prompt/observation tokens): one row
        per branch in ``full_history`` mode (one unless the env forked), one per turn in
        ``per_step`` mode; each row's ``episode_id`` is its ``rows`` key.

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
        for row in self.rows():
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
        """Sampled ids over every turn of every branch (``sum(loss_mask())``)."""
        return sum(len(t.completion_ids) for t in self.turns)

    def policy_version_range(self) -> tuple[int, int] | None:
        """``(oldest, newest)`` weight version over the episode's sampled tokens
        (``Turn.policy_versions``); ``None`` when it has no sampled token. A sample's
        staleness is ``trainer_version - oldest``."""
        versions = [v for t in self.turns for v in t.policy_versions]
        return (min(versions), max(versions)) if versions else None

    def token_policy_versions(self, branch: int | None = None) -> list[int]:
        """``[L]`` aligned with ``token_ids(branch)``: each sampled id's weight version, 0 on
        prompt/observation ids."""
        out: list[int] = []
        for t in self._turns_of(branch):
            out.extend([0] * len(t.prompt_ids))
            out.extend(t.policy_versions)
        return out

    def validate(self) -> None:
        """Raise ``ContractError`` if the episode breaks invariants 2–3 of docs/design.md."""
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
        if self.prompt_mode == "per_step":
            forked = next((k for k, t in enumerate(self.turns) if t.branch != 0), None)
            if forked is not None:
                raise ContractError(f"episode {self.episode_id}: turn {forked} has branch={self.turns[forked].branch} in "
                                    "per_step mode; expected branch 0 (branches need full_history)")
        if not isinstance(self.counters, dict):
            raise ContractError(f"episode {self.episode_id}: counters of type {type(self.counters).__name__}; "
                                "expected a dict of str -> finite float")
        for key, value in self.counters.items():
            if not (isinstance(key, str) and isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value)):
                raise ContractError(f"episode {self.episode_id}: counters[{key!r}]={value!r}; expected a str key "
                                    "and a finite number")
        if self.judgement is not None:
            if not isinstance(self.judgement, JudgeRecord):
                raise ContractError(f"episode {self.episode_id}: judgement of type {type(self.judgement).__name__}; "
                                    "expected a JudgeRecord or None")
            self.judgement.validate()
        if self.terminated and self.truncated:
            raise ContractError(
                f"episode {self.episode_id} is both terminated and truncated"
            )


def broadcast_turn_values(episode: Episode, per_turn: Sequence[float], branch: int | None = None) -> list[float]:
    """Spread one value per turn onto that turn's tokens.

    Args:
        per_turn: ``[K]`` one value per turn of the episode (every branch).
        branch: the tokens of ``episode.token_ids(branch)``; None: of ``token_ids()``.

    Returns ``[L]`` floats aligned with ``episode.token_ids(branch)``: ``per_turn[k]`` on
    turn k's completion ids, 0.0 on every prompt/observation id, so an observation token
    never carries an advantage.

    Raises:
        ContractError: ``len(per_turn) != len(episode.turns)``.
    """
    if len(per_turn) != len(episode.turns):
        raise ContractError(
            f"got {len(per_turn)} per-turn values for an episode of {len(episode.turns)} turns"
        )
    out: list[float] = []
    for t, v in zip(episode.turns, per_turn):
        if branch is not None and t.branch != branch:
            continue
        out.extend([0.0] * len(t.prompt_ids))
        out.extend([float(v)] * len(t.completion_ids))
    return out
