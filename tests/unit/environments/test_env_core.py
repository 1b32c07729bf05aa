"""What every built-in environment shares (environments/core.py): the text space, clipping,
the reset-option parsing and step guards of ``TextEnv``, and the spec kwargs that share the
caller's sandbox when Gymnasium deep-copies them."""

from __future__ import annotations

import copy
import threading

import gymnasium
import pytest

from agentrl.errors import ConfigError, EnvError
from environments import registry
from environments.core import DEFAULT_CHECKER_ACTIONS, SandboxSharingKwargs, TextEnv, TextSpace, clip_text, reset_task_id


def test_text_space_accepts_any_unicode_string():
    space = TextSpace(max_length=10)
    assert space.contains("héllo ✓\n")
    assert not space.contains("x" * 11) and not space.contains(b"bytes")
    space.seed(0)
    sample = space.sample()
    assert isinstance(sample, str) and space.contains(sample)
    assert TextSpace(10) == space and TextSpace(11) != space
    with pytest.raises(ConfigError, match="max_length=-1"):
        TextSpace(-1)


def test_clip_text_keeps_head_and_tail_and_counts_what_it_dropped():
    assert clip_text("short", 10) == "short"
    text = "a" * 50 + "b" * 50
    out = clip_text(text, 30)
    assert out == "a" * 20 + "\n[... 70 characters dropped ...]\n" + "b" * 10


def test_reset_task_id_allows_only_task_id():
    assert reset_task_id(None) is None and reset_task_id({}) is None
    assert reset_task_id({"task_id": "t/1"}) == "t/1"
    with pytest.raises(ConfigError, match=r"unknown reset options \['level'\]; expected only 'task_id'"):
        reset_task_id({"task_id": "t/1", "level": 3})


class Counter(TextEnv):
    """A two-step env on tasks c/0..c/9, built only from what TextEnv gives."""

    uses_sandbox = False

    def reset(self, *, seed=None, options=None):
        task_id = self._start_reset(seed, options)
        self._task_id = task_id if task_id is not None else self._draw([f"c/{i}" for i in range(10)])
        self._done, self.n = False, 0
        return self._task_id, {"anchor": (self._task_id, 0)}

    def step(self, action):
        self._check_step(action)
        self.n += 1
        self._done = self.n >= 2
        return action, 0.0, self._done, False, {"anchor": (self._task_id, self.n)}


def test_text_env_guards_name_the_class_and_the_fix():
    env = Counter()
    assert isinstance(env.observation_space, TextSpace) and isinstance(env.action_space, TextSpace)
    assert Counter.checker_actions() == list(DEFAULT_CHECKER_ACTIONS) and TextEnv.uses_sandbox is True
    with pytest.raises(EnvError, match=r"Counter.step\(\) before reset\(\); call reset\(\) first"):
        env.step("x")
    obs, _ = env.reset(seed=3)
    assert obs == Counter().reset(seed=3)[0]  # drawn with np_random from the seed
    assert env.reset(options={"task_id": "c/7"})[0] == "c/7"
    with pytest.raises(EnvError, match=r"action must be the completion text \(str\), got int"):
        env.step(5)
    env.step("a")
    env.step("b")
    with pytest.raises(EnvError, match=r"after the episode on c/7 ended; call reset\(\)"):
        env.step("c")
    with pytest.raises(ConfigError, match="unknown reset options"):
        env.reset(options={"seed": 1})
    env.close()
    env.close()  # idempotent
    with pytest.raises(EnvError, match=r"Counter.step\(\) after close\(\); make a new environment"):
        env.step("x")
    with pytest.raises(EnvError, match=r"Counter.reset\(\) after close\(\)"):
        env.reset()


class Handle:
    """Stands for a live sandbox: it holds a lock, so it cannot be copied."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


class NeedsHandle(Counter):
    def __init__(self, sandbox=None, level=None):
        super().__init__()
        self.sandbox, self.level = sandbox, level


def test_spec_kwargs_share_the_sandbox_and_copy_the_rest():
    handle, level = Handle(), {"depth": [1, 2]}
    with pytest.raises(TypeError):
        copy.deepcopy({"sandbox": handle})  # what gymnasium.make would do without the wrapper
    kwargs = SandboxSharingKwargs(sandbox=handle, level=level)
    copied = copy.deepcopy(kwargs)
    assert isinstance(copied, SandboxSharingKwargs)
    assert copied["sandbox"] is handle and copied["level"] == level and copied["level"] is not level

    env_id = "coretest/NeedsHandle-v0"
    gymnasium.register(id=env_id, entry_point=NeedsHandle)
    try:
        env = gymnasium.make(env_id, sandbox=handle, level=level)
        assert isinstance(env.unwrapped.spec.kwargs, SandboxSharingKwargs)
        again = env.spec.make()  # Gymnasium's check_env does this in its close check
        assert again.unwrapped.sandbox is handle and again.unwrapped.level == level
        again.close()
        env.close()
    finally:
        gymnasium.registry.pop(env_id, None)
    assert registry.registered_env_ids()  # the built-ins are untouched
