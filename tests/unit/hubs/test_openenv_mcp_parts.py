"""``agentrl.hubs.openenv_mcp`` on the shapes openenv 0.10's MCP environments send (no server):
listed tools become OpenAI-style tool schemas, a list that is off the protocol is the server's
fault (``OpenEnvError``, infrastructure), and each ``call_tool`` observation becomes one tool
message."""

from __future__ import annotations

import pytest

from agentrl.errors import InfraError
from agentrl.hubs.openenv_actions import ActionSchema
from agentrl.hubs.openenv_mcp import call_tool_action, is_mcp_schema, mcp_tools, tool_result_text, transport_fault
from agentrl.hubs.openenv_wire import OpenEnvError

CALL_TOOL_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["tool_name"],
                    "properties": {"metadata": {"type": "object"}, "type": {"const": "call_tool", "type": "string"},
                                   "tool_name": {"type": "string"}, "arguments": {"type": "object"}}}


def test_the_call_tool_schema_is_recognised_and_a_plain_one_is_not():
    assert is_mcp_schema(ActionSchema.from_schema(CALL_TOOL_SCHEMA))
    plain = {"type": "object", "properties": {"metadata": {"type": "object"}, "message": {"type": "string"}}}
    assert not is_mcp_schema(ActionSchema.from_schema(plain))
    assert call_tool_action("add", {"a": 1}) == {"type": "call_tool", "tool_name": "add", "arguments": {"a": 1}}


def test_listed_tools_become_tool_schemas_in_order():
    listed = {"tools": [
        {"name": "add", "description": "Add two numbers.",
         "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "required": ["a", "b"]}},
        {"name": "ping", "description": None, "input_schema": {}},
    ]}
    assert mcp_tools(listed, "http://h:1") == [
        {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                          "parameters": listed["tools"][0]["input_schema"]}},
        {"type": "function", "function": {"name": "ping", "description": "",
                                          "parameters": {"type": "object", "properties": {}}}},
    ]


@pytest.mark.parametrize("listed, says", [
    ({}, "non-empty 'tools' list"),
    ({"tools": []}, "non-empty 'tools' list"),
    ({"tools": [{"description": "no name"}]}, "unique non-empty str 'name'"),
    ({"tools": [{"name": "a"}, {"name": "a"}]}, "unique non-empty str 'name'"),
    ({"tools": [{"name": "a", "input_schema": {"type": "array"}}]}, "JSON schema of type object"),
    ({"tools": [{"name": "a", "input_schema": {"type": "object", "properties": {"x": {"type": 5}}}}]},
     "cannot check calls against"),
    ({"tools": [{"name": "a", "input_schema": {"type": "object", "properties": {"d": {"$ref": "#/$defs/Gone"}}}}]},
     r"\$ref '#/\$defs/Gone', which does not resolve"),
    ({"tools": [{"name": "a", "input_schema": {"type": "object", "properties": {"d": {"$ref": "https://x/s.json"}}}}]},
     "does not resolve within the schema"),
])
def test_a_tool_list_off_the_protocol_is_the_servers_fault(listed, says):
    with pytest.raises(OpenEnvError, match=says) as info:
        mcp_tools(listed, "http://h:1")
    assert isinstance(info.value, InfraError) and "http://h:1" in str(info.value)


@pytest.mark.parametrize("observation, text", [
    ({"tool_name": "t", "result": {"content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
                                   "is_error": False}, "error": None}, "one\ntwo"),
    ({"tool_name": "t", "result": {"content": [{"type": "text", "text": "bad input"}], "is_error": True}},
     "error: bad input"),
    ({"tool_name": "t", "result": {"content": [{"type": "image", "data": "AA=="}]}},
     '{"data": "AA==", "type": "image"}'),
    ({"tool_name": "t", "result": {"content": [], "structured_content": {"result": 3}}}, '{"result": 3}'),
    ({"tool_name": "t", "result": None, "error": {"error_type": "timeout", "message": "too slow"}},
     "error (timeout): too slow"),
    ({"tool_name": "t", "result": "plain"}, "plain"),
    ({"tool_name": "t", "result": [1, 2]}, "[1, 2]"),
    ({"tool_name": "t", "result": None}, ""),
])
def test_a_call_tool_observation_becomes_one_tool_message(observation, text):
    assert tool_result_text(observation) == text


def test_refs_into_the_schema_itself_are_kept_and_checked():
    from agentrl.errors import ToolParseError
    from environments.tools import HermesToolParser

    listed = {"tools": [{"name": "move", "input_schema": {
        "type": "object", "$defs": {"Dir": {"type": "string", "enum": ["n", "s"]}},
        "properties": {"d": {"$ref": "#/$defs/Dir"}}, "required": ["d"]}}]}
    parser = HermesToolParser(mcp_tools(listed, "http://h:1"))
    assert parser.parse('<tool_call>{"name": "move", "arguments": {"d": "n"}}</tool_call>')[0].arguments == {"d": "n"}
    with pytest.raises(ToolParseError):
        parser.parse('<tool_call>{"name": "move", "arguments": {"d": "x"}}</tool_call>')


def test_only_a_transport_error_is_the_servers_fault():
    assert transport_fault({"error": {"error_type": "transport_error", "message": "MCP down"}}) == \
        "transport_error: MCP down"
    for kind in ("execution_error", "timeout", "invalid_args", "tool_not_found"):
        assert transport_fault({"error": {"error_type": kind, "message": "m"}}) is None
    assert transport_fault({"result": "fine", "error": None}) is None
