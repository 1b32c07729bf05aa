"""What a judge reads of an episode (``JudgeItem``, built by the rollout as the episode
ends) and the audit trail of one judged episode (``JudgeRecord``, ``Episode.judgement``),
stored in the replay store beside the transcript (table ``judgements``) and shown by the
viewer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ContractError


@dataclass(frozen=True)
class JudgeItem:
    """One episode as a judge reads it.

    Attributes:
        task: the task as the policy saw it (the first user message).
        reference: the reference answer, or None when the task has none.
        answer: the episode's final answer (the env's parsed answer, else the last action's
            text).
        transcript: the whole episode as text (actions and observations in turn order).
        tool_outputs: the sandbox outputs of the episode, in order.
        rule_reward: the env's own (rule) reward of the episode, or None.
    """

    task: str
    reference: str | None
    answer: str
    transcript: str = ""
    tool_outputs: tuple[str, ...] = ()
    rule_reward: float | None = None


@dataclass
class JudgeRecord:
    """What the judge saw and said about one episode.

    Attributes:
        model: the judge model that answered (as its server names it).
        rubric: the rubric's name; ``rubric_digest`` its hex sha256 (``Rubric.digest``).
        mode: ``single`` (this episode alone) or ``group`` (its group in one call;
            ``group_position`` is its id there).
        prompt: the chat messages the judge was sent (OpenAI format).
        output: the judge's raw answer; None when no answer came (``error``).
        scores: criterion -> score in [0, 1]; ``reasons``: criterion (``""``: overall) ->
            the judge's stated reason.
        score: the rubric's combination of ``scores`` in [0, 1]; None without a judgement.
        gate_failed: the first gate criterion that failed, or None.
        rule_reward: the environment's own (rule) reward of the episode, or None.
        reward: the episode's reward after combining (``reward.combine``); None for a
            reward error.
        latency_s: seconds the judge call took (0 when ``cached`` or not judged).
        cached: the answer came from the judge cache.
        judged: False when the rule decided and no judge call was made (``rule_first``).
        calls: judge calls made for the episode (a retry after an unparseable answer is
            one more; the client's own retries of a failed HTTP call are not counted here).
        parse_errors: answers of those calls (or of the cache) that could not be parsed.
        error: why there is no judgement (the judge failed after its retries, or its answer
            could not be parsed), else None.
        submitted_at_s, settled_at_s: wall-clock epoch seconds (``time.time()`` on the
            rollout engine's host) when the rollout session handed the episode to the judge
            and when its judgement settled the reward; the wait between them is the judge
            queue, its calls and their retries (``judge/wait_*``, the ``judge`` phase of the
            timeline). None on a record built outside a rollout. They travel with the episode
            (Ray) but are not stored in the replay store (a stored record reads None) and
            are left out of equality.
    """

    model: str
    rubric: str
    rubric_digest: str
    mode: str = "single"
    prompt: list[dict[str, Any]] = field(default_factory=list)
    output: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    score: float | None = None
    gate_failed: str | None = None
    rule_reward: float | None = None
    reward: float | None = None
    latency_s: float = 0.0
    cached: bool = False
    judged: bool = True
    calls: int = 0
    parse_errors: int = 0
    group_position: int | None = None
    error: str | None = None
    submitted_at_s: float | None = field(default=None, compare=False)
    settled_at_s: float | None = field(default=None, compare=False)

    def validate(self) -> None:
        """Raises ContractError: a score outside [0, 1], a non-finite reward, latency or
        time stamp, or a mode other than single / group."""
        if self.mode not in ("single", "group"):
            raise ContractError(f"JudgeRecord.mode={self.mode!r}; expected 'single' or 'group'")
        for k, v in self.scores.items():
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ContractError(f"JudgeRecord.scores[{k!r}]={v!r}; expected a number in [0, 1]")
        for name in ("score", "rule_reward", "reward", "submitted_at_s", "settled_at_s"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ContractError(f"JudgeRecord.{name}={v!r}; expected a finite number or None")
        if not math.isfinite(self.latency_s) or self.latency_s < 0:
            raise ContractError(f"JudgeRecord.latency_s={self.latency_s!r}; expected seconds >= 0")
