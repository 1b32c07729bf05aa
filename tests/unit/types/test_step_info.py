"""``StepInfo`` (agentrl/types/step_info.py): what an env hands the rollout beside the observation,
built by envs with ``to_info`` and parsed by the one validator ``from_info`` that the
rollout loop and ``environments.checker`` share."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.errors import ConfigError, ContractError
from agentrl.types import STEP_INFO_KEYS, StepInfo, StepInfoError, tool_function, type_name


def test_an_empty_info_means_the_defaults():
    info = StepInfo.from_info({}, env_id="x/E-v0")
    assert info == StepInfo()
    assert info.observation_role == "user" and not info.invalid_action and info.success is None
    assert info.anchor_or("the observation") == "the observation"  # no anchor: the text is the state key


def test_to_info_and_from_info_round_trip_and_keep_the_envs_own_keys():
    record = StepInfo(anchor=("t/1", 2), observation_role="tool", tool_outputs=("out 1", "out 2"),
                      system_prompt="You are...", tools=({"type": "function", "function": {"name": "python"}},),
                      system_prompt_describes_tools=True, invalid_action=False, success=True)
    info = record.to_info(task_id="t/1", num_tool_calls=2)
    assert info["task_id"] == "t/1" and info["num_tool_calls"] == 2
    assert info["tool_outputs"] == ["out 1", "out 2"]
    assert info["tools"] == [{"type": "function", "function": {"name": "python"}}]
    assert StepInfo.from_info(info, env_id="x/E-v0") == record
    assert set(StepInfo(anchor=1).to_info()) == {"anchor", "observation_role", "invalid_action"}
    assert set(STEP_INFO_KEYS) >= set(info) - {"task_id", "num_tool_calls"}


def test_example_messages_round_trip_as_a_tuple_of_copies():
    turns = [{"role": "user", "content": "Task: read a.txt"}, {"role": "assistant", "content": "<tool_call>...</tool_call>"},
             {"role": "tool", "content": "hello"}, {"role": "assistant", "content": "Done."}]
    info = StepInfo(example_messages=tuple(turns)).to_info()
    assert info["example_messages"] == turns and info["example_messages"][0] is not turns[0]
    parsed = StepInfo.from_info(info, env_id="x/E-v0", where="reset")
    assert parsed.example_messages == tuple(turns)
    turns[0]["content"] = "changed"  # the record does not alias the env's list
    assert parsed.example_messages[0]["content"] == "Task: read a.txt"


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
    ({"example_messages": "Task: ..."}, "example_messages", "must be a list of"),
    ({"example_messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}]}, "example_messages",
     r"has a bad turn 1 .*'role' \(one of \('user', 'assistant', 'tool'\)\)"),
    ({"example_messages": [{"role": "assistant", "content": None}]}, "example_messages", "has a bad turn 0"),
    ({"example_messages": [{"role": "user", "content": "q", "name": "x"}]}, "example_messages", "exactly 'role'"),
    ({"success": np.float64(1.0)}, "success", "must be bool, got numpy.float64"),
    ({"invalid_action": np.int64(1)}, "invalid_action", "must be bool, got numpy.int64"),
    ({"tools": ({"type": "function"},)}, "tools", "has a bad tool 0: tool schema .* has no function name"),
    ({"tools": [{"function": {"name": "x", "parameters": "oops"}}]}, "tools",
     "has a bad tool 0: .* has parameters of type str, not a dict"),
    ({"tools": [{"function": {"name": "x", "parameters": {"properties": {"a": 1}}}}]}, "tools",
     "has property 'a' whose schema is a int, not a dict"),
    ({"tools": [{"function": {"name": "x", "parameters": {"properties": []}}}]}, "tools",
     "parameters.properties of type list, not a dict"),
    ({"tools": [{"function": {"name": "x", "parameters": {"required": "a"}}}]}, "tools",
     "parameters.required='a', not a list of str"),
    ({"observation_role": np.array(["user", "tool"])}, "observation_role", "is not one of"),
    ({"observation_role": 3}, "observation_role", "is not one of"),
])
def test_a_bad_value_names_the_env_the_key_the_value_and_what_was_expected(info, key, expected):
    with pytest.raises(StepInfoError, match=expected) as err:
        StepInfo.from_info(info, env_id="x/Bad-v0", where="step 3")
    msg = str(err.value)
    assert msg.startswith(f"x/Bad-v0 step 3: info[{key!r}]={info[key]!r}"[:200])
    assert err.value.env_id == "x/Bad-v0" and err.value.key == key and err.value.value is info[key]
    assert isinstance(err.value, ContractError)


class _HashRaises:
    def __hash__(self):
        raise ValueError("no")

    def __repr__(self):
        return "<HashRaises>"


def test_an_anchor_whose_hash_raises_anything_is_a_step_info_error_naming_it():
    with pytest.raises(StepInfoError, match=r"x/E-v0 reset: info\['anchor'\]=<HashRaises> is not hashable: "
                                            r"hash\(\) raised ValueError: no") as err:
        StepInfo.from_info({"anchor": _HashRaises()}, env_id="x/E-v0", where="reset")
    assert err.value.key == "anchor" and isinstance(err.value.value, _HashRaises)


def test_numpy_bools_are_accepted_as_python_bools():
    reward = np.float64(1.0)
    info = StepInfo.from_info({"success": reward >= 1.0, "invalid_action": np.False_,
                               "system_prompt_describes_tools": np.bool_(True)}, env_id="x/E-v0")
    assert info == StepInfo(success=True, invalid_action=False, system_prompt_describes_tools=True)
    assert type(info.success) is bool and type(info.invalid_action) is bool
    assert type(info.system_prompt_describes_tools) is bool


def test_tools_may_be_a_tuple_and_are_kept_as_given():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {}},
                                                                          "required": ["a"]}}}
    assert StepInfo.from_info({"tools": (tool,)}, env_id="x/E-v0").tools == (tool,)
    assert StepInfo.from_info({"tools": []}, env_id="x/E-v0").tools == ()


def test_tool_function_returns_the_function_part_or_the_flat_schema():
    fn = {"name": "f", "description": "d", "parameters": {"properties": {"a": {"type": "string"}}}}
    assert tool_function({"type": "function", "function": fn}) is fn
    assert tool_function({"name": "g"}) == {"name": "g"}
    assert tool_function({"function": {"name": "h", "parameters": None}})["name"] == "h"


@pytest.mark.parametrize("tool, expected", [
    ("python", "is a str, not a dict"),
    ({"function": {"description": "x"}}, "has no function name"),
    ({"function": {"name": 3}}, "has no function name"),
    ({"function": "f"}, "has no function name"),
    ({"function": {"name": "f", "parameters": [1]}}, "has parameters of type list, not a dict"),
    ({"function": {"name": "f", "parameters": {"properties": {"a": True}}}}, "property 'a' whose schema is a bool"),
    ({"function": {"name": "f", "parameters": {"required": ["a", 1]}}}, "required=\\['a', 1\\], not a list of str"),
])
def test_tool_function_refuses_a_bad_schema_naming_it_and_the_expected_shape(tool, expected):
    with pytest.raises(ConfigError, match=expected) as err:
        tool_function(tool)
    assert f"tool schema {tool!r}" in str(err.value)
    assert 'expected {"type": "function", "function": {"name": ...' in str(err.value)


def test_type_name_is_module_qualname_except_for_builtins():
    assert type_name(1) == "int" and type_name(np.True_) == f"numpy.{type(np.True_).__qualname__}"
    assert type_name(_HashRaises()) == f"{__name__}._HashRaises"


def test_info_that_is_not_a_dict_is_refused():
    with pytest.raises(StepInfoError, match="x/E-v0 reset: info of type list; expected dict"):
        StepInfo.from_info([], env_id="x/E-v0", where="reset")
