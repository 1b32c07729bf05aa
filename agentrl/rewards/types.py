"""The data a judge reward passes around: what the judge reads (``JudgeItem``, part of the
data contract in ``agentrl.types.judge``), what is sent
(``JudgeRequest``), what comes back (``JudgeReply``), what it means (``Judgement``), and
the client protocol every judge implements (``Judge``: a local judge pool or an
OpenAI-compatible endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentrl.types.judge import JudgeItem

__all__ = ["Judge", "JudgeItem", "JudgeReply", "JudgeRequest", "Judgement"]


@dataclass(frozen=True)
class JudgeRequest:
    """One call to a judge.

    Attributes:
        messages: the chat messages (OpenAI format) the judge is prompted with.
        json_schema: the JSON schema its answer must satisfy (guided decoding on a local
            pool; checked on parse for any judge).
        cache_key: hex sha256 of (judge model, rubric digest, messages): equal keys get
            the same answer from the cache.
    """

    messages: tuple[dict[str, Any], ...]
    json_schema: dict[str, Any]
    cache_key: str


@dataclass(frozen=True)
class JudgeReply:
    """A judge's raw answer.

    Attributes:
        text: the judge's output text, as returned.
        model: the model that answered.
        latency_s: seconds the call took (0 for a cache hit).
        cached: served from the cache, not the judge.
    """

    text: str
    model: str
    latency_s: float
    cached: bool = False


@dataclass(frozen=True)
class Judgement:
    """A parsed judgement of one answer.

    Attributes:
        scores: criterion name -> score in [0, 1].
        reasons: criterion name (or ``""`` for the whole) -> the judge's stated reason.
        score: the rubric's combination of ``scores`` in [0, 1] (weights and gates).
        gate_failed: the name of the first gate criterion that failed, or None.
    """

    scores: dict[str, float]
    reasons: dict[str, str] = field(default_factory=dict)
    score: float = 0.0
    gate_failed: str | None = None


@runtime_checkable
class Judge(Protocol):
    """What every judge client implements."""

    model: str

    def complete(self, request: JudgeRequest) -> JudgeReply:
        """The judge's answer to ``request``.

        Raises:
            agentrl.errors.JudgeError: the judge did not answer after its retries (an infrastructure
                fault: the episode becomes a reward error, never a 0).
        """
        ...

    def check(self) -> None:
        """A health check at start-up: one tiny call.

        Raises:
            agentrl.errors.JudgeError: the judge is down, too slow, or answers garbage (named).
        """
        ...
