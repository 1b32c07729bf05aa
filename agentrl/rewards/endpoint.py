"""A judge behind an OpenAI-compatible endpoint (a hosted API, or vLLM / SGLang serving
elsewhere), called with the official ``openai`` SDK (sync client, thread-safe).

The SDK's own retries are off; ``EndpointJudge`` retries by itself, with exponential backoff
and jitter, on what can pass (connection errors, timeouts, HTTP 429 and 5xx, an empty or
malformed answer, HTTP 408) and never on another 4xx (the request itself is wrong). A bounded
semaphore limits the calls in flight across all threads of the process that share the judge.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import openai
from openai.types.chat import ChatCompletion

from agentrl.errors import ConfigError, JudgeError
from agentrl.rewards.types import JudgeReply, JudgeRequest

NO_KEY = "EMPTY"  # what the SDK gets without a key (servers without auth ignore it)
CHECK_PROMPT = 'Reply with exactly this JSON object and nothing else: {"ok": true}'
CHECK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
CHECK_MAX_TOKENS = 16
_EXCERPT_CHARS = 200
MAX_BACKOFF_S = 30.0
"""The longest wait before a retry, before jitter (x0.5 to x1.5): ``backoff_s * 2**k`` is capped here."""


def worst_case_s(timeout_s: float, max_retries: int, backoff_s: float) -> float:
    """The longest one ``complete`` can take: every attempt timing out, every backoff at its
    largest (seconds), without the wait for a concurrency slot."""
    waits = sum(min(MAX_BACKOFF_S, backoff_s * 2**k) * 1.5 for k in range(max_retries))
    return timeout_s * (max_retries + 1) + waits
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _BadReply(Exception):
    """A 200 whose answer cannot be used (no choices, empty content, not a completion)."""


class EndpointJudge:
    """The ``Judge`` protocol over an OpenAI-compatible chat-completions endpoint.

    Args:
        base_url: the API root, ``http(s)://host[:port]/v1``.
        model: the model id sent with each call.
        api_key_env: the name of the environment variable that holds the API key (read once,
            here), or None for an endpoint without auth (the SDK then sends ``EMPTY``). A key
            itself is never an argument.
        max_concurrency: calls in flight at once across all threads (>= 1).
        max_retries: retries after the first attempt (>= 0): at most ``1 + max_retries``
            attempts per ``complete``.
        backoff_s: the wait before retry ``k`` (0-based) is ``backoff_s * 2**k`` seconds,
            times a jitter factor in [0.5, 1.5).
        timeout_s: seconds one attempt may take (connect to last byte).
        temperature: the sampling temperature (>= 0).
        max_tokens: the most tokens the judge may write per call (>= 1).
        structured: send ``response_format`` with the request's JSON schema (guided decoding
            on servers that support it); False sends no ``response_format``.

    Attributes:
        calls, retries, failures: ``complete`` calls made, retry attempts made, and calls
            that ended in ``JudgeError`` (thread-safe counters, for metrics; ``check`` is not
            counted).

    Raises:
        ConfigError: a value out of range (named), or ``api_key_env`` names a variable that
            is unset or is not a variable name.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = None, max_concurrency: int = 8,
                 max_retries: int = 3, backoff_s: float = 1.0, timeout_s: float = 120.0, temperature: float = 0.0,
                 max_tokens: int = 1024, structured: bool = True) -> None:
        _validate(base_url, model, max_concurrency, max_retries, backoff_s, timeout_s, temperature, max_tokens)
        self.base_url = base_url
        self.model = model
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.timeout_s = float(timeout_s)
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self.structured = structured
        self.calls = 0
        self.retries = 0
        self.failures = 0
        self._client = openai.OpenAI(base_url=base_url, api_key=_api_key(api_key_env), max_retries=0,
                                     timeout=self.timeout_s)
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._counter_lock = threading.Lock()
        self._rng = random.Random()
        self._rng_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"EndpointJudge(base_url={self.base_url!r}, model={self.model!r})"

    def complete(self, request: JudgeRequest) -> JudgeReply:
        """The judge's answer to ``request`` (``latency_s``: seconds from this call to its
        answer, waits for a free slot and retries included).

        Raises:
            JudgeError: no usable answer after ``1 + max_retries`` attempts (the message names
                the base URL, the model, the attempts and the last error), or at once on an
                HTTP 4xx other than 429.
        """
        self._count("calls")
        start = time.monotonic()
        fmt = ({"type": "json_schema", "json_schema": {"name": "judgement", "schema": request.json_schema}}
               if self.structured else None)
        attempts = 1 + self.max_retries
        for k in range(attempts):
            try:
                text, model = self._attempt(list(request.messages), self.max_tokens, fmt)
                return JudgeReply(text=text, model=model, latency_s=time.monotonic() - start)
            except (openai.APIError, _BadReply) as exc:
                last = self._describe(exc)
                if not _retryable(exc):
                    self._count("failures")
                    raise JudgeError(f"judge {self.model!r} at {self.base_url} refused the request "
                                     f"(attempt {k + 1} of {attempts}, not retried): {last}") from exc
                if k == attempts - 1:
                    self._count("failures")
                    raise JudgeError(f"judge {self.model!r} at {self.base_url} did not answer after {attempts} "
                                     f"attempt(s); last error: {last}") from exc
            self._count("retries")
            time.sleep(self._backoff(k))
        raise AssertionError("unreachable")  # the loop returns or raises

    def check(self) -> None:
        """One tiny call (a prompt asking for ``{"ok": true}``, ``max_tokens=16``, no retry):
        the endpoint answers, within ``timeout_s``, with JSON.

        Raises:
            JudgeError: the endpoint is down, timed out, answered an HTTP error (status and
                body excerpt), an unusable completion, or text that is not JSON; the message
                names the base URL and the model.
        """
        fmt = ({"type": "json_schema", "json_schema": {"name": "health_check", "schema": CHECK_SCHEMA}}
               if self.structured else None)
        where = f"judge {self.model!r} at {self.base_url}"
        try:
            text, _ = self._attempt([{"role": "user", "content": CHECK_PROMPT}], CHECK_MAX_TOKENS, fmt)
        except (openai.APIError, _BadReply) as exc:
            raise JudgeError(f"{where} failed its health check: {self._describe(exc)}") from exc
        try:
            answer = json.loads(text)
        except ValueError as exc:
            raise JudgeError(f"{where} failed its health check: asked for {{\"ok\": true}}, it answered "
                             f"{_excerpt(text)!r}, which is not JSON") from exc
        if not (isinstance(answer, dict) and answer.get("ok") is True):
            raise JudgeError(f"{where} failed its health check: asked for {{\"ok\": true}}, it answered "
                             f"{_excerpt(text)!r}")

    # --- internals -------------------------------------------------------------------------
    def _attempt(self, messages: list[dict[str, Any]], max_tokens: int,
                 fmt: dict[str, Any] | None) -> tuple[str, str]:
        """``(content, model)`` of one call, holding a concurrency slot for its duration."""
        kwargs: dict[str, Any] = {"response_format": fmt} if fmt is not None else {}
        with self._slots:
            try:
                response = self._client.chat.completions.create(
                    model=self.model, messages=messages, temperature=self.temperature, max_tokens=max_tokens,
                    **kwargs)
            except json.JSONDecodeError as exc:  # a JSON content type over a body that is not JSON
                raise _BadReply(f"a body that is not JSON ({exc})") from exc
        return _content(response, self.model)

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, openai.APITimeoutError):
            return f"timed out after {self.timeout_s:g} s"
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            return f"connection failed ({cause or exc})"
        if isinstance(exc, openai.APIStatusError):
            return f"HTTP {exc.status_code}: {_excerpt(exc.response.text)!r}"
        return str(exc)

    def _backoff(self, k: int) -> float:
        with self._rng_lock:
            jitter = 0.5 + self._rng.random()
        return min(MAX_BACKOFF_S, self.backoff_s * 2**k) * jitter

    def _count(self, name: str) -> None:
        with self._counter_lock:
            setattr(self, name, getattr(self, name) + 1)


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 429) or exc.status_code >= 500  # 408: the server timed the request out
    return True  # connection errors, timeouts, unusable answers


def _content(response: object, model: str) -> tuple[str, str]:
    """``(content, model the response names)`` of a chat completion.

    Raises:
        _BadReply: not a chat completion, no choices, or empty content.
    """
    if not isinstance(response, ChatCompletion):
        raise _BadReply(f"not an OpenAI chat completion: {_excerpt(str(response))!r}")
    try:
        choices = response.choices
        if not choices:
            raise _BadReply("a completion with no choices")
        content = choices[0].message.content
    except (AttributeError, TypeError, IndexError) as exc:  # a JSON body without the completion's fields
        raise _BadReply(f"not an OpenAI chat completion: {_excerpt(repr(response))!r}") from exc
    if not isinstance(content, str) or not content.strip():
        raise _BadReply(f"empty content (finish_reason={choices[0].finish_reason!r})")
    return content, getattr(response, "model", None) or model


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _api_key(api_key_env: str | None) -> str:
    if api_key_env is None:
        return NO_KEY
    if not isinstance(api_key_env, str) or not _ENV_NAME.fullmatch(api_key_env):
        # never echo the value: it may be a key pasted where its variable's name belongs
        raise ConfigError("api_key_env must be the name of an environment variable (e.g. OPENAI_API_KEY), "
                          "not a key or anything else")
    key = os.environ.get(api_key_env)
    if not key:
        raise ConfigError(f"api_key_env={api_key_env!r}: the environment variable {api_key_env} is unset or empty; "
                          f"export it with the judge endpoint's API key")
    return key


def _validate(base_url: str, model: str, max_concurrency: int, max_retries: int, backoff_s: float,
              timeout_s: float, temperature: float, max_tokens: int) -> None:
    parts = urlsplit(base_url) if isinstance(base_url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"base_url={base_url!r}: expected an http(s) URL such as http://host:8000/v1")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"model={model!r}: expected a non-empty model id")
    for name, value, low in (("max_concurrency", max_concurrency, 1), ("max_retries", max_retries, 0),
                             ("max_tokens", max_tokens, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{name}={value!r}: expected an integer >= {low}")
    for name, value in (("backoff_s", backoff_s), ("temperature", temperature)):
        if not _real(value) or value < 0:
            raise ConfigError(f"{name}={value!r}: expected a finite number >= 0")
    if not _real(timeout_s) or timeout_s <= 0:
        raise ConfigError(f"timeout_s={timeout_s!r}: expected a finite number of seconds > 0")


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
