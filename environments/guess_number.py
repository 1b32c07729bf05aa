"""``agentrl/GuessNumber-v0``: find a secret whole number by guessing, told "higher" or
"lower" after each guess. Pure Python, no sandbox.

Why it is here
    It is the smallest multi-turn task in which credit assignment matters and a very small
    model (SmolLM2-135M on a CPU) still gets a learning signal: most of its replies contain
    a number, so even an untrained policy solves some episodes, and a policy that uses the
    feedback (bisection) solves every episode of range ``n`` within ``ceil(log2(n + 1))``
    guesses. TextArena's "GuessTheNumber" is the same game (Guertler et al. 2025,
    arXiv:2504.11442); this one is reimplemented with its own rules below.

Tasks and split
    A task is a seed: ``guess/<seed>``; the secret is drawn from
    ``numpy.random.default_rng(seed)`` uniformly in ``[low, high]``, so it depends on the
    env's ``low`` and ``high``. ``train`` is seeds 0..9999, ``test`` seeds
    1,000,000..1,000,499 (``TRAIN_SEEDS``, ``TEST_SEEDS``); ``all`` both.

Actions
    The guess is the content of the last ``<guess>...</guess>`` tag if the reply has one,
    else the first whole number (optionally signed) in the reply. A reply without a number
    is an invalid action (``info["invalid_action"] = True``); it still uses up one of the
    ``max_guesses`` turns. A number outside ``[low, high]`` is a valid but wasted guess, and
    the feedback states the range.

Reward
    ``1.0`` on the turn the secret is guessed (``terminated``, ``info["success"] = True``),
    else ``0.0``. After ``max_guesses`` turns without it the episode is ``truncated``.

Anchor (GiGPO, Feng et al. 2025, arXiv:2505.10978, §4.2)
    ``(task_id, lo, hi)``: the interval of numbers still consistent with the feedback so
    far, i.e. what an ideal player knows. Two trajectories of one task that narrowed the
    secret down to the same interval are in the same state whatever the path or the turn,
    so GiGPO's step groups compare their next guesses.
"""

from __future__ import annotations

import re
from typing import Any, Hashable

import gymnasium
import numpy as np

from agentrl.errors import ConfigError, EnvError
from environments.humaneval import TextSpace

__all__ = ["ENV_ID", "SPLITS", "TRAIN_SEEDS", "TEST_SEEDS", "parse_guess", "secret_of", "task_ids", "GuessNumberEnv"]

ENV_ID = "agentrl/GuessNumber-v0"
SPLITS = ("train", "test", "all")
TRAIN_SEEDS = range(0, 10_000)
TEST_SEEDS = range(1_000_000, 1_000_500)

_TAG = re.compile(r"<guess>(.*?)</guess>", re.IGNORECASE | re.DOTALL)
_INT = re.compile(r"[-+]?\d+")


def task_ids(split: str = "train") -> list[str]:
    """``guess/<seed>`` for the seeds of ``split``. Raises ConfigError for an unknown split."""
    if split == "train":
        seeds: list[int] = list(TRAIN_SEEDS)
    elif split == "test":
        seeds = list(TEST_SEEDS)
    elif split == "all":
        seeds = list(TRAIN_SEEDS) + list(TEST_SEEDS)
    else:
        raise ConfigError(f"split={split!r} is not one of {SPLITS}")
    return [f"guess/{s}" for s in seeds]


def _seed_of(task_id: Any) -> int:
    m = re.fullmatch(r"guess/(\d+)", task_id) if isinstance(task_id, str) else None
    if m is None:
        raise ConfigError(f"task_id={task_id!r} is not a GuessNumber task; expected 'guess/<seed>', e.g. 'guess/0'")
    return int(m.group(1))


def secret_of(task_id: str, low: int = 1, high: int = 10) -> int:
    """The secret number of ``task_id`` for the range ``[low, high]``.

    Raises:
        ConfigError: a malformed task id.
    """
    return int(np.random.default_rng(_seed_of(task_id)).integers(low, high + 1))


def parse_guess(text: str) -> int | None:
    """The guess in a reply (see the module docstring), or None when it holds no number."""
    tags = _TAG.findall(text)
    src = tags[-1] if tags else text
    m = _INT.search(src)
    if m is None:
        return None
    digits = m.group().lstrip("+-").lstrip("0") or "0"
    if len(digits) > 18:  # a wall of digits is a number, but not one worth an int of that size
        return None
    return int(m.group())


class GuessNumberEnv(gymnasium.Env[str, str]):
    """Guess the secret number; see the module docstring.

    Args:
        sandbox: ignored (accepted so ``make_env(..., sandbox=...)`` works for every env).
        split: the tasks ``reset`` draws from when ``options`` names none.
        low, high: the inclusive range of the secret. Default 1..10.
        max_guesses: turns before the episode is truncated. Default 5.

    Raises:
        ConfigError: an argument is out of range.
    """

    uses_sandbox = False  # runs in-process: the rollout makes it without a sandbox
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, sandbox: Any = None, split: str = "train", low: int = 1, high: int = 10,
                 max_guesses: int = 5, render_mode: str | None = None) -> None:
        task_ids(split)  # validates
        if not (isinstance(low, int) and isinstance(high, int)) or isinstance(low, bool) or isinstance(high, bool):
            raise ConfigError(f"low={low!r}, high={high!r} must be ints")
        if high <= low:
            raise ConfigError(f"high={high} must be greater than low={low}")
        if not isinstance(max_guesses, int) or isinstance(max_guesses, bool) or max_guesses < 1:
            raise ConfigError(f"max_guesses={max_guesses!r} must be an int >= 1")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; expected None or 'ansi'")
        self.split = split
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.render_mode = render_mode
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._split_seeds = TRAIN_SEEDS if split == "train" else TEST_SEEDS if split == "test" else None
        self._task_id: str | None = None
        self._secret: int | None = None
        self._lo, self._hi = low, high
        self._turns = 0
        self._done = False
        self._closed = False
        self._last = ""

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        return task_ids(split)

    @classmethod
    def checker_actions(cls) -> list[str]:
        """For ``check_env``: a tagged guess, a bare one, an out-of-range one, no number."""
        return ["<guess>5</guess>", "I think 3.", "99", "no idea", "7", "2", "9", "1", "4", "6", "8", "10"]

    @property
    def system_prompt(self) -> str:
        return (
            f"You play a guessing game. I have picked a secret whole number from {self.low} to {self.high}. "
            "Each turn, reply with one guess, a single number. I will tell you whether the secret "
            f"number is higher or lower. You have {self.max_guesses} guesses."
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start the game of ``options["task_id"]`` (else a seed drawn from the split).

        Raises:
            EnvError: after ``close``. ConfigError: unknown option or task id.
        """
        if self._closed:
            raise EnvError("GuessNumberEnv.reset() after close(); make a new environment")
        super().reset(seed=seed)
        options = dict(options or {})
        task_id = options.pop("task_id", None)
        if options:
            raise ConfigError(f"unknown reset options {sorted(options)}; expected only 'task_id'")
        if task_id is None:
            seeds = self._split_seeds or TRAIN_SEEDS
            task_id = f"guess/{seeds[int(self.np_random.integers(len(seeds)))]}"
        self._secret = secret_of(task_id, self.low, self.high)
        self._task_id, self._lo, self._hi, self._turns, self._done = task_id, self.low, self.high, 0, False
        s = _seed_of(task_id)
        info = self._info(invalid=False, success=False)
        info.update(system_prompt=self.system_prompt, tools=[],
                    split="test" if s in TEST_SEEDS else "train" if s in TRAIN_SEEDS else None)
        self._last = f"Guess the secret number from {self.low} to {self.high}. Your first guess?"
        return self._last, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One guess; reward as in the module docstring.

        Raises:
            EnvError: no game running, or ``action`` is not a str.
        """
        if self._closed:
            raise EnvError("GuessNumberEnv.step() after close(); make a new environment")
        if self._secret is None:
            raise EnvError("GuessNumberEnv.step() before reset(); call reset() first")
        if self._done:
            raise EnvError(f"GuessNumberEnv.step() after the game on {self._task_id} ended; call reset()")
        if not isinstance(action, str):
            raise EnvError(f"action must be the completion text (str), got {type(action).__name__}")
        self._turns += 1
        guess = parse_guess(action)
        success = False
        if guess is None:
            feedback = f"No number in your reply. Reply with one whole number from {self.low} to {self.high}."
        elif not self.low <= guess <= self.high:
            feedback = f"{guess} is outside the range; the secret number is from {self.low} to {self.high}."
        elif guess == self._secret:
            feedback, success = f"{guess} is correct!", True
        elif guess < self._secret:
            self._lo = max(self._lo, guess + 1)
            feedback = f"{guess} is too low: the secret number is higher than {guess}."
        else:
            self._hi = min(self._hi, guess - 1)
            feedback = f"{guess} is too high: the secret number is lower than {guess}."
        terminated = success
        truncated = not terminated and self._turns >= self.max_guesses
        if truncated:
            feedback += f" Out of guesses ({self.max_guesses}); the secret number was {self._secret}."
        elif not terminated:
            feedback += " Your next guess?"
        self._done = terminated or truncated
        self._last = feedback
        return feedback, 1.0 if success else 0.0, terminated, truncated, self._info(invalid=guess is None, success=success)

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Nothing to release; idempotent."""
        self._closed = True
        self._done = True

    def _info(self, *, invalid: bool, success: bool) -> dict[str, Any]:
        assert self._task_id is not None
        anchor: Hashable = (self._task_id, self._lo, self._hi)
        return {"task_id": self._task_id, "anchor": anchor, "invalid_action": invalid, "observation_role": "user",
                "guesses": self._turns, "interval": (self._lo, self._hi), "success": success}
