"""Several gateways behind one address (``agentrl.gateway.router``): two real gateway servers,
one router in front, the real ``openai`` SDK pointed at the router. A thread per session plays
the env side (it answers every call with a made-up completion that names its session), so no
engine is needed: what is tested is that each call reaches the gateway that minted its
session, and that the answers (JSON, streams, error bodies) come back unchanged.
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import openai
import pytest
from fastapi.responses import StreamingResponse

from agentrl.cluster.actors import rollout_actor
from agentrl.gateway.router import GatewayRouter
from agentrl.gateway.server import SESSION_HEADER, GatewayServer
from agentrl.gateway.session import AgentReply, AgentSession

COMPLETION_IDS = [17, 29, 2]
LOG_PROBS = [-0.5, -1.25, -0.125]
TOKENS = ["ans", "wer", "<|im_end|>"]
MESSAGES = [{"role": "user", "content": "Which gateway are you?"}]


def answer_of(session_id: str) -> str:
    return f"answer of {session_id}"


def play_env(session: AgentSession, rewards: list[float]) -> None:
    """The env side of ``session``: answer every call with ``answer_of(session_id)`` (made-up
    ids and log-probs), record posted rewards, return when the session closes."""
    while True:
        event = session.next_event(timeout_s=30)
        if event.kind == "closed":
            return
        if event.kind == "reward":
            rewards.append(event.value)
        elif event.kind == "call":
            event.call.answer(AgentReply(content=answer_of(session.session_id), tool_calls=[], finish_reason="stop",
                                         prompt_ids=[1, 5, 9, 4], completion_ids=list(COMPLETION_IDS),
                                         log_probs=list(LOG_PROBS), tokens=list(TOKENS), policy_versions=[3, 3, 3]))


@dataclass
class Setup:
    gateways: list[GatewayServer]
    router: GatewayRouter
    sessions: list[AgentSession]
    rewards: dict[str, list[float]] = field(default_factory=dict)


@pytest.fixture
def setup() -> Iterator[Setup]:
    gateways = [GatewayServer(), GatewayServer()]
    router = GatewayRouter()
    for gw in gateways:
        router.add_backend(gw.gateway_id, f"http://{gw.host}:{gw.port}")
    sessions = [gw.open_session() for gw in gateways]
    s = Setup(gateways, router, sessions, {x.session_id: [] for x in sessions})
    threads = [threading.Thread(target=play_env, args=(x, s.rewards[x.session_id]), daemon=True) for x in sessions]
    for t in threads:
        t.start()
    try:
        yield s
    finally:
        router.shutdown()
        for gw in gateways:
            gw.shutdown()  # closes the sessions: the env threads end
        for t in threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in threads)


def clients(router: GatewayRouter, session: AgentSession, key: str | None = None) -> list[openai.OpenAI]:
    """The session's two clients through the router: base URL per session, and the shared
    ``/v1`` with the ``X-Session-ID`` header."""
    key = key or session.key
    return [openai.OpenAI(base_url=f"{router.base_url}/sessions/{session.session_id}/v1", api_key=key, max_retries=0),
            openai.OpenAI(base_url=f"{router.base_url}/v1", api_key=key, max_retries=0,
                          default_headers={SESSION_HEADER: session.session_id})]


def test_each_session_reaches_its_own_gateway(setup: Setup) -> None:
    assert setup.router.backends == {gw.gateway_id: f"http://127.0.0.1:{gw.port}" for gw in setup.gateways}
    assert len(setup.router.backends) == 2 and all(s.session_id[8] == "-" for s in setup.sessions)
    for session in setup.sessions:
        for client in clients(setup.router, session):
            r = client.chat.completions.create(model="policy", messages=MESSAGES, logprobs=True)
            assert r.choices[0].message.content == answer_of(session.session_id)
            assert [c.logprob for c in r.choices[0].logprobs.content] == LOG_PROBS
            assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (4, 3)

            chunks = list(client.chat.completions.create(model="policy", messages=MESSAGES, stream=True,
                                                         stream_options={"include_usage": True}))
            assert len(chunks) >= 3
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == answer_of(session.session_id)
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
            assert chunks[-1].usage.completion_tokens == 3

            assert [m.id for m in client.models.list().data] == ["agentrl-policy"]
    for session in setup.sessions:  # the reward route goes through the router too
        r = httpx.post(f"{setup.router.base_url}/sessions/{session.session_id}/reward", json={"reward": 0.75},
                       headers={"Authorization": f"Bearer {session.key}"})
        assert (r.status_code, r.json()) == (200, {"ok": True})
    for gw in setup.gateways:
        gw.shutdown()  # the env threads see "closed" after every event before it
    assert setup.rewards == {s.session_id: [0.75] for s in setup.sessions}


def test_errors_pass_through_and_the_routers_own(setup: Setup) -> None:
    router, session = setup.router, setup.sessions[0]
    for client in clients(router, session, key="wrong"):  # the backend's 401, its body unchanged
        with pytest.raises(openai.AuthenticationError) as err:
            client.chat.completions.create(model="policy", messages=MESSAGES)
        assert err.value.status_code == 401
        assert err.value.body["code"] == "invalid_api_key" and session.session_id in err.value.body["message"]
    r = httpx.post(f"{router.base_url}/sessions/{session.session_id}/v1/chat/completions",
                   json={"model": "policy", "messages": MESSAGES, "n": 2},
                   headers={"Authorization": f"Bearer {session.key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"  # the backend's 400, naming the field

    unknown = AgentSession("0badcafe-" + "0" * 32)
    assert "0badcafe" not in router.backends
    for client in clients(router, unknown):
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model="policy", messages=MESSAGES)
        body = err.value.body
        assert (err.value.status_code, body["type"], body["code"]) == (404, "not_found_error", "session_not_found")
        assert unknown.session_id in body["message"]
        assert all(gw.gateway_id in body["message"] for gw in setup.gateways)
    r = httpx.post(f"{router.base_url}/v1/chat/completions", json={"model": "policy", "messages": MESSAGES})
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}  # OpenAI's error schema
    assert r.json()["error"]["code"] == "session_not_found" and SESSION_HEADER in r.json()["error"]["message"]
    assert httpx.get(f"{router.base_url}/elsewhere").json()["error"]["type"] == "not_found_error"

    stopped = setup.gateways[0]
    stopped.shutdown()
    for client in clients(router, session):  # its backend no longer answers: 502 naming it
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(model="policy", messages=MESSAGES)
        assert err.value.status_code == 502 and err.value.body["code"] == "backend_unavailable"
        assert f"http://127.0.0.1:{stopped.port}" in err.value.body["message"]
    other = setup.sessions[1]  # the other gateway still serves
    assert clients(router, other)[1].chat.completions.create(
        model="policy", messages=MESSAGES).choices[0].message.content == answer_of(other.session_id)
    router.remove_backend(stopped.gateway_id)
    with pytest.raises(openai.NotFoundError):
        clients(router, session)[0].chat.completions.create(model="policy", messages=MESSAGES)


def test_a_stream_is_relayed_chunk_by_chunk(setup: Setup) -> None:
    """The backend sends its second event only once the client has read the first through the
    router: a router that buffered the answer would hand over both at once, 10 s later."""
    gw, release = setup.gateways[0], threading.Event()

    async def slow_stream() -> StreamingResponse:
        async def events():
            yield b"data: 1\n\n"
            await asyncio.to_thread(release.wait, 10)
            yield b"data: 2\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    gw.app.add_api_route("/v1/slow_stream", slow_stream, methods=["GET"])  # a route only this test serves
    with httpx.stream("GET", f"{setup.router.base_url}/v1/slow_stream",
                      headers={SESSION_HEADER: f"{gw.gateway_id}-any"}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = r.iter_raw()
        first = next(chunks)
        was_released = release.is_set()
        release.set()
        rest = b"".join(chunks)
    assert (first, was_released, rest) == (b"data: 1\n\n", False, b"data: 2\n\n")


def test_add_backend_refuses_what_is_no_gateway() -> None:
    router = GatewayRouter()
    try:
        with pytest.raises(ValueError, match="gateway_id='a-b'"):
            router.add_backend("a-b", "http://127.0.0.1:1")
        with pytest.raises(ValueError, match="base_url='127.0.0.1:1'"):
            router.add_backend("abcdef01", "127.0.0.1:1")
        router.add_backend("abcdef01", "http://127.0.0.1:1/")
        assert router.backends == {"abcdef01": "http://127.0.0.1:1"}
        router.remove_backend("abcdef01")
        router.remove_backend("abcdef01")
        assert router.backends == {}
    finally:
        router.shutdown()


@pytest.mark.parametrize("host,expected", [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "10.1.2.3"), ("::", "10.1.2.3"),
                                           ("::1", "[::1]")])
def test_rollout_actor_names_its_gateway(monkeypatch, host: str, expected: str) -> None:
    @dataclass
    class FakeGateway:
        host: str
        gateway_id: str = "0123abcd"
        port: int = 4321

    monkeypatch.setattr(rollout_actor, "gateway", lambda: FakeGateway(host))
    monkeypatch.setattr(rollout_actor.ray.util, "get_node_ip_address", lambda: "10.1.2.3")
    method = rollout_actor.RolloutActor.__ray_actor_class__.gateway_backend  # the class under @ray.remote
    assert method(None) == {"gateway_id": "0123abcd", "base_url": f"http://{expected}:4321"}


def test_shutdown_cuts_an_open_stream_and_returns_at_once() -> None:
    gw, router = GatewayServer(), GatewayRouter()
    try:
        router.add_backend(gw.gateway_id, f"http://127.0.0.1:{gw.port}")
        session = gw.open_session()
        conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
        conn.request("GET", f"/sessions/{session.session_id}/lifeline",
                     headers={"Authorization": f"Bearer {session.key}"})
        stream = conn.getresponse()
        assert stream.status == 200 and stream.read(1) == b"."  # the lifeline flows through the router
        t0 = time.monotonic()
        router.shutdown()
        assert time.monotonic() - t0 < 5 and not router._thread.is_alive()
        t1 = time.monotonic()
        try:
            while stream.read(1):  # the rest of the stream: cut, not flowing on
                pass
        except http.client.IncompleteRead:
            pass
        assert time.monotonic() - t1 < 5
    finally:
        router.shutdown()
        gw.shutdown()
