"""What one rollout call runs under in place of the worker's own settings: ``RolloutBudget``,
the limits, the sampling transform, the env kwargs and the judge of, e.g., a held-out
evaluation (``agentrl.driver.evaluation.eval_budget``) or a difficulty profile
(``agentrl.driver.difficulty.rollout_budget``). Passed per call
(``EnginePool.rollout`` -> ``RolloutActor.rollout`` -> ``RolloutWorker.run``); nothing of the
worker is changed by it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from agentrl.errors import ConfigError
from agentrl.rollout.state import RolloutLimits
from agentrl.types import SamplingRecord

BUDGET_JUDGES = ("none", "eval")
"""``RolloutBudget.judge``'s values."""


@dataclass(frozen=True)
class RolloutBudget:
    """The limits, sampling, env kwargs and judge of one rollout call.

    Attributes:
        max_turns: turns per episode at most.
        max_new_tokens: tokens one completion may sample.
        max_context_tokens: the whole episode's token budget.
        sampling: the sampling transform (temperature, top_p, top_k) every turn uses.
        env_kwargs: the kwargs the call's environments are made with (e.g. the eval judge's,
            ``agentrl.driver.judge``); None: the run's ``env.kwargs``.
        judge: which LLM judge scores the call's episodes: ``"eval"``, the worker's eval
            judge (``eval.judge``; ``RolloutWorker.with_budget``); ``"none"``, none (the
            env's rule reward alone).

    Raises:
        ConfigError: a limit below 1, or a ``judge`` not in ``BUDGET_JUDGES``.
    """

    max_turns: int
    max_new_tokens: int
    max_context_tokens: int
    sampling: SamplingRecord = field(default_factory=SamplingRecord)
    env_kwargs: Mapping[str, Any] | None = None
    judge: Literal["none", "eval"] = "none"

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_context_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"RolloutBudget.{name}={value!r}; expected an int >= 1")
        if self.env_kwargs is not None:
            object.__setattr__(self, "env_kwargs", dict(self.env_kwargs))
        if self.judge not in BUDGET_JUDGES:
            raise ConfigError(f"RolloutBudget.judge={self.judge!r}; expected one of {list(BUDGET_JUDGES)}")

    @classmethod
    def at_temperature(cls, temperature: float, *, max_turns: int, max_new_tokens: int, max_context_tokens: int,
                       env_kwargs: Mapping[str, Any] | None = None,
                       judge: Literal["none", "eval"] = "none") -> "RolloutBudget":
        """A budget sampling at ``temperature`` with top_p 1 and top_k off (the fixed
        sampling of an evaluation or a profile)."""
        return cls(int(max_turns), int(max_new_tokens), int(max_context_tokens),
                   SamplingRecord(temperature=float(temperature), top_p=1.0, top_k=-1), env_kwargs, judge)

    def limits(self, base: RolloutLimits) -> RolloutLimits:
        """``base`` (the worker's limits) with this budget's turn and token limits."""
        return dataclasses.replace(base, max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                                   max_context_tokens=self.max_context_tokens)

    def record(self) -> dict[str, Any]:
        """``{"temperature", "max_turns", "max_new_tokens", "max_context_tokens"}``: the budget
        as a difficulty profile records it (``agentrl.eval.difficulty.TaskProfile.budget``)."""
        return {"temperature": self.sampling.temperature, "max_turns": self.max_turns,
                "max_new_tokens": self.max_new_tokens, "max_context_tokens": self.max_context_tokens}
