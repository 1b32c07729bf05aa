"""A real OpenAI-compatible HTTP server that plays a judge in tests: FastAPI and uvicorn in a
daemon thread on ``127.0.0.1`` (an ephemeral port), answering ``POST /v1/chat/completions``
with a non-streaming ``chat.completion`` whose content a Python function writes, and
``GET /v1/models``. Calls can be made to fail on purpose (``fail_next``): an HTTP status, a
hang longer than the client's timeout, a 200 whose body is no OpenAI response, an empty
content or no choices.

    judge = ScriptedJudge(lambda messages: '{"score": 1}')
    client = openai.OpenAI(base_url=judge.base_url, api_key="EMPTY")
    ...
    judge.shutdown()
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

_START_TIMEOUT_S = 30.0
FAILURES = ("timeout", "garbage", "empty", "no_choices")
GARBAGE = "<html><body>502 Bad Gateway (this is not an OpenAI response)</body></html>"


def ok_answer(messages: list[dict]) -> str:
    """The default answer: ``{"ok": true}`` whatever the messages."""
    return '{"ok": true}'


class ScriptedJudge:
    """An OpenAI-compatible judge server with scripted answers and failures.

    Args:
        answer: ``answer(messages) -> content``: the assistant content for the request's
            messages (called in a worker thread, so it may block or sleep); default
            ``'{"ok": true}'``.
        model: the id ``GET /v1/models`` lists (completions echo the request's ``model``).
        hang_s: how long a ``"timeout"`` failure waits before it answers (seconds); make it
            longer than the client's timeout. ``shutdown`` cuts the wait.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1``.
        requests: every chat-completion request body received, in arrival order (failed
            calls included).
        headers: the headers of those requests (lower-case names), in the same order.
        in_flight, max_in_flight: chat-completion requests being handled now, and the most
            handled at once since start.

    Raises:
        RuntimeError: the server did not start within 30 s.
    """

    def __init__(self, answer: Callable[[list[dict]], str] | None = None, *, model: str = "scripted-judge",
                 hang_s: float = 5.0) -> None:
        self.answer = answer or ok_answer
        self.model = model
        self.hang_s = hang_s
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._failures: list[int | str] = []
        self._lock = threading.Lock()
        self._stopping = False
        tcp = socket.create_server(("127.0.0.1", 0))
        self.port = int(tcp.getsockname()[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        config = uvicorn.Config(self._make_app(), log_level="warning", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [tcp]},
                                        name="scripted-judge", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the scripted judge on 127.0.0.1:{self.port} did not start "
                                   f"within {_START_TIMEOUT_S:g} s")
            time.sleep(0.01)

    def fail_next(self, n: int, status: int | str = 500) -> None:
        """Fail the next ``n`` chat-completion calls (after any failures already queued) with
        ``status``: an HTTP status (an OpenAI-shaped error body), ``"timeout"`` (answer only
        after ``hang_s``), ``"garbage"`` (a 200 whose body is HTML, not JSON), ``"empty"``
        (a completion with content ``""``) or ``"no_choices"`` (a completion with no choices).

        Raises:
            ValueError: ``status`` is none of these, or ``n`` is negative.
        """
        if n < 0 or not (isinstance(status, int) and 400 <= status <= 599 or status in FAILURES):
            raise ValueError(f"fail_next(n={n!r}, status={status!r}): expected n >= 0 and a status in "
                             f"400..599 or one of {FAILURES}")
        with self._lock:
            self._failures.extend([status] * n)

    def shutdown(self) -> None:
        """Stop the server (hanging calls are cut). Idempotent."""
        self._stopping = True
        self._server.should_exit = True
        self._thread.join(timeout=10)

    # --- the app ---------------------------------------------------------------------------
    def _make_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                                "owned_by": "scripted"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            with self._lock:
                self.requests.append(body)
                self.headers.append({k.lower(): v for k, v in request.headers.items()})
                failure = self._failures.pop(0) if self._failures else None
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await self._respond(body, failure)
            finally:
                with self._lock:
                    self.in_flight -= 1

        return app

    async def _respond(self, body: dict, failure: int | str | None):
        if isinstance(failure, int):
            return JSONResponse({"error": {"message": f"scripted failure: HTTP {failure}", "type": "scripted_error",
                                           "param": None, "code": str(failure)}}, status_code=failure)
        if failure == "timeout":
            deadline = time.monotonic() + self.hang_s
            while time.monotonic() < deadline and not self._stopping:
                await asyncio.sleep(0.02)
        if failure == "garbage":
            return PlainTextResponse(GARBAGE, media_type="text/html")
        messages = list(body.get("messages") or [])
        content = "" if failure == "empty" else await run_in_threadpool(self.answer, messages)
        return _completion(body.get("model", self.model), messages, content, choices=failure != "no_choices")


def _completion(model: str, messages: list[dict], content: str, *, choices: bool = True) -> dict:
    """A ``chat.completion`` object answering ``messages`` with ``content`` (usage counted in
    whitespace-separated words)."""
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    completion_tokens = len(content.split())
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop",
              "logprobs": None}
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice] if choices else [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def digit_judgement(messages: list[dict[str, Any]]) -> str:
    """A scripted judgement for MathAnswer's rubric: the start-up health check answers
    ``{"ok": true}``; an answer (between ``<answer>`` tags in the last message) is equivalent
    (1.0) when it holds a digit, else not (0.0)."""
    text = messages[-1]["content"]
    if "<answer>" not in text:  # the start-up health check
        return '{"ok": true}'
    graded = text.split("<answer>", 1)[1].split("</answer>", 1)[0]
    score = 1.0 if any(c.isdigit() for c in graded) else 0.0
    return json.dumps({"scores": {"equivalent": score}, "reason": f"scripted: {score}"})
