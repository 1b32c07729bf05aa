"""The verifiers runner (``agentrl/hubs/verifiers_runner.py``): its one rule written in plain
Python (when a reply ended the episode), and the runner itself run by the hub venvs'
pythons (verifiers 0.3.1 and 0.4.0; skipped without them, naming scripts/hub_venvs.sh)
against local stand-in servers: the policy's calls tagged with the session's id and key,
the reward verifiers computes, a ``JudgeRubric`` sent to the judge endpoint and never to the
policy, and every failure (a judge missing, a reward function that raised, a call the
gateway refused) an error, never a score of 0."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from agentrl.hubs.verifiers_runner import turn_was_cut
from agentrl.hubs.verifiers_spec import VerifiersError, VerifiersSpec, run_runner
from tests.helpers.verifiers_hub import CLASSIC_VENV, HELPERS, V1_VENV, case_kwargs, hub_python


@pytest.mark.parametrize("finish, cap, used, cut", [
    ("stop", None, 3, False), ("tool_calls", None, 16, False),
    ("length", None, 16, True),  # the run's max_new_tokens
    ("length", 8, 8, False),  # the request's own max_tokens, below the run's: the episode goes on
    ("length", 8, 5, True),  # cut before its own cap: the context
    ("length", 32, 16, True), ("length", 16, 16, True),  # a cap at or above the run's is the run's
    ("length", 8, None, False),  # no token count (the gateway always sends one): its own cap
])
def test_which_replies_end_the_episode(finish, cap, used, cut):
    assert turn_was_cut(finish, cap, used, 16) is cut


@contextmanager
def server(content: str = "I think 4", status: int = 200) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A chat server on 127.0.0.1: ``(base_url, calls)``; every call answered with ``content``
    (or an error ``status``), each recorded as ``{"path", "headers", "body"}``."""
    calls: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            calls.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
            out = {"id": "c", "object": "chat.completion", "created": 0, "model": body.get("model"),
                   "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                "message": {"role": "assistant", "content": content}}],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}
            if status != 200:
                out = {"error": {"message": "refused by the stand-in", "type": "invalid_request_error"}}
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1", calls
    finally:
        srv.shutdown()


def _run(kwargs: dict[str, Any], mode: str, **extra: Any) -> dict[str, Any]:
    spec = VerifiersSpec.from_kwargs({**kwargs, "timeout_s": 180})
    req = spec.request(mode, split="train", index=0, model="agentrl-policy", max_new_tokens=16, **extra)
    return run_runner(spec, req, mode)


def _rollout(kwargs: dict[str, Any], base_url: str) -> dict[str, Any]:
    return _run(kwargs, "rollout", gateway={"base_url": base_url, "session_id": "gw0-s1", "api_key": "sk-s1"})


@pytest.mark.slow
def test_classic_calls_go_to_the_session_and_the_rubric_scores_them():
    kwargs = case_kwargs("classic-single")
    with server("I think 4") as (url, calls):
        answer = _rollout(kwargs, url)
    (call,) = calls
    assert call["path"] == "/v1/chat/completions" and call["headers"]["x-session-id"] == "gw0-s1"
    assert call["headers"]["authorization"] == "Bearer sk-s1" and call["body"]["model"] == "agentrl-policy"
    assert not {"temperature", "top_p", "top_k"} & set(call["body"])  # the run's sampling is the gateway's
    text = "I think 4"
    brevity, vowels = 1 - len(text) / 200, sum(c in "aeiou" for c in text)
    assert answer["api"] == "classic" and answer["reward"] == pytest.approx(0.5 * 1.0 + 0.5 * brevity)
    assert answer["rewards"] == {"has_digit": {"score": 1.0, "weight": 0.5},
                                 "brevity": {"score": pytest.approx(brevity), "weight": 0.5}}
    assert answer["metrics"]["vowels"] == vowels and answer["calls"] == 1
    again = _run(kwargs, "score", replies=[{"content": text, "finish_reason": "length", "completion_tokens": 16}])
    assert again["reward"] == answer["reward"]


@pytest.mark.slow
def test_a_judge_rubric_calls_the_judge_endpoint_never_the_policy(monkeypatch):
    kwargs = {"python": hub_python(CLASSIC_VENV), "python_path": [HELPERS], "environment": "verifiers_judged"}
    with server("4") as (url, calls):
        with pytest.raises(VerifiersError, match="JudgeRubric .judge_model='judge-from-the-env'.*judge") as err:
            _rollout(kwargs, url)
        assert err.value.config and not calls
        monkeypatch.setenv("AGENTRL_TEST_JUDGE_KEY", "sk-judge")
        with server("yes") as (judge_url, judged):
            judge = {"base_url": judge_url, "model": "the-judge", "api_key_env": "AGENTRL_TEST_JUDGE_KEY"}
            answer = _rollout({**kwargs, "judge": judge}, url)
            with pytest.raises(VerifiersError, match="reward function 'broken' raised RuntimeError") as err:
                _rollout({**kwargs, "judge": judge, "args": {"fail": True}}, url)
            assert not err.value.config
    assert answer["reward"] == 1.0 and answer["rewards"]["judged"]["score"] == 1.0
    assert len(calls) == 2 and all(c["body"]["model"] == "agentrl-policy" for c in calls)
    assert len(judged) == 2 and all(c["body"]["model"] == "the-judge" for c in judged)
    assert judged[0]["headers"]["authorization"] == "Bearer sk-judge" and "x-session-id" not in judged[0]["headers"]


@pytest.mark.slow
def test_a_refused_call_is_an_error_not_a_score():
    with server(status=400) as (url, _):
        with pytest.raises(VerifiersError, match="the rollout failed: ModelError.*BadRequestError") as err:
            _rollout(case_kwargs("classic-single"), url)
    assert not err.value.config


@pytest.mark.slow
def test_a_v1_taskset_calls_the_session_by_its_trace_id_and_sums_its_rewards():
    kwargs = case_kwargs("v1")
    assert kwargs["python"] == hub_python(V1_VENV)
    with server("an apple fell") as (url, calls):
        answer = _rollout(kwargs, url)
    (call,) = calls
    assert call["headers"]["x-session-id"] == "gw0-s1" and call["headers"]["authorization"] == "Bearer sk-s1"
    assert call["body"]["messages"][-1]["content"] == "Use the word 'apple' in a sentence."
    short = 1 - len("an apple fell") / 100
    assert answer["api"] == "v1" and answer["reward"] == pytest.approx(0.75 * 1.0 + 0.25 * short)
    assert answer["rewards"]["mentions"] == {"score": 1.0, "weight": 0.75}
    assert answer["metrics"] == {"reply_chars": 13.0} and answer["stop"] == "agent_completed"
    cut = _run(kwargs, "score", replies=[{"content": "a pear", "finish_reason": "length", "completion_tokens": 16}])
    assert cut["reward"] == pytest.approx(0.25 * (1 - 6 / 100)) and cut["calls"] == 1
