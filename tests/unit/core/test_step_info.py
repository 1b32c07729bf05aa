"""``StepInfo`` (agentrl/types.py): what an env hands the rollout beside the observation,
built by envs with ``to_info`` and parsed by the one validator ``from_info`` that the
rollout loop and ``environments.checker`` share."""

from __future__ import annotations

import pytest

from agentrl.errors import ContractError
from agentrl.types import STEP_INFO_KEYS, StepInfo, StepInfoError


def test_an_empty_info_means_the_defaults():
    info = StepInfo.from_info({}, env_id="x/E-v0")
    assert info == StepInfo()
    assert info.observation_role == "user" and not info.invalid_action and info.success is None
    assert info.anchor_or("the observation") == "the observation"  # no anchor: the text is the state key


def test_to_info_and_from_info_round_trip_and_keep_the_envs_own_keys():
    record = StepInfo(anchor=("t/1", 2), observation_role="tool", tool_outputs=("out 1", "out 2"),
                      system_prompt="You are...", tools=({"type": "function"},),
                      system_prompt_describes_tools=True, invalid_action=False, success=True)
    info = record.to_info(task_id="t/1", num_tool_calls=2)
    assert info["task_id"] == "t/1" and info["num_tool_calls"] == 2
    assert info["tool_outputs"] == ["out 1", "out 2"] and info["tools"] == [{"type": "function"}]
    assert StepInfo.from_info(info, env_id="x/E-v0") == record
    assert set(StepInfo(anchor=1).to_info()) == {"anchor", "observation_role", "invalid_action"}
    assert set(STEP_INFO_KEYS) >= set(info) - {"task_id", "num_tool_calls"}


def test_to_info_refuses_a_contract_key_as_an_extra():
    with pytest.raises(ContractError, match=r"\['success'\] are StepInfo fields"):
        StepInfo().to_info(success=True)


@pytest.mark.parametrize("info, key, expected", [
    ({"anchor": [1, 2]}, "anchor", "is not hashable"),
    ({"observation_role": "assistant"}, "observation_role", r"is not one of \('user', 'tool', 'system'\)"),
    ({"tool_outputs": ["a", 3]}, "tool_outputs", "must be a list of str"),
    ({"tool_outputs": "a"}, "tool_outputs", "must be a list of str"),
    ({"system_prompt": 7}, "system_prompt", "must be str, got int"),
    ({"tools": {"name": "python"}}, "tools", "must be a list of dict"),
    ({"system_prompt_describes_tools": 1}, "system_prompt_describes_tools", "must be bool, got int"),
    ({"invalid_action": "yes"}, "invalid_action", "must be bool, got str"),
    ({"success": 1.0}, "success", "must be bool, got float"),
])
def test_a_bad_value_names_the_env_the_key_the_value_and_what_was_expected(info, key, expected):
    with pytest.raises(StepInfoError, match=expected) as err:
        StepInfo.from_info(info, env_id="x/Bad-v0", where="step 3")
    msg = str(err.value)
    assert msg.startswith(f"x/Bad-v0 step 3: info[{key!r}]={info[key]!r}")
    assert err.value.env_id == "x/Bad-v0" and err.value.key == key and err.value.value == info[key]
    assert isinstance(err.value, ContractError)


def test_info_that_is_not_a_dict_is_refused():
    with pytest.raises(StepInfoError, match="x/E-v0 reset: info of type list; expected dict"):
        StepInfo.from_info([], env_id="x/E-v0", where="reset")
