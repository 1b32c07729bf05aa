"""What every text environment of agentrl shares: the text space, clipping of long output,
and ``TextEnv``, the one base class (one level below ``gymnasium.Env``) that owns the
lifecycle guards and the reset-option parsing.

``TextEnv`` gives a subclass:

- ``observation_space`` / ``action_space``: ``TextSpace()`` (any ``str``);
- ``uses_sandbox`` (class attribute, default True: the rollout makes the env with a
  sandbox; in-process envs set it False);
- ``checker_actions()``: generic replies for ``environments.checker.check_env`` (override
  with actions that end an episode);
- ``_start_reset(seed, options)``: raises after ``close``, seeds ``np_random``, parses
  ``options`` (only ``task_id`` is allowed) and returns the requested task id or None;
- ``_draw(choices)``: one element drawn with ``np_random``;
- ``_check_step(action)``: the guards every ``step`` starts with (closed, before reset,
  after the episode ended, non-str action);
- ``close()``: marks the env closed and the episode done (idempotent);
- ``spec``: Gymnasium's ``EnvSpec``, whose make kwargs share the injected ``sandbox``
  when deep-copied (see ``SandboxSharingKwargs``), so ``env.spec.make()`` (what
  Gymnasium's own ``check_env`` does in its close and render checks) makes a second env
  on the same caller-owned sandbox instead of failing to copy a live one.

Episode state the guards read lives on the instance: ``_task_id`` (None before the first
``reset``), ``_done``, ``_closed``. Subclasses set ``_task_id`` and clear ``_done`` in
``reset``, and set ``_done`` when an episode ends.
"""

from __future__ import annotations

import copy
import string
from typing import Any, Callable, ClassVar, Mapping, Sequence, TypeVar

import gymnasium
import numpy as np

from agentrl.errors import ConfigError, EnvError

__all__ = ["TextSpace", "TextEnv", "SandboxSharingKwargs", "clip_text", "reset_task_id", "invalid_reply_step",
           "DEFAULT_CHECKER_ACTIONS"]

DEFAULT_CHECKER_ACTIONS = ("Hello.", "I am done.")
"""What ``TextEnv.checker_actions()`` returns unless a subclass overrides it."""

T = TypeVar("T")


class TextSpace(gymnasium.spaces.Space[str]):
    """Any Python ``str`` of at most ``max_length`` characters (Unicode included).

    Gymnasium's ``Text`` space only admits a fixed character set; LLM text needs all of
    Unicode. ``sample()`` draws printable ASCII.

    Raises:
        ConfigError: ``max_length < 0``.
    """

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None) -> None:
        if max_length < 0:
            raise ConfigError(f"max_length={max_length} must be >= 0")
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        alphabet = string.printable
        return "".join(alphabet[i] for i in self.np_random.integers(0, len(alphabet), size=n))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to at most about ``limit`` characters: the first two thirds and the last
    third of ``limit`` with a marker line between them that says how many were dropped."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters dropped ...]\n{text[len(text) - tail:]}"


def reset_task_id(options: Mapping[str, Any] | None) -> Any:
    """The task a ``reset(options=...)`` asks for: ``options["task_id"]``, or None when the
    options name none (the env then draws one). The id itself is not validated here.

    Raises:
        ConfigError: an option other than ``task_id``.
    """
    rest = dict(options or {})
    task_id = rest.pop("task_id", None)
    if rest:
        raise ConfigError(f"unknown reset options {sorted(rest)}; expected only 'task_id'")
    return task_id


StepTuple = tuple[str, float, bool, bool, dict[str, Any]]


def invalid_reply_step(message: str, invalid_so_far: int, max_invalid: int, finish: Callable[[str], StepTuple],
                       info: Callable[[], dict[str, Any]]) -> StepTuple:
    """The step after an invalid reply under a budget of ``max_invalid`` of them: the
    ``invalid_so_far``-th (counting this one) beyond the budget ends the episode through
    ``finish(prefix)`` (the env's own end, truncated, with ``message`` and the reason first);
    otherwise the observation is ``message`` and how many invalid replies are left, reward 0,
    and ``info()`` (the env's step info with ``invalid_action``). Both carry
    ``info["error"] = message`` and ``info["invalid_action"] = True``."""
    if invalid_so_far > max_invalid:
        obs, reward, term, trunc, end_info = finish(f"{message}\nToo many invalid replies; the task is over.")
        end_info.update(invalid_action=True, error=message)
        return obs, reward, term, trunc, end_info
    step_info = info()
    step_info.update(invalid_action=True, error=message)
    left = max_invalid - invalid_so_far
    return f"{message}\n(Invalid replies left before the task ends: {left}.)", 0.0, False, False, step_info


class SandboxSharingKwargs(dict):
    """The make kwargs of a ``TextEnv``'s ``EnvSpec``. A deep copy (``gymnasium.make``
    copies a spec's kwargs before calling the constructor) copies every value except
    ``sandbox``, which it shares: the sandbox is a handle to a live resource that the
    caller owns (processes, a container), not state of the env, and cannot be copied."""

    def __deepcopy__(self, memo: dict[int, Any]) -> "SandboxSharingKwargs":
        return SandboxSharingKwargs(
            {k: v if k == "sandbox" else copy.deepcopy(v, memo) for k, v in self.items()}
        )


class TextEnv(gymnasium.Env[str, str]):
    """Base of agentrl's text environments (see the module docstring for what it gives).

    Subclasses call ``super().__init__()`` first in their constructor.
    """

    uses_sandbox: ClassVar[bool] = True
    """False: the env runs in-process and the rollout makes it without a sandbox."""
    metadata: dict[str, Any] = {"render_modes": []}

    _spec: Any = None

    @property
    def spec(self) -> Any:  # gymnasium.envs.registration.EnvSpec | None
        """The ``EnvSpec`` ``gymnasium.make`` gave this env (None when made directly); its
        ``kwargs`` is a ``SandboxSharingKwargs``."""
        return self._spec

    @spec.setter
    def spec(self, value: Any) -> None:
        if value is not None and not isinstance(value.kwargs, SandboxSharingKwargs):
            value = copy.copy(value)
            value.kwargs = SandboxSharingKwargs(value.kwargs)
        self._spec = value

    def __init__(self) -> None:
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._task_id: str | None = None
        self._done = False
        self._closed = False

    @classmethod
    def checker_actions(cls) -> list[str]:
        """Scripted completions for ``environments.checker.check_env`` (override with ones
        that end an episode, so the step-after-done check runs)."""
        return list(DEFAULT_CHECKER_ACTIONS)

    def _start_reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Any:
        """The start of every ``reset``: refuse after ``close``, seed ``np_random``, parse
        ``options``.

        Returns:
            ``options["task_id"]`` (not validated), or None when no task was named.

        Raises:
            EnvError: the env is closed.
            ConfigError: an option other than ``task_id``.
        """
        if self._closed:
            raise EnvError(f"{type(self).__name__}.reset() after close(); make a new environment")
        gymnasium.Env.reset(self, seed=seed)
        return reset_task_id(options)

    def _draw(self, choices: Sequence[T]) -> T:
        """One of ``choices``, drawn uniformly with ``self.np_random``."""
        return choices[int(self.np_random.integers(len(choices)))]

    def _check_step(self, action: Any) -> None:
        """The guards every ``step`` starts with.

        Raises:
            EnvError: after ``close``, before ``reset``, after the episode ended, or a
                non-str action.
        """
        name = type(self).__name__
        if self._closed:
            raise EnvError(f"{name}.step() after close(); make a new environment")
        if self._task_id is None:
            raise EnvError(f"{name}.step() before reset(); call reset() first")
        if self._done:
            raise EnvError(f"{name}.step() after the episode on {self._task_id} ended; call reset()")
        if not isinstance(action, str):
            raise EnvError(f"action must be the completion text (str), got {type(action).__name__}")

    def close(self) -> None:
        """End the environment: later ``reset``/``step`` calls raise ``EnvError``.
        Idempotent. Subclasses that hold resources release them, then call this."""
        self._closed = True
        self._done = True
