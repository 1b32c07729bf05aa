"""Per-episode state of the rollout: the limits every episode of a worker runs under
(``RolloutLimits``) and one episode in flight (``ActiveEpisode``), shared by the agent loop
(``agentrl.rollout.loop``) and the episode state machine that steps it
(``agentrl.rollout.session``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Hashable

from agentrl.types import Episode, EpisodeRequest, ExecResult, TerminationReason


@dataclass(frozen=True)
class RolloutLimits:
    """Rollout limits (see ``agentrl.config.RolloutConfig`` for their meaning)."""

    max_turns: int
    max_new_tokens: int
    max_context_tokens: int
    score_truncated: bool = True
    prompt_mode: str = "full_history"
    history_length: int = 2
    stop_strings: tuple[str, ...] = ()  # a turn ends with the token completing one (agentrl.rollout.stop_strings)


@dataclass
class ActiveEpisode:
    """One episode in flight: its request, the episode recorded so far, its env and sandbox,
    and the state of its pending turn. Made by ``RolloutSession.submit`` and stepped by the
    session and the ``RolloutWorker`` it drives; env-side threads append to ``execs`` under
    ``lock`` only."""

    req: EpisodeRequest
    episode: Episode
    env: Any = None
    sandbox: Any = None
    pending_prompt: list[int] = field(default_factory=list)
    anchor: Hashable = ""
    execs: list[ExecResult] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    listener: Any = None
    max_tokens: int = 0  # the pending turn's engine max_tokens: min(token_budget, room left in the context)
    token_budget: int = 0  # its new-token cap before the context: rollout.max_new_tokens or StepInfo.max_new_tokens
    stop_strings: tuple[str, ...] = ()  # its stop strings: rollout.stop_strings + StepInfo.stop_strings
    branch: int = 0  # the branch it extends (Turn.branch)
    length_reason: TerminationReason = TerminationReason.LENGTH
    own_cap: bool = False  # the pending turn was cut by its own StepInfo.max_new_tokens: the episode goes on
    # per-step mode: what each step's prompt is rebuilt from
    task_text: str = ""
    system_prompt: str | None = None
    tools: Any = None
    describes_tools: bool = False
    examples: tuple[dict[str, str], ...] = ()
    # what a judge reads besides the turns (agentrl.rollout.judging)
    reference_answer: str | None = None  # StepInfo.reference_answer of the reset
    final_answer: str | None = None  # StepInfo.final_answer of the last step (None: it gave none)
    # the engine request of the pending turn (agentrl.rollout.session preempts and re-adds it)
    request_id: str = ""
    engine_prompt: list[int] = field(default_factory=list)  # the ids the turn's first segment was prompted with
    seed: int | None = None
    version: int = 0  # weight version of the pending turn's current segment
    segments: list[tuple[list[int], list[float], int]] = field(default_factory=list)  # (ids, log-probs, version) before a preemption
    preemptions: int = 0  # of the pending turn (its engine request ids are "{episode_id}:{turn}.{n}" after the n-th)
    env_call_started: float | None = None  # time.monotonic() when its running env call began (None: none running)
    abandoned: bool = False  # its env is left to a running call that overran env_timeout_s: closed only if it returns
    previous: Any = None  # restart mode: the earlier attempt's state, which this one's first env call closes
