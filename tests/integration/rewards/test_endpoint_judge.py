"""``EndpointJudge`` (agentrl/rewards/endpoint.py) with the real ``openai`` SDK against a real
OpenAI-compatible HTTP server (tests/helpers/scripted_judge.py): what reaches the server,
retries on what can pass and none on a 4xx, the error after the last retry, the concurrency
limit across threads, the API key from its environment variable, and the health check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from agentrl.errors import ConfigError, JudgeError
from agentrl.rewards.endpoint import EndpointJudge
from agentrl.rewards.types import Judge, JudgeReply, JudgeRequest
from tests.helpers.scripted_judge import ScriptedJudge

SCHEMA = {"type": "object", "properties": {"score": {"type": "number"}}, "required": ["score"]}
REQUEST = JudgeRequest(messages=({"role": "system", "content": "You grade answers."},
                                 {"role": "user", "content": "Task: 2+2. Answer: 4."}),
                       json_schema=SCHEMA, cache_key="0" * 64)
FAST = {"backoff_s": 0.01, "timeout_s": 5.0}


@pytest.fixture
def server() -> Iterator[ScriptedJudge]:
    s = ScriptedJudge(lambda messages: '{"ok": true}' if '{"ok": true}' in messages[0]["content"] else '{"score": 1}',
                      hang_s=3.0)  # the health check's prompt gets what it asks for
    yield s
    s.shutdown()


def test_reply_round_trip(server):
    judge = EndpointJudge(server.base_url, "judge-7b", max_tokens=64, **FAST)
    assert isinstance(judge, Judge)
    reply = judge.complete(REQUEST)
    assert isinstance(reply, JudgeReply)
    assert (reply.text, reply.model, reply.cached) == ('{"score": 1}', "judge-7b", False)
    assert reply.latency_s > 0
    body = server.requests[0]
    assert body["model"] == "judge-7b" and body["messages"] == list(REQUEST.messages)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "judgement", "schema": SCHEMA}}
    assert (body["max_tokens"], body["temperature"]) == (64, 0.0)
    assert server.headers[0]["authorization"] == "Bearer EMPTY"
    assert (judge.calls, judge.retries, judge.failures) == (1, 0, 0)

    plain = EndpointJudge(server.base_url, "judge-7b", structured=False, **FAST)
    plain.complete(REQUEST)
    assert "response_format" not in server.requests[1]


@pytest.mark.parametrize("failure", [500, 429, "timeout", "empty", "no_choices", "garbage"])
def test_retries_then_success(server, failure):
    judge = EndpointJudge(server.base_url, "judge-7b", max_retries=3, backoff_s=0.01,
                          timeout_s=0.5 if failure == "timeout" else 5.0)
    server.fail_next(2, failure)
    reply = judge.complete(REQUEST)
    assert reply.text == '{"score": 1}'
    assert len(server.requests) == 3
    assert (judge.calls, judge.retries, judge.failures) == (1, 2, 0)


@pytest.mark.parametrize(("failure", "named"), [(503, "HTTP 503"), ("garbage", "not an OpenAI chat completion"),
                                                ("empty", "empty content")])
def test_judge_error_after_max_retries(server, failure, named):
    judge = EndpointJudge(server.base_url, "judge-7b", max_retries=2, **FAST)
    server.fail_next(3, failure)
    with pytest.raises(JudgeError) as info:
        judge.complete(REQUEST)
    message = str(info.value)
    for part in (server.base_url, "'judge-7b'", "3 attempt", named):
        assert part in message, message
    assert len(server.requests) == 3
    assert (judge.calls, judge.retries, judge.failures) == (1, 2, 1)


def test_timeout_is_named_and_backoff_grows(server):
    judge = EndpointJudge(server.base_url, "judge-7b", max_retries=1, backoff_s=0.2, timeout_s=0.3)
    server.fail_next(2, "timeout")
    start = time.monotonic()
    with pytest.raises(JudgeError, match=r"timed out after 0\.3 s"):
        judge.complete(REQUEST)
    assert time.monotonic() - start >= 2 * 0.3 + 0.2 * 0.5  # two timeouts and one jittered backoff


def test_no_retry_on_400(server):
    judge = EndpointJudge(server.base_url, "judge-7b", max_retries=3, **FAST)
    server.fail_next(1, 400)
    with pytest.raises(JudgeError, match=r"HTTP 400.*scripted failure") as info:
        judge.complete(REQUEST)
    assert "not retried" in str(info.value) and server.base_url in str(info.value)
    assert len(server.requests) == 1
    assert (judge.calls, judge.retries, judge.failures) == (1, 0, 1)


def test_concurrency_limit_holds_across_threads():
    def slow(messages: list[dict]) -> str:
        time.sleep(0.2)
        return '{"score": 0.5}'

    server = ScriptedJudge(slow)
    try:
        judge = EndpointJudge(server.base_url, "judge-7b", max_concurrency=3, **FAST)
        replies: list[JudgeReply] = []
        threads = [threading.Thread(target=lambda: replies.append(judge.complete(REQUEST))) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(replies) == 10 and judge.calls == 10
        assert server.max_in_flight == 3  # the limit was reached and never passed
    finally:
        server.shutdown()


def test_api_key_from_env_var(server, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_JUDGE_KEY", "sk-test-123")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one")
    EndpointJudge(server.base_url, "judge-7b", api_key_env="AGENTRL_TEST_JUDGE_KEY", **FAST).complete(REQUEST)
    assert server.headers[0]["authorization"] == "Bearer sk-test-123"


def test_unset_env_var_is_a_config_error(monkeypatch):
    monkeypatch.delenv("AGENTRL_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(ConfigError, match="AGENTRL_TEST_JUDGE_KEY"):
        EndpointJudge("http://127.0.0.1:1/v1", "judge-7b", api_key_env="AGENTRL_TEST_JUDGE_KEY")
    with pytest.raises(ConfigError, match="name of an environment variable") as info:
        EndpointJudge("http://127.0.0.1:1/v1", "judge-7b", api_key_env="sk-live-abc123")
    assert "sk-live-abc123" not in str(info.value)  # a key pasted by mistake is not echoed


@pytest.mark.parametrize("kwargs", [{"base_url": "ftp://judge/v1"}, {"base_url": "judge:8000/v1"},
                                    {"max_concurrency": 0}, {"max_retries": -1}, {"backoff_s": -1.0},
                                    {"timeout_s": 0}, {"temperature": -0.1}, {"max_tokens": 0}, {"model": ""}])
def test_bad_values_are_config_errors(kwargs):
    args = {"base_url": "http://127.0.0.1:1/v1", "model": "judge-7b"} | kwargs
    name = next(iter(kwargs))
    with pytest.raises(ConfigError, match=name):
        EndpointJudge(**args)


def test_check(server):
    judge = EndpointJudge(server.base_url, "judge-7b", **FAST)
    judge.check()
    body = server.requests[0]
    assert body["max_tokens"] == 16 and '{"ok": true}' in body["messages"][0]["content"]
    assert judge.calls == 0  # a health check is not counted

    server.fail_next(1, 502)
    with pytest.raises(JudgeError, match=r"health check: HTTP 502"):
        judge.check()
    plain = ScriptedJudge(lambda messages: "sure, here you go")
    try:
        with pytest.raises(JudgeError, match="not JSON"):
            EndpointJudge(plain.base_url, "judge-7b", **FAST).check()
    finally:
        plain.shutdown()
    for answer in ("0", "null", "[]", '"I cannot help with that"', '{"ok": false}'):  # JSON, but no {"ok": true}
        other = ScriptedJudge(lambda messages, a=answer: a)
        try:
            with pytest.raises(JudgeError, match="health check: asked for"):
                EndpointJudge(other.base_url, "judge-7b", **FAST).check()
        finally:
            other.shutdown()


def test_check_against_stopped_server():
    stopped = ScriptedJudge()
    url = stopped.base_url
    stopped.shutdown()
    with pytest.raises(JudgeError, match="connection failed") as info:
        EndpointJudge(url, "judge-7b", **FAST).check()
    assert url in str(info.value) and "'judge-7b'" in str(info.value)
