"""What one rollout call runs under in place of the worker's own settings: ``RolloutBudget``,
the limits, the sampling transform and the env kwargs of, e.g., a held-out evaluation
(``agentrl.driver.evaluation.eval_budget``) or a difficulty profile
(``agentrl.driver.difficulty.rollout_budget``). Passed per call
(``EnginePool.rollout`` -> ``RolloutActor.rollout`` -> ``RolloutWorker.run``); nothing of the
worker is changed by it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from agentrl.errors import ConfigError
from agentrl.rollout.state import RolloutLimits
from agentrl.types import SamplingRecord


@dataclass(frozen=True)
class RolloutBudget:
    """The limits, sampling and env kwargs of one rollout call.

    Attributes:
        max_turns: turns per episode at most.
        max_new_tokens: tokens one completion may sample.
        max_context_tokens: the whole episode's token budget.
        sampling: the sampling transform (temperature, top_p, top_k) every turn uses.
        env_kwargs: the kwargs the call's environments are made with (e.g. the eval judge's,
            ``agentrl.driver.judge``); None: the run's ``env.kwargs``.

    Raises:
        ConfigError: a limit below 1.
    """

    max_turns: int
    max_new_tokens: int
    max_context_tokens: int
    sampling: SamplingRecord = field(default_factory=SamplingRecord)
    env_kwargs: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_context_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"RolloutBudget.{name}={value!r}; expected an int >= 1")
        if self.env_kwargs is not None:
            object.__setattr__(self, "env_kwargs", dict(self.env_kwargs))

    @classmethod
    def at_temperature(cls, temperature: float, *, max_turns: int, max_new_tokens: int, max_context_tokens: int,
                       env_kwargs: Mapping[str, Any] | None = None) -> "RolloutBudget":
        """A budget sampling at ``temperature`` with top_p 1 and top_k off (the fixed
        sampling of an evaluation or a profile)."""
        return cls(int(max_turns), int(max_new_tokens), int(max_context_tokens),
                   SamplingRecord(temperature=float(temperature), top_p=1.0, top_k=-1), env_kwargs)

    def limits(self, base: RolloutLimits) -> RolloutLimits:
        """``base`` (the worker's limits) with this budget's turn and token limits."""
        return dataclasses.replace(base, max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                                   max_context_tokens=self.max_context_tokens)

    def record(self) -> dict[str, Any]:
        """``{"temperature", "max_turns", "max_new_tokens", "max_context_tokens"}``: the budget
        as a difficulty profile records it (``agentrl.eval.difficulty.TaskProfile.budget``)."""
        return {"temperature": self.sampling.temperature, "max_turns": self.max_turns,
                "max_new_tokens": self.max_new_tokens, "max_context_tokens": self.max_context_tokens}
