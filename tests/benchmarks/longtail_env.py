"""``bench/LongTailGuess-v0``: ``agentrl/GuessNumber-v0`` whose steps take long-tailed time, for
``tests/benchmarks/bench_async.py`` (bench-only: registered when this module is imported,
through ``env.import_modules=[longtail_env]`` in every Ray actor, as ``examples/custom_env.py``
does).

Why
    Real agentic steps (a test suite, a tool call) mostly take a fraction of a second and
    sometimes several seconds. In a synchronous round the rollout then waits for its slowest
    episode while the trainer idles, which asynchronous training removes. The game itself is GuessNumber unchanged
    (same tasks, prompts, feedback, rewards, anchors: a task SmolLM2-135M gets a learning
    signal on), so the learning curves of a synchronous and an asynchronous run compare like
    for like; only the wall time of each ``step`` differs.

Latency profile (env kwargs, all in seconds except the probability)
    Each ``step`` first sleeps ``slow_step_s`` with probability ``slow_prob``, else
    ``fast_step_s`` (defaults 0.2 s, and 5 s one step in ten). The draw is deterministic:
    a hash of ``(latency_seed, task_id, reset seed, step index)`` (``step_latency_s``), so a
    task instance's steps cost the same in every run, in sync and async mode, and in a
    restarted episode; all rollouts of one group (same task id and seed) share it, as the
    same test suite costs the same for every attempt. ``reset`` does not sleep. The latency
    of each step is in ``info["step_latency_s"]``.

Everything else (tasks, splits, ``low`` / ``high`` / ``max_guesses``, errors) is
``environments.guess_number``'s.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Callable

import gymnasium

from agentrl.errors import ConfigError, EnvError
from environments.core import TextSpace
from environments.guess_number import GuessNumberEnv
from environments.guess_number import task_ids as guess_task_ids

__all__ = ["ENV_ID", "DEFAULT_FAST_STEP_S", "DEFAULT_SLOW_STEP_S", "DEFAULT_SLOW_PROB", "step_latency_s",
           "check_latency_profile", "LongTailGuessEnv"]

ENV_ID = "bench/LongTailGuess-v0"
DEFAULT_FAST_STEP_S = 0.2
DEFAULT_SLOW_STEP_S = 5.0
DEFAULT_SLOW_PROB = 0.1


def check_latency_profile(fast_step_s: float, slow_step_s: float, slow_prob: float) -> None:
    """Raise ``ConfigError`` naming the value unless ``0 <= fast_step_s``, ``0 <= slow_step_s``
    (both finite, seconds) and ``0 <= slow_prob <= 1``."""
    for name, v in (("fast_step_s", fast_step_s), ("slow_step_s", slow_step_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"{name}={v!r} must be a finite number of seconds >= 0")
    if isinstance(slow_prob, bool) or not isinstance(slow_prob, (int, float)) or not 0.0 <= slow_prob <= 1.0:
        raise ConfigError(f"slow_prob={slow_prob!r} must be a probability in [0, 1]")


def step_latency_s(task_id: str, seed: int | None, step: int, *, fast_step_s: float = DEFAULT_FAST_STEP_S,
                   slow_step_s: float = DEFAULT_SLOW_STEP_S, slow_prob: float = DEFAULT_SLOW_PROB,
                   latency_seed: int = 0) -> float:
    """Seconds that step ``step`` (0-based) of the episode of ``task_id`` reset with ``seed``
    takes: ``slow_step_s`` when a uniform draw in [0, 1) from BLAKE2b of
    ``(latency_seed, task_id, seed, step)`` is below ``slow_prob``, else ``fast_step_s``.
    Pure and deterministic (the same in every process: no Python ``hash``)."""
    digest = hashlib.blake2b(f"{latency_seed}|{task_id}|{seed}|{step}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "little") / 2.0**64
    return float(slow_step_s if u < slow_prob else fast_step_s)


class LongTailGuessEnv(gymnasium.Env):
    """GuessNumber with a long-tailed latency per step; see the module docstring.

    Args:
        sandbox: ignored (the game runs in-process).
        split, low, high, max_guesses: ``GuessNumberEnv``'s.
        fast_step_s, slow_step_s, slow_prob, latency_seed: the latency profile.
        sleep: what waits (``time.sleep``; tests pass a recorder).

    Raises:
        ConfigError: a latency setting out of range, or GuessNumberEnv's own errors.
    """

    uses_sandbox = False
    metadata = {"render_modes": ["ansi"]}
    observation_space = TextSpace()
    action_space = TextSpace()

    def __init__(self, sandbox: Any = None, split: str = "train", low: int = 1, high: int = 10, max_guesses: int = 5,
                 fast_step_s: float = DEFAULT_FAST_STEP_S, slow_step_s: float = DEFAULT_SLOW_STEP_S,
                 slow_prob: float = DEFAULT_SLOW_PROB, latency_seed: int = 0, render_mode: str | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        check_latency_profile(fast_step_s, slow_step_s, slow_prob)
        self._game = GuessNumberEnv(split=split, low=low, high=high, max_guesses=max_guesses, render_mode=render_mode)
        self.render_mode = render_mode
        self.profile = {"fast_step_s": float(fast_step_s), "slow_step_s": float(slow_step_s),
                        "slow_prob": float(slow_prob), "latency_seed": int(latency_seed)}
        self._sleep = sleep
        self._task_id: str | None = None
        self._seed: int | None = None
        self._step = 0

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        return guess_task_ids(split)

    @classmethod
    def checker_actions(cls) -> list[str]:
        return GuessNumberEnv.checker_actions()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = self._game.reset(seed=seed, options=options)
        self._task_id, self._seed, self._step = info["task_id"], seed, 0
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Wait the step's latency, then play ``action`` (GuessNumber's ``step``).

        Raises:
            EnvError: before ``reset`` (and GuessNumber's own step errors).
        """
        if self._task_id is None:
            raise EnvError(f"{ENV_ID}: step() before reset()")
        latency = step_latency_s(self._task_id, self._seed, self._step, **self.profile)
        self._step += 1
        if latency > 0:
            self._sleep(latency)
        obs, reward, terminated, truncated, info = self._game.step(action)
        info["step_latency_s"] = latency
        return obs, reward, terminated, truncated, info

    def render(self) -> str | None:
        return self._game.render()

    def close(self) -> None:
        self._game.close()


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=LongTailGuessEnv)
