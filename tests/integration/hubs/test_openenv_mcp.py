"""``hub/OpenEnv-v0`` on a real OpenEnv MCP environment (``MCPEnvironment`` with FastMCP tools,
``tests/helpers/openenv_mcp_server.py``, served by openenv 0.10.0 from the hub venv): its tools
become the episode's tools, each Hermes tool call a ``call_tool`` action, their results the tool
messages; a tool's own error is a tool message, a reply without a usable call an invalid action."""

from __future__ import annotations

import json

import pytest

from agentrl.hubs.openenv import ENV_ID, OpenEnvEnv
from agentrl.hubs.openenv_servers import stop_servers
from environments.checker import check_env, format_report
from tests.helpers.openenv_hub import mcp_command, mcp_server


def _call(tool: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": tool, "arguments": arguments})}</tool_call>'


@pytest.fixture(autouse=True)
def _stop_all():
    yield
    stop_servers()


def test_an_episode_through_the_tools_of_an_mcp_environment():
    with mcp_server() as (url, _):
        env = OpenEnvEnv(server=url)  # action_format auto: the CallToolAction schema makes it mcp
        try:
            obs, info = env.reset(options={"task_id": "openenv/3"})  # seed 3: the code is in drawer b
            assert obs == "Find the vault's code in one of its drawers (a, b, c, d), then enter it."
            assert [t["function"]["name"] for t in info["tools"]] == ["open_drawer", "enter_code"]
            assert info["tools"][0]["function"]["parameters"]["required"] == ["name"]
            assert "<tool_call>" in info["system_prompt"] and "open_drawer" in info["system_prompt"]

            obs, reward, term, trunc, info = env.step(_call("open_drawer", name="a") + _call("open_drawer", name="b"))
            assert obs == ("Result of tool call 1 of 2 (open_drawer):\nThe drawer is empty.\n\n"
                           "Result of tool call 2 of 2 (open_drawer):\nThe code is birch.")
            assert (reward, term, trunc, info["invalid_action"]) == (0.1, False, False, False)
            assert info["observation_role"] == "tool" and len(info["tool_outputs"]) == 2
            assert info["tool_call_count"] == 2
            anchor = info["anchor"]

            obs, reward, term, _, info = env.step(_call("open_drawer", name="z"))  # the tool raises: its error
            assert obs.startswith("error (execution_error):") and "there is no drawer 'z'" in obs
            assert (reward, term, info["invalid_action"]) == (0.0, False, False)

            for bad, says in (("I think it is birch.", "it calls no tool"),
                              (_call("smash"), "unknown tool 'smash'"),
                              (_call("open_drawer", drawer="a"), "tool call could not be used")):
                obs, reward, term, trunc, info = env.step(bad)
                assert info["invalid_action"] and says in obs and (reward, term, trunc) == (0.0, False, False)
                assert info["counters"] == {"openenv/invalid_actions": 1.0}

            obs, reward, term, trunc, info = env.step(_call("enter_code", code="birch"))
            assert (obs, reward, term, trunc) == ("The vault opens.", 1.0, True, False)
            assert info["anchor"] != anchor
        finally:
            env.close()


def test_a_wrong_code_ends_the_episode_with_no_reward_and_the_checker_passes():
    with mcp_server() as (url, _):
        env = OpenEnvEnv(server=url, action_format="mcp")
        try:
            env.reset(options={"task_id": "openenv/3"})
            assert env.step(_call("enter_code", code="amber"))[1:3] == (0.0, True)
        finally:
            env.close()
    report = check_env(ENV_ID, env_kwargs={"server": {"command": mcp_command()}}, task_id="openenv/3",
                       scripted_actions=[_call("open_drawer", name="b"), "no call", _call("enter_code", code="birch")])
    assert report.ok and report.steps == 3, format_report(report)
    assert "done" in report.checks_passed
