"""The gateway's answers parse with the real ``openai`` SDK types, and keep vLLM's token-id
fields where the SDK exposes them (``model_extra``)."""

import json
import math
from dataclasses import dataclass, field

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from agentrl.errors import ContractError
from agentrl.gateway.protocol import completion_response, parse_request, stream_chunks

RUN = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 64}
CALL = {"id": "call_abc", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}


@dataclass
class Reply:
    content: str | None = "Hello!"
    tool_calls: list = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_ids: list = field(default_factory=lambda: [1, 2, 3])
    completion_ids: list = field(default_factory=lambda: [10, 11, 2])
    log_probs: list = field(default_factory=lambda: [-0.5, -1.25, -0.01])
    tokens: list = field(default_factory=lambda: ["Hello", "!", "<|im_end|>"])


def request(**body):
    return parse_request({"messages": [{"role": "user", "content": "hi"}], **body}, **RUN)


def test_plain_completion_parses_with_the_sdk():
    out = completion_response(request(), Reply(), model="tiny", response_id="chatcmpl-1", created=7)
    json.dumps(out)
    cc = ChatCompletion.model_validate(out)
    assert cc.id == "chatcmpl-1" and cc.created == 7 and cc.model == "tiny"
    msg = cc.choices[0].message
    assert msg.role == "assistant" and msg.content == "Hello!" and msg.tool_calls is None
    assert cc.choices[0].finish_reason == "stop" and cc.choices[0].logprobs is None
    assert (cc.usage.prompt_tokens, cc.usage.completion_tokens, cc.usage.total_tokens) == (3, 3, 6)
    assert "prompt_token_ids" not in out and "token_ids" not in out["choices"][0]


def test_logprobs_and_token_ids_when_asked():
    out = completion_response(request(logprobs=True, return_token_ids=True), Reply(), model="tiny")
    cc = ChatCompletion.model_validate(out)
    content = cc.choices[0].logprobs.content
    assert [c.token for c in content] == ["Hello", "!", "<|im_end|>"]  # the stop token too
    assert [c.logprob for c in content] == [-0.5, -1.25, -0.01]
    assert content[0].bytes == list(b"Hello") and content[0].top_logprobs == []
    assert cc.model_extra["prompt_token_ids"] == [1, 2, 3]
    assert cc.choices[0].model_extra["token_ids"] == [10, 11, 2]
    assert cc.choices[0].message.content == "Hello!"  # the stop token is in token_ids, not in content


def test_tool_calls_in_the_completion():
    reply = Reply(content=None, tool_calls=[CALL], finish_reason="tool_calls")
    cc = ChatCompletion.model_validate(completion_response(request(), reply, model="tiny"))
    msg = cc.choices[0].message
    assert msg.content is None and cc.choices[0].finish_reason == "tool_calls"
    (tc,) = msg.tool_calls
    assert tc.id == "call_abc" and tc.function.name == "python"
    assert json.loads(tc.function.arguments) == {"code": "print(1)"}


def test_no_text_and_no_calls_is_empty_content():
    cc = ChatCompletion.model_validate(completion_response(request(), Reply(content=None), model="m"))
    assert cc.choices[0].message.content == ""


def test_a_minus_infinity_log_prob_stays_json():
    reply = Reply(log_probs=[-math.inf, -1.0, -0.1])
    out = completion_response(request(logprobs=True), reply, model="m")
    assert json.loads(json.dumps(out, allow_nan=False))["choices"][0]["logprobs"]["content"][0]["logprob"] == -9999.0


@pytest.mark.parametrize("bad", [Reply(log_probs=[-1.0]), Reply(tokens=["a"]), Reply(finish_reason="abort")])
def test_an_inconsistent_reply_is_a_contract_error(bad):
    with pytest.raises(ContractError):
        completion_response(request(), bad, model="m")
    with pytest.raises(ContractError):
        stream_chunks(request(stream=True), bad, model="m")


def test_stream_chunks_parse_and_reassemble():
    reply = Reply(content="Let me run it.\n", tool_calls=[CALL, {**CALL, "id": "call_def"}], finish_reason="tool_calls")
    req = request(stream=True, stream_options={"include_usage": True}, logprobs=True, return_token_ids=True)
    chunks = stream_chunks(req, reply, model="tiny", response_id="chatcmpl-9", created=5)
    parsed = [ChatCompletionChunk.model_validate(json.loads(json.dumps(c))) for c in chunks]
    assert all(c.id == "chatcmpl-9" and c.created == 5 and c.model == "tiny" for c in parsed)
    role, content, calls, finish, usage = parsed
    assert role.choices[0].delta.role == "assistant"
    assert role.model_extra["prompt_token_ids"] == [1, 2, 3]
    assert content.choices[0].delta.content == "Let me run it.\n"
    assert content.choices[0].model_extra["token_ids"] == [10, 11, 2]
    assert [c.logprob for c in content.choices[0].logprobs.content] == [-0.5, -1.25, -0.01]
    deltas = calls.choices[0].delta.tool_calls
    assert [(d.index, d.id, d.function.name) for d in deltas] == [(0, "call_abc", "python"), (1, "call_def", "python")]
    assert finish.choices[0].finish_reason == "tool_calls" and finish.choices[0].delta.content is None
    assert usage.choices == [] and usage.usage.total_tokens == 6
    assert all(c.usage is None for c in parsed[:-1])


def test_stream_without_extras():
    chunks = stream_chunks(request(stream=True), Reply(), model="m")
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert len(parsed) == 3  # role, content, finish: no tool calls, no usage chunk
    assert "".join(c.choices[0].delta.content or "" for c in parsed) == "Hello!"
    assert parsed[-1].choices[0].finish_reason == "stop"
    assert all("usage" not in c and "prompt_token_ids" not in c for c in chunks)
    assert all("token_ids" not in c["choices"][0] and c["choices"][0]["logprobs"] is None for c in chunks)
