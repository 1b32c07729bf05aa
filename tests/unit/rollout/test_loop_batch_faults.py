"""One episode's fault never fails its rollout batch (agentrl/rollout/loop.py): a bad
``info`` (parsed by ``StepInfo.from_info``) or an exception while building an episode's next
prompt ends that episode alone as ``infra_error`` with the message; the others finish.

The tokenizer and engine here are minimal stand-ins (no model): a character-level
"chat template" and an engine that answers every request with ``(5, 6, stop)``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.engine import Completion
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord, TerminationReason

STOP = 2


class CharTemplateTokenizer:
    """Renders ``<role>content</s>``; one id per character; raises RuntimeError on a
    message containing ``"boom"`` (a template fault for that episode only)."""

    chat_template = "char"

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False, tools=None):
        if any("boom" in m["content"] for m in msgs):
            raise RuntimeError("template exploded on 'boom'")
        text = "".join(f"<{m['role']}>{m['content']}</s>" for m in msgs)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 200 + 3 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "</s>" if list(ids) == [STOP] else "".join(chr(65 + i % 26) for i in ids)


class AnswerEverything:
    def __init__(self):
        self.queued = []

    def add(self, request_id, prompt_ids, **kw):
        self.queued.append(request_id)

    def has_unfinished(self):
        return bool(self.queued)

    def step(self):
        out = [Completion(r, (5, 6, STOP), (-0.1, -0.1, -0.1), "stop", STOP) for r in self.queued]
        self.queued = []
        return out

    def abort(self, ids):
        self.queued = [r for r in self.queued if r not in ids]


class ScriptedEnv(gym.Env):
    """Reset gives ``reset_obs``/``reset_info``; each step gives ``step_obs``/``step_info``
    with reward 1 and ends the episode at step ``steps``."""

    def __init__(self, reset_info=None, step_info=None, reset_obs="task", step_obs="obs", steps=1):
        self.reset_info, self.step_info = reset_info or {}, step_info or {}
        self.reset_obs, self.step_obs, self.steps, self.t = reset_obs, step_obs, steps, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.reset_obs, dict(self.reset_info)

    def step(self, action):
        self.t += 1
        return self.step_obs, 1.0, self.t >= self.steps, False, dict(self.step_info)


def run_batch(first_env, n=2):
    """Episode 0 runs ``first_env``; the others a healthy two-step env."""
    chat = ChatTokenizer(CharTemplateTokenizer(), (STOP,))
    factory = lambda req: (first_env if req.index == 0 else ScriptedEnv(steps=2), None)  # noqa: E731
    worker = RolloutWorker(AnswerEverything(), chat, factory,
                           RolloutLimits(max_turns=3, max_new_tokens=8, max_context_tokens=4096), SamplingRecord())
    return worker.run([EpisodeRequest("x/E-v0", "t", 0, "g", 1, index=i) for i in range(n)], 0)


def assert_only_the_first_failed(episodes, message):
    first, *rest = episodes
    assert first.termination_reason == TerminationReason.INFRA_ERROR
    assert message in first.error["message"], first.error
    for ep in rest:
        assert ep.termination_reason == TerminationReason.ENV_TERMINATED and ep.error is None
        assert len(ep.turns) == 2


@pytest.mark.parametrize("tools, expected", [
    ([{"type": "function"}], "has no function name"),
    ([{"function": {"name": "x", "parameters": "oops"}}], "has parameters of type str, not a dict"),
    ([{"function": {"name": "x", "parameters": {"properties": {"a": 1}}}}], "property 'a' whose schema is a int"),
])
def test_a_bad_tool_schema_at_reset_fails_that_episode_alone_naming_the_env(tools, expected):
    episodes = run_batch(ScriptedEnv(reset_info={"tools": tools}))
    assert_only_the_first_failed(episodes, "x/E-v0 reset: info['tools']=")
    assert expected in episodes[0].error["message"] and episodes[0].error["type"] == "StepInfoError"


def test_an_exception_while_building_the_first_prompt_fails_that_episode_alone():
    episodes = run_batch(ScriptedEnv(reset_obs="boom task"))
    assert_only_the_first_failed(episodes, "template exploded on 'boom'")
    assert episodes[0].error["type"] == "RuntimeError" and not episodes[0].turns


def test_an_exception_while_building_a_later_prompt_fails_that_episode_alone():
    episodes = run_batch(ScriptedEnv(step_obs="boom", steps=3))
    assert_only_the_first_failed(episodes, "template exploded on 'boom'")
    assert len(episodes[0].turns) == 1 and episodes[0].turns[0].observation_text == "boom"


class _HashRaises:
    def __hash__(self):
        raise ValueError("no")


@pytest.mark.parametrize("info, expected", [
    ({"anchor": _HashRaises()}, "is not hashable: hash() raised ValueError: no"),
    ({"observation_role": np.array(["user"])}, "info['observation_role']=array(['user']"),
])
def test_a_bad_anchor_or_role_fails_that_episode_alone_as_a_step_info_error(info, expected):
    episodes = run_batch(ScriptedEnv(reset_info=info))
    assert_only_the_first_failed(episodes, expected)
    assert episodes[0].error["type"] == "StepInfoError"


def test_a_numpy_bool_success_is_accepted_as_a_python_bool():
    reward = np.float64(1.0)
    episodes = run_batch(ScriptedEnv(step_info={"success": reward >= 1.0, "invalid_action": np.False_}))
    assert [e.termination_reason for e in episodes] == [TerminationReason.ENV_TERMINATED] * 2
    assert episodes[0].success is True and episodes[0].turns[0].invalid_action is False
