"""Chat Completions request checks: what a training run serves, and a 400 naming the field
for everything else (agentrl.gateway.protocol.parse_request)."""

import pytest

from agentrl.gateway.errors import GatewayError
from agentrl.gateway.protocol import ChatRequest, parse_request

RUN = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 256}
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "python", "description": "Run Python.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}


def parse(**body):
    return parse_request({"messages": USER, **body}, **RUN)


def refused(body, param):
    with pytest.raises(GatewayError) as info:
        parse_request(body, **RUN)
    err = info.value
    assert err.status == 400 and err.type == "invalid_request_error"
    assert err.param == param, err.message
    assert err.body() == {"error": {"message": err.message, "type": "invalid_request_error", "param": param,
                                    "code": None}}
    return err.message


def test_a_plain_request_is_normalized():
    req = parse_request({
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "python", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "out"}], "extra": 1},
        ],
        "tools": [TOOL], "stop": "END", "max_completion_tokens": 9999, "stream": True,
        "stream_options": {"include_usage": True}, "logprobs": True, "return_token_ids": True, "seed": 3,
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "n": 1, "top_logprobs": 0,
        "response_format": {"type": "text"}, "frequency_penalty": 0.0, "user": "ignored",
    }, **RUN)
    assert isinstance(req, ChatRequest)
    assert req.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "python", "arguments": "{}"}}]},
        {"role": "tool", "content": "out", "tool_call_id": "call_1"},
    ]
    assert req.tools == [TOOL] and req.tool_choice == "auto"
    assert req.stop == ("END",) and req.max_tokens == 256  # lowered to the run's max_new_tokens
    assert req.stream and req.include_usage and req.logprobs and req.return_token_ids
    assert req.seed == 3 and req.model == "m"


def test_defaults():
    req = parse()
    assert req == ChatRequest(messages=USER)
    assert parse(max_tokens=5, stop=["a", "b"], tools=[]).max_tokens == 5
    assert parse(stop=["a", "b"]).stop == ("a", "b")
    assert parse(tools=[]).tools is None
    assert parse(metadata={"k": "v"}, store=False).messages == USER  # keys the gateway does not read are ignored
    msgs = parse_request({"messages": [{"role": "assistant"}, *USER]}, **RUN).messages
    assert msgs[0] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize("body, param", [
    ({"n": 2}, "n"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
    ({"tool_choice": "required", "tools": [TOOL]}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "python"}}, "tools": [TOOL]}, "tool_choice"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": -1.0}, "presence_penalty"),
    ({"repetition_penalty": 1.1}, "repetition_penalty"),
    ({"min_p": 0.1}, "min_p"),
    ({"logit_bias": {"42": 10.0}}, "logit_bias"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}]}, "tools"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"stream": "yes please"}, "stream"),
    ({"stop": ""}, "stop"),
    ({"stop": ["a", ""]}, "stop"),
    ({"min_tokens": 5}, "min_tokens"),
    ({"ignore_eos": True}, "ignore_eos"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"structured_outputs": {"json": {}}}, "structured_outputs"),
    ({"parallel_tool_calls": False, "tools": [TOOL]}, "parallel_tool_calls"),
])
def test_refusals_name_the_field(body, param):
    refused({"messages": USER, **body}, param)


@pytest.mark.parametrize("param, value, shown", [
    ("temperature", 0.7, "temperature=1.0"), ("temperature", 0.0, "temperature=1.0"),
    ("top_p", 0.9, "top_p=1.0"), ("top_k", 50, "top_k=-1"),
])
def test_a_sampling_transform_other_than_the_runs_is_refused(param, value, shown):
    message = refused({"messages": USER, param: value}, param)
    assert shown in message and "one sampling transform" in message


def test_the_runs_own_sampling_values_are_accepted():
    parse(temperature=1.0, top_p=1.0, top_k=-1)
    parse(top_k=0)  # 0 and -1 both mean off
    assert parse_request({"messages": USER, "temperature": 0.6}, **{**RUN, "temperature": 0.6}).messages == USER


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"content": "x"}], "messages[0].role"),
    ([{"role": "function", "name": "f", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "prefill"}], "messages"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}, *USER], "messages[0].tool_calls[0]"),
    (["hello"], "messages[0]"),
])
def test_bad_messages_are_refused(messages, param):
    refused({"messages": messages}, param)


def test_no_messages_key_is_refused():
    refused({"model": "m"}, "messages")


def test_gateway_error_body_and_types():
    err = GatewayError(404, "no session 'x'")
    assert err.type == "not_found_error" and err.body()["error"]["param"] is None
    assert GatewayError(401, "key").type == "authentication_error"
    assert GatewayError(503, "engine down").type == "server_error"
    assert GatewayError(400, "x", code="bad").body()["error"]["code"] == "bad"
    with pytest.raises(ValueError, match="type='nope'"):
        GatewayError(400, "x", type="nope")
    with pytest.raises(ValueError, match="status=200"):
        GatewayError(200, "x")
