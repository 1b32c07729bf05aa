"""The step-info keys of an environment that speaks chat messages (the gateway's env-rendezvous):
``messages``, ``branch``, ``tool_calls`` (key ``tool_call_count``), ``counters``,
``max_new_tokens``, ``stop_strings``; written by ``to_info``, read by ``from_info``."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.errors import ContractError
from agentrl.types import STEP_INFO_KEYS, StepInfo, StepInfoError

MESSAGES = (
    {"role": "system", "content": "You are a coder."},
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                         "function": {"name": "sh", "arguments": "{}"}}]},
    {"role": "tool", "content": "ok", "tool_call_id": "c1", "name": "sh"},
)


def test_the_new_keys_round_trip_through_to_info_and_from_info():
    record = StepInfo(messages=MESSAGES, branch=2, tool_calls=3, counters={"gateway/forks": 1.0},
                      max_new_tokens=64, stop_strings=("</answer>",))
    info = record.to_info(task_id="t")
    assert info["messages"] == list(MESSAGES) and info["messages"][2] is not MESSAGES[2]
    assert info["branch"] == 2 and info["tool_call_count"] == 3 and info["counters"] == {"gateway/forks": 1.0}
    assert info["max_new_tokens"] == 64 and info["stop_strings"] == ["</answer>"]
    assert "tool_calls" not in info  # an env's own key (its parsed calls), never the count
    assert set(info) - {"task_id"} <= set(STEP_INFO_KEYS)
    assert StepInfo.from_info(info, env_id="x/E-v0", where="step 1") == record
    assert set(StepInfo().to_info()) == {"anchor", "observation_role", "invalid_action"}


def test_the_parsed_record_holds_copies_and_plain_types():
    msgs = [dict(m) for m in MESSAGES]
    parsed = StepInfo.from_info({"messages": msgs, "counters": {"my/n": np.int64(2)}, "branch": np.int64(1),
                                 "max_new_tokens": np.int32(8), "stop_strings": ["x"]}, env_id="x/E-v0")
    msgs[2]["tool_calls"][0]["id"] = "changed"
    assert parsed.messages[2]["tool_calls"][0]["id"] == "c1" and isinstance(parsed.messages, tuple)
    assert parsed.counters == {"my/n": 2.0} and type(parsed.counters["my/n"]) is float
    assert type(parsed.branch) is int and parsed.branch == 1 and type(parsed.max_new_tokens) is int
    assert parsed.stop_strings == ("x",)


def test_an_envs_own_tool_calls_list_is_left_alone():
    parsed = StepInfo.from_info({"tool_calls": [{"name": "python"}]}, env_id="x/E-v0")
    assert parsed.tool_calls is None
    assert StepInfo().to_info(tool_calls=["parsed call"])["tool_calls"] == ["parsed call"]


def test_reset_takes_messages_but_not_a_branch_or_tool_calls():
    assert StepInfo.from_info({"messages": list(MESSAGES[:2])}, env_id="x/E-v0", where="reset").messages == MESSAGES[:2]
    for key in ("branch", "tool_call_count"):
        with pytest.raises(StepInfoError, match=f"x/E-v0 reset: info\\['{key}'\\]=1 is for step only") as err:
            StepInfo.from_info({key: 1}, env_id="x/E-v0", where="reset")
        assert err.value.key == key and err.value.value == 1


def test_to_info_refuses_a_new_contract_key_as_an_extra():
    with pytest.raises(ContractError, match=r"\['counters', 'messages'\] are StepInfo fields"):
        StepInfo().to_info(messages=[], counters={})


@pytest.mark.parametrize("info, key, expected", [
    ({"messages": "hi"}, "messages", "must be a non-empty list of"),
    ({"messages": []}, "messages", "must be a non-empty list of"),
    ({"messages": ["hi"]}, "messages", "has a message 0 of type str; expected a dict"),
    ({"messages": [{"role": "developer", "content": "x"}]}, "messages",
     r"has a message 0 with role='developer'; expected one of \('system', 'user', 'assistant', 'tool'\)"),
    ({"messages": [{"role": "user"}]}, "messages", "has a message 0 with content of type NoneType; expected str"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]}, "messages",
     "has a message 1 with content of type NoneType"),
    ({"messages": [{"role": "user", "content": "a", "images": []}]}, "messages", r"with keys \['images'\]; expected only"),
    ({"messages": [{"role": "tool", "content": "a", "tool_call_id": 3}]}, "messages", "tool_call_id of type int"),
    ({"messages": [{"role": "tool", "content": "a", "name": None}]}, "messages", "name of type NoneType"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": "x"}]}, "messages",
     "tool_calls='x'; expected a list of dicts"),
    ({"branch": -1}, "branch", "must be an int >= 0, got int"),
    ({"branch": True}, "branch", "must be an int >= 0, got bool"),
    ({"branch": 1.0}, "branch", "must be an int >= 0, got float"),
    ({"branch": "1"}, "branch", "must be an int >= 0, got str"),
    ({"tool_call_count": -1}, "tool_call_count", "must be an int >= 0"),
    ({"tool_call_count": np.bool_(True)}, "tool_call_count", "must be an int >= 0, got numpy.bool"),
    ({"max_new_tokens": 0}, "max_new_tokens", "must be an int >= 1, got int"),
    ({"max_new_tokens": 12.5}, "max_new_tokens", "must be an int >= 1, got float"),
    ({"counters": [("a", 1)]}, "counters", "must be a dict of str -> finite number"),
    ({"counters": {"my/a": float("inf")}}, "counters", "has 'my/a': inf; expected a finite number"),
    ({"counters": {"my/a": True}}, "counters", "has 'my/a': True; expected a finite number"),
    ({"counters": {"my/a": "1"}}, "counters", "has 'my/a': '1'; expected a finite number"),
    ({"counters": {3: 1}}, "counters", "has a key 3; expected '<namespace>/<name>'"),
    ({"counters": {"": 1}}, "counters", "has a key ''; expected '<namespace>/<name>'"),
    ({"counters": {"a": 1}}, "counters", "has a key 'a'; expected '<namespace>/<name>'"),
    ({"counters": {"iteration": 1}}, "counters", "has a key 'iteration'; expected '<namespace>/<name>'"),
    ({"counters": {"rollout/episodes": 1}}, "counters", "not one the run's own metrics use"),
    ({"counters": {"time/rollout_s": 1}}, "counters", "not one the run's own metrics use"),
    ({"stop_strings": "</a>"}, "stop_strings", "must be a list of non-empty str"),
    ({"stop_strings": ["</a>", ""]}, "stop_strings", "must be a list of non-empty str"),
    ({"stop_strings": [3]}, "stop_strings", "must be a list of non-empty str"),
])
def test_a_bad_value_names_the_key_the_value_and_what_was_expected(info, key, expected):
    with pytest.raises(StepInfoError, match=expected) as err:
        StepInfo.from_info(info, env_id="x/E-v0", where="step 2")
    assert str(err.value).startswith(f"x/E-v0 step 2: info[{key!r}]=")
    assert err.value.env_id == "x/E-v0" and err.value.key == key and err.value.value is info[key]
