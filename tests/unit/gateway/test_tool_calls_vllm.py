"""vLLM's tool parsers through the gateway, and why "hermes" is ours: vLLM's hermes parser
cuts a call at a ``</tool_call>`` inside a string argument (a regex, ``<tool_call>(.*?)</tool_call>``)
and returns the whole text as content; ours reads the call as JSON (agentrl.gateway.tool_calls)."""

import json

import pytest

from agentrl.errors import ConfigError
from agentrl.gateway.tool_calls import parse_tool_calls

pytest.importorskip("vllm.tool_parsers")

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
GREP_CLOSING_TAG = ("I'll search the notes.\n<tool_call>{\"name\": \"bash\", \"arguments\": "
                    "{\"command\": \"grep -n '</tool_call>' notes.md\"}}</tool_call>")


def test_closing_tag_in_a_string_ours_reads_the_call_vllms_hermes_does_not(smollm2_tokenizer):
    ours = parse_tool_calls(GREP_CLOSING_TAG, [BASH], "hermes")
    assert [json.loads(c["function"]["arguments"]) for c in ours.tool_calls] == [
        {"command": "grep -n '</tool_call>' notes.md"}]
    vllms = parse_tool_calls(GREP_CLOSING_TAG, [BASH], "vllm:hermes", tokenizer=smollm2_tokenizer)
    assert vllms.tool_calls == [] and vllms.content == GREP_CLOSING_TAG
    assert vllms.error and "JSONDecodeError" in vllms.error  # vLLM logged it; the gateway reports it


def test_a_well_formed_call_reads_the_same_with_both(smollm2_tokenizer):
    text = 'Listing.\n<tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}</tool_call>'
    ours = parse_tool_calls(text, [BASH])
    vllms = parse_tool_calls(text, [BASH], "vllm:hermes", tokenizer=smollm2_tokenizer)
    for msg in (ours, vllms):
        assert msg.content == "Listing.\n" and msg.error is None
        (call,) = msg.tool_calls
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {"command": "ls -la"}


def test_another_vllm_parser_by_name(smollm2_tokenizer):
    msg = parse_tool_calls('[bash(command="pwd")]', [BASH], "pythonic", tokenizer=smollm2_tokenizer)
    (call,) = msg.tool_calls
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {"command": "pwd"}
    assert call["id"].startswith("call_") and msg.content is None and msg.error is None


def test_a_vllm_parser_that_does_not_fit_the_tokenizer_is_a_config_error(smollm2_tokenizer):
    with pytest.raises(ConfigError, match="llama3_json.*does not fit"):
        parse_tool_calls('{"name": "bash", "parameters": {"command": "pwd"}}', [BASH], "llama3_json",
                         tokenizer=smollm2_tokenizer)


def test_an_unknown_parser_name_lists_the_known_ones(smollm2_tokenizer):
    with pytest.raises(ConfigError, match="unknown tool parser 'no_such_parser'.*hermes"):
        parse_tool_calls("x", [BASH], "no_such_parser", tokenizer=smollm2_tokenizer)
