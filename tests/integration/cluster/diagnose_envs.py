"""Test-only environment for ``agentrl diagnose``'s runs made on purpose (imported through
``env.import_modules`` in the driver and every Ray actor; registers on import).

``agentrl-test/Symptoms-v0``: one turn per episode; the task id picks the judge's fault.

- ``constant``: every answer scores 0.5 (a judge that always gives the same score).
- ``length``: the reward is the answer's length in characters / 400 (a reward that pays for
  length), capped at 1.
- ``fair``: 1 when the answer has an even number of spaces, else 0 (a judge that reads the
  answer; with a random policy about half pass).
- ``wrong``/``wrong-N``: a capital-city question whose reference is a different city (a task
  with a wrong reference answer): a model that knows the capital answers it the same way
  every time and is judged wrong every time.

Splits: ``train`` = constant, length, fair, wrong; ``test`` = wrong-0 .. wrong-3 (held out).
"""

from __future__ import annotations

from typing import Any

import gymnasium

from agentrl.errors import ConfigError
from agentrl.types import StepInfo
from environments.core import TextEnv

ENV_ID = "agentrl-test/Symptoms-v0"
SPLITS = {"train": ["constant", "length", "fair", "wrong"], "test": [f"wrong-{i}" for i in range(4)]}
SPLITS["all"] = SPLITS["train"] + SPLITS["test"]


QUESTIONS = {
    "wrong": ("What is the capital of France? Reply with one word.", "lyon"),
    "wrong-0": ("What is the capital of France? Reply with one word.", "lyon"),
    "wrong-1": ("What is the capital of Italy? Reply with one word.", "milan"),
    "wrong-2": ("What is the capital of Germany? Reply with one word.", "munich"),
    "wrong-3": ("What is the capital of Spain? Reply with one word.", "barcelona"),
}
"""Wrong-reference tasks: a question and the (wrong) reference the judge wants in the answer."""


class SymptomsEnv(TextEnv):
    uses_sandbox = False

    def __init__(self, sandbox: Any = None, split: str = "train") -> None:
        super().__init__()
        if split not in SPLITS:
            raise ConfigError(f"split={split!r}; expected one of {sorted(SPLITS)}")
        self.split = split

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        if split not in SPLITS:
            raise ConfigError(f"split={split!r}; expected one of {sorted(SPLITS)}")
        return list(SPLITS[split])

    @classmethod
    def checker_actions(cls) -> list[str]:
        return ["an answer", "another one here"]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        task = self._start_reset(seed, options) or self._draw(SPLITS[self.split])
        if task not in SPLITS["all"]:
            raise ConfigError(f"task_id={task!r} is not a task of {ENV_ID}; expected one of {SPLITS['all']}")
        self._task_id, self._done = task, False
        info = StepInfo(anchor=task, system_prompt="Answer the question.").to_info(task_id=task)
        # no seed in the prompt: every sample of a task gets the same question
        return QUESTIONS.get(task, ("Say a word.", ""))[0], info

    def step(self, action: str):
        self._check_step(action)
        task = self._task_id
        success: bool | None = None
        if task == "constant":
            reward = 0.5
        elif task == "length":
            reward = min(1.0, len(action) / 400)
        elif task == "fair":
            reward = float(action.count(" ") % 2 == 0)
            success = reward == 1.0
        else:  # wrong, wrong-N: a real question whose reference answer is wrong
            success = QUESTIONS[task][1] in action.lower()
            reward = float(success)
        self._done = True
        return "Scored.", reward, True, False, StepInfo(anchor=task, success=success).to_info(task_id=task)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=SymptomsEnv)
