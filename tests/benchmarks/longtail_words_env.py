"""``bench/LongTailWords-v0``: a text task whose reward even the 2-layer random model
(``tiny-random-smollm2``) climbs within a benchmark's updates, with the long-tailed step
latency of ``bench/LongTailGuess-v0`` (``tests/benchmarks/bench_async.py --env words``;
bench-only: registered when this module is imported, through ``env.import_modules``).

Why
    The learning-curve half of the async benchmark (bench_async.py) needs a reward that moves: the tiny model
    never finds GuessNumber's secret (reward 0 in both modes, nothing to compare), and
    SmolLM2 training does not fit beside the other jobs on this machine. Here every reply
    earns a graded score, so GRPO has a signal from the first update.

Game
    ``max_turns`` turns (default 5, the same number of steps as ``LongTailGuess``). Each turn
    the agent is asked for plain lowercase English words separated by spaces. Its reply is
    split on whitespace; the turn's *share* is the fraction of those words that are ASCII
    lowercase letters only (``^[a-z]+$``; no reply or no word: 0). The step's reward is the
    share, in [0, 1]; ``info["success"]`` is True when it is at least ``success_share``
    (default 0.8). The feedback names the count (``"7 of 10 words were plain lowercase
    words."``). After ``max_turns`` turns the episode terminates. A reply cut by
    ``rollout.max_new_tokens`` ends the episode in the agent loop (truncated, still scored),
    which is every reply of the random model (it never samples EOS within 32 tokens), so with
    it an episode is one scored turn, like its GuessNumber episodes. The random model starts
    near 0.3-0.4 (its tokens are drawn almost uniformly from SmolLM2's vocabulary, where many
    are capitalised, punctuation, or not ASCII) and climbs by preferring the large class of
    lowercase word tokens.

    With ``max_turns > 1`` a reply that stops before ``max_new_tokens`` lets the episode go
    on and earn more, so a learning policy also learns to stop early and take more turns
    (``bench_async.py --tiny-semantic``: reward_mean 1.5 at update 7); the work per episode
    then changes as the policy learns, which muddles a throughput comparison, so the
    benchmark's learning-curve runs use ``--max-guesses 1`` (one turn, one step per episode).

Latency
    Each ``step`` first sleeps ``longtail_env.step_latency_s(task_id, seed, step)`` (0.2 s,
    or 5 s one step in ten, deterministic per task instance and step: every member of a
    group pays the same, as in ``LongTailGuess``); ``reset`` does not sleep.

Tasks
    ``words/<seed>``, train seeds 0..9999, test 1,000,000..1,000,499 (the seed only keys the
    latency draw: every task asks the same).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

import gymnasium

from agentrl.errors import ConfigError
from agentrl.types import StepInfo
from environments.core import TextEnv
from environments.seeded import SeededTasks
from longtail_env import DEFAULT_FAST_STEP_S, DEFAULT_SLOW_PROB, DEFAULT_SLOW_STEP_S, check_latency_profile, step_latency_s

__all__ = ["ENV_ID", "TASKS", "word_share", "LongTailWordsEnv"]

ENV_ID = "bench/LongTailWords-v0"
TASKS = SeededTasks("words", "LongTailWords", range(0, 10_000), range(1_000_000, 1_000_500))
_WORD = re.compile(r"[a-z]+", re.ASCII)


def word_share(reply: str) -> tuple[int, int]:
    """``(plain, words)``: of the whitespace-separated words of ``reply``, how many are ASCII
    lowercase letters only, and how many there are."""
    words = reply.split()
    return sum(1 for w in words if _WORD.fullmatch(w)), len(words)


class LongTailWordsEnv(TextEnv):
    """See the module docstring.

    Args:
        sandbox: ignored (the game runs in-process).
        split: the tasks ``reset`` draws from when ``options`` names none.
        max_turns: turns per episode (``>= 1``).
        success_share: the share at which a turn counts as a success, in [0, 1].
        fast_step_s, slow_step_s, slow_prob, latency_seed: the latency profile
            (``longtail_env``).
        sleep: what waits (``time.sleep``; tests pass a recorder).

    Raises:
        ConfigError: an argument out of range (the message names it).
    """

    uses_sandbox = False
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, sandbox: Any = None, split: str = "train", max_turns: int = 5, success_share: float = 0.8,
                 fast_step_s: float = DEFAULT_FAST_STEP_S, slow_step_s: float = DEFAULT_SLOW_STEP_S,
                 slow_prob: float = DEFAULT_SLOW_PROB, latency_seed: int = 0, render_mode: str | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self._split_seeds = TASKS.seeds(split)
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise ConfigError(f"max_turns={max_turns!r} must be an int >= 1")
        if not isinstance(success_share, (int, float)) or not 0.0 <= success_share <= 1.0:
            raise ConfigError(f"success_share={success_share!r} must be in [0, 1]")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; expected None or 'ansi'")
        check_latency_profile(fast_step_s, slow_step_s, slow_prob)
        self.max_turns, self.success_share = max_turns, float(success_share)
        self.profile = {"fast_step_s": float(fast_step_s), "slow_step_s": float(slow_step_s),
                        "slow_prob": float(slow_prob), "latency_seed": int(latency_seed)}
        self.render_mode = render_mode
        self._sleep = sleep
        self._seed: int | None = None
        self._turns = 0
        self._last = ""

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        return TASKS.task_ids(split)

    @classmethod
    def checker_actions(cls) -> list[str]:
        return ["the cat sat on a mat", "Hello, World!", "", "один два", "a b c", "ok"]

    @property
    def system_prompt(self) -> str:
        return ("Each turn, reply with plain lowercase English words separated by spaces: no capitals, digits "
                f"or punctuation. You have {self.max_turns} turns.")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        task_id = TASKS.task_for_reset(self._start_reset(seed, options), self.np_random, self._split_seeds)
        self._task_id, self._seed, self._turns, self._done = task_id, seed, 0, False
        self._last = "Write some plain lowercase words."
        info = self._info(success=False, system_prompt=self.system_prompt, tools=())
        info["split"] = TASKS.split_of(task_id)
        return self._last, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Wait the step's latency, then score ``action`` (module docstring).

        Raises:
            EnvError: no episode running, or ``action`` is not a str.
        """
        self._check_step(action)
        assert self._task_id is not None
        latency = step_latency_s(self._task_id, self._seed, self._turns, **self.profile)
        if latency > 0:
            self._sleep(latency)
        self._turns += 1
        plain, words = word_share(action)
        share = plain / words if words else 0.0
        terminated = self._turns >= self.max_turns
        success = share >= self.success_share
        self._last = f"{plain} of {words} words were plain lowercase words." + ("" if terminated else " More, please.")
        self._done = terminated
        info = self._info(success=success)
        info.update(step_latency_s=latency, share=share)
        return self._last, share, terminated, False, info

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def _info(self, *, success: bool, **step_info: Any) -> dict[str, Any]:
        assert self._task_id is not None
        return StepInfo(anchor=(self._task_id, self._turns), invalid_action=False, success=success,
                        **step_info).to_info(task_id=self._task_id, turn=self._turns)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=LongTailWordsEnv)
