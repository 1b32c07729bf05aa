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
    The guess is the first number (optionally signed, ASCII digits only) in the content of
    the last ``<guess>...</guess>`` tag if the reply has one, else in the whole reply. A reply without a number
    is an invalid action (``info["invalid_action"] = True``); it still uses up one of the
    ``max_guesses`` turns. A number outside ``[low, high]`` is a valid but wasted guess, and
    the feedback states the range.

Reward
    ``1.0`` on the turn the secret is guessed (``terminated``, ``info["success"] = True``),
    else ``0.0``. After ``max_guesses`` turns without it the game is lost: ``terminated``
    with ``info["success"] = False`` (the limit is a rule of the game, stated in the prompt,
    not a cut-off; ``truncated`` is never set, the agent loop's own ``max_turns`` aside).

Anchor (GiGPO, Feng et al. 2025, arXiv:2505.10978, §4.2)
    ``(task_id, lo, hi)``: the interval of numbers still consistent with the feedback so
    far, i.e. what an ideal player knows. Two trajectories of one task that narrowed the
    secret down to the same interval share an anchor whatever the path or the turn, so
    GiGPO's step groups compare their next guesses. The guesses left are deliberately not
    part of it (as Sokoban's anchor leaves out the moves left, and the paper's anchors are
    the observations): the same interval with fewer guesses left is worth less, so this
    anchor is an approximation of the full state that trades exactness for larger groups.
"""

from __future__ import annotations

import re
from typing import Any, Hashable

import numpy as np

from agentrl.errors import ConfigError
from agentrl.types import StepInfo
from environments.core import TextEnv
from environments.seeded import SPLITS, SeededTasks, last_tag_content

__all__ = ["ENV_ID", "SPLITS", "TRAIN_SEEDS", "TEST_SEEDS", "TASKS", "GUESS_CLAMP", "parse_guess", "secret_of", "task_ids",
           "GuessNumberEnv"]

ENV_ID = "agentrl/GuessNumber-v0"
TRAIN_SEEDS = range(0, 10_000)
TEST_SEEDS = range(1_000_000, 1_000_500)
TASKS = SeededTasks("guess", "GuessNumber", TRAIN_SEEDS, TEST_SEEDS)
"""The task ids of this env and their seeds (``environments.seeded``)."""
MAX_ABS_BOUND = 2**62
"""``|low|`` and ``|high|`` must stay below this (numpy draws the secret as int64)."""
GUESS_CLAMP = 10**18
"""A guess longer than 18 digits reads as ``+-10**18``: out of any allowed range either way."""

_INT = re.compile(r"[-+]?[0-9]+", re.ASCII)


def task_ids(split: str = "train") -> list[str]:
    """``guess/<seed>`` for the seeds of ``split``. Raises ConfigError for an unknown split."""
    return TASKS.task_ids(split)


def secret_of(task_id: str, low: int = 1, high: int = 10) -> int:
    """The secret number of ``task_id`` for the range ``[low, high]``.

    Raises:
        ConfigError: a malformed task id.
    """
    return int(np.random.default_rng(TASKS.seed_of(task_id)).integers(low, high + 1))


def parse_guess(text: str) -> int | None:
    """The guess in a reply, or None when it holds no number (see the module docstring).

    Only ASCII digits count; the first run of them is the number, so ``"3.5"`` reads as 3
    and ``"1e5"`` as 1. A number of more than 18 digits (after leading zeros) reads as
    ``+-GUESS_CLAMP``, a valid guess outside any allowed range, never an error.
    """
    tagged = last_tag_content(text, "guess")
    m = _INT.search(tagged if tagged is not None else text)
    if m is None:
        return None
    raw = m.group()
    sign = -1 if raw[0] == "-" else 1
    digits = raw.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 18:
        return sign * GUESS_CLAMP
    return sign * int(digits)


def _shown(guess: int) -> str:
    return str(guess) if abs(guess) < GUESS_CLAMP else ("-" if guess < 0 else "") + "a number of more than 18 digits"


class GuessNumberEnv(TextEnv):
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
        super().__init__()
        self._split_seeds = TASKS.seeds(split)  # validates the split
        if not (isinstance(low, int) and isinstance(high, int)) or isinstance(low, bool) or isinstance(high, bool):
            raise ConfigError(f"low={low!r}, high={high!r} must be ints")
        if not (-MAX_ABS_BOUND < low < MAX_ABS_BOUND and -MAX_ABS_BOUND < high < MAX_ABS_BOUND):
            raise ConfigError(f"low={low}, high={high} must each lie strictly between -2**62 and 2**62")
        if high <= low:
            raise ConfigError(f"high={high} must be greater than low={low}")
        if not isinstance(max_guesses, int) or isinstance(max_guesses, bool) or max_guesses < 1:
            raise ConfigError(f"max_guesses={max_guesses!r} must be an int >= 1")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; expected None or 'ansi'")
        self.split = split
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.render_mode = render_mode
        self._secret: int | None = None
        self._lo, self._hi = low, high
        self._turns = 0
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
        task_id = TASKS.task_for_reset(self._start_reset(seed, options), self.np_random, self._split_seeds)
        self._secret = secret_of(task_id, self.low, self.high)
        self._task_id, self._lo, self._hi, self._turns, self._done = task_id, self.low, self.high, 0, False
        info = self._info(invalid=False, success=False, system_prompt=self.system_prompt, tools=())
        info["split"] = TASKS.split_of(task_id)
        self._last = f"Guess the secret number from {self.low} to {self.high}. Your first guess?"
        return self._last, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One guess; reward as in the module docstring.

        Raises:
            EnvError: no game running, or ``action`` is not a str.
        """
        self._check_step(action)
        self._turns += 1
        guess = parse_guess(action)
        success = False
        if guess is None:
            feedback = f"No number in your reply. Reply with one whole number from {self.low} to {self.high}."
        elif not self.low <= guess <= self.high:
            feedback = f"{_shown(guess)} is outside the range; the secret number is from {self.low} to {self.high}."
        elif guess == self._secret:
            feedback, success = f"{guess} is correct!", True
        elif guess < self._secret:
            self._lo = max(self._lo, guess + 1)
            feedback = f"{guess} is too low: the secret number is higher than {guess}."
        else:
            self._hi = min(self._hi, guess - 1)
            feedback = f"{guess} is too high: the secret number is lower than {guess}."
        out_of_guesses = not success and self._turns >= self.max_guesses
        if out_of_guesses:
            feedback += f" Out of guesses ({self.max_guesses}); the secret number was {self._secret}."
        elif not success:
            feedback += " Your next guess?"
        # The guess limit is a rule of the game (the prompt states it, the last feedback
        # reveals the secret): the game is over, not cut off, so it terminates either way.
        terminated, truncated = success or out_of_guesses, False
        self._done = terminated
        self._last = feedback
        return feedback, 1.0 if success else 0.0, terminated, truncated, self._info(invalid=guess is None, success=success)

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Nothing to release; idempotent."""
        super().close()

    def _info(self, *, invalid: bool, success: bool, **step_info: Any) -> dict[str, Any]:
        assert self._task_id is not None
        anchor: Hashable = (self._task_id, self._lo, self._hi)
        return StepInfo(anchor=anchor, invalid_action=invalid, success=success, **step_info).to_info(
            task_id=self._task_id, guesses=self._turns, interval=(self._lo, self._hi))
