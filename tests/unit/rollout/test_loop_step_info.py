"""How the rollout loop reads an env's step output (agentrl/rollout/loop.py): the tuple is
checked, ``info`` is parsed once by ``StepInfo.from_info`` (the validator the env checker
uses too), and observations become chat messages from the parsed record."""

from __future__ import annotations

import pytest

from agentrl.errors import EnvError, RewardError
from agentrl.rollout.loop import _check_step_output, _observation_messages
from agentrl.types import StepInfo, StepInfoError


def test_a_step_output_is_checked_and_its_info_parsed():
    obs, reward, term, trunc, info = _check_step_output(
        ("out", 1, True, False, {"anchor": ("s", 1), "success": True, "task_id": "t"}), "x/E-v0")
    assert (obs, reward, term, trunc) == ("out", 1.0, True, False) and isinstance(reward, float)
    assert info == StepInfo(anchor=("s", 1), success=True)


@pytest.mark.parametrize("out, error, pattern", [
    (("out", 0.0, False, False), EnvError, "expected \\(observation, reward, terminated, truncated, info\\)"),
    ((3, 0.0, False, False, {}), EnvError, "observation of type int"),
    (("out", float("nan"), False, False, {}), RewardError, "reward=nan"),
    (("out", 0.0, 0, False, {}), EnvError, "expected bools"),
    (("out", 0.0, False, False, None), StepInfoError, "x/E-v0 step: info of type NoneType; expected dict"),
    (("out", 0.0, False, False, {"anchor": {"a": 1}}), StepInfoError, "x/E-v0 step: info\\['anchor'\\].*not hashable"),
    (("out", 0.0, False, False, {"observation_role": "assistant"}), StepInfoError, "'assistant' is not one of"),
])
def test_a_broken_step_output_raises_naming_the_env_and_the_value(out, error, pattern):
    with pytest.raises(error, match=pattern):
        _check_step_output(out, "x/E-v0")


def test_tool_outputs_become_one_tool_message_each_and_other_roles_one_message():
    tool = StepInfo(observation_role="tool", tool_outputs=("a", "b"))
    assert _observation_messages("a\n\nb", tool) == [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    assert _observation_messages("x", StepInfo(observation_role="tool")) == [{"role": "tool", "content": "x"}]
    assert _observation_messages("x", StepInfo()) == [{"role": "user", "content": "x"}]
