"""Chat Completions requests in, ChatCompletion and chunk dicts out (OpenAI's wire format).

``parse_request(body, temperature=..., top_p=..., top_k=..., max_new_tokens=...)`` checks a
``POST /v1/chat/completions`` body and returns a :class:`ChatRequest`, or raises
``GatewayError(400, param=<field>)`` for what the gateway cannot serve while training:
more than one choice (``n``), ``top_logprobs``, a ``response_format`` other than text, a
``tool_choice`` that forces a call, sampling parameters other than the run's (the trainer
scores every token at one sampling transform: docs/design.md, invariant 4), a last message
from the assistant (prefill).

``completion_response`` and ``stream_chunks`` build the answer as plain dicts that the
``openai`` SDK parses (``ChatCompletion`` / ``ChatCompletionChunk``), with vLLM's own
extra fields for token ids: top-level ``prompt_token_ids`` and ``choices[0].token_ids``
(the SDK keeps them in ``model_extra``), when the request asked with
``extra_body={"return_token_ids": True}``.

Why not vLLM's ``ChatCompletionRequest`` / ``ChatCompletionResponse``: importing
``vllm.entrypoints.openai.chat_completion.protocol`` takes about 10 s on 2 cores and loads
torch and transformers (about 540 MB), for a module that checks a dict. The fields here
keep vLLM's names (``return_token_ids``, ``prompt_token_ids``, ``token_ids``) and OpenAI's
schema, so the gateway and a vLLM server look the same to a client.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from agentrl.errors import ConfigError, ContractError
from agentrl.gateway.errors import GatewayError
from environments.tools import HermesToolParser

ROLES = ("system", "developer", "user", "assistant", "tool")
FINISH_REASONS = ("stop", "length", "tool_calls")
_UNSERVED = ("min_tokens", "ignore_eos", "allowed_token_ids", "bad_words", "guided_json", "guided_regex",
             "guided_choice", "guided_grammar", "structured_outputs", "prompt_logprobs", "use_beam_search",
             "best_of", "truncate_prompt_tokens", "return_tokens_as_token_ids")
"""vLLM request extras the gateway refuses (400): each constrains or alters sampling, or
changes what the reply means."""
_MIN_LOGPROB = -9999.0  # what vLLM reports for a -inf log-prob (JSON has no infinity)


class _Body(BaseModel):
    """The fields of a request body the gateway reads, typed; the rest are ignored."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]]
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    seed: int | None = None
    return_token_ids: bool | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None


@dataclass(frozen=True)
class ChatRequest:
    """A checked Chat Completions request.

    Attributes:
        messages: the conversation, normalized: each ``{"role", "content"}`` with content a
            str (a list of ``{"type": "text"}`` parts joined into one), ``"developer"``
            read as ``"system"``; an assistant message may add ``tool_calls`` (OpenAI
            entries, ``arguments`` a JSON str) and then has content ``None`` when it had
            none; a tool message keeps ``tool_call_id`` and ``name`` when given.
        tools: OpenAI function tools (``{"type": "function", "function": {...}}``), or
            ``None`` for none.
        tool_choice: ``"auto"`` or ``"none"``.
        max_tokens: the completion's token limit the client asked for (``max_completion_tokens``
            or ``max_tokens``), at most the run's ``max_new_tokens``; ``None``: no limit
            asked (the run's own applies).
        stop: stop strings.
        stream: answer as server-sent ``chat.completion.chunk`` events.
        include_usage: ``stream_options.include_usage``: a last chunk with ``usage``.
        logprobs: return each completion token's log-prob (nats).
        return_token_ids: return ``prompt_token_ids`` and ``token_ids`` (vLLM's fields).
        seed: the sampling seed asked for, or ``None``.
        model: the model name the client sent, or ``None``.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] = "auto"
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    return_token_ids: bool = False
    seed: int | None = None
    model: str | None = None


def _bad(param: str, message: str) -> GatewayError:
    return GatewayError(400, message, param=param)


def _loc(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a param name: ``("messages", 0, "role")`` → ``messages[0].role``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def text_content(content: Any, param: str) -> str | None:
    """``content`` as one str: a str as it is, ``None`` as ``None``, a list of
    ``{"type": "text", "text": str}`` parts joined.

    Raises:
        GatewayError: 400 for another type or a part that is not text.
    """
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(param, f"{param} is a {type(content).__name__}; expected a string or a list of text parts")
    texts: list[str] = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise _bad(f"{param}[{i}]", f"{param}[{i}] is a {kind!r} part; the gateway accepts text parts only "
                                         '({"type": "text", "text": "..."})')
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise _bad(param, f"{param} is a {type(calls).__name__}; expected a list of tool calls")
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments"), str) or call.get("type", "function") != "function"):
            raise _bad(f"{param}[{i}]", f"{param}[{i}] is {call!r}; expected "
                                         '{"id": str, "type": "function", "function": {"name": str, "arguments": str}}')
        out.append({"id": str(call.get("id") or ""), "type": "function",
                    "function": {"name": fn["name"], "arguments": fn["arguments"]}})
    return out


def _message(msg: dict[str, Any], i: int) -> dict[str, Any]:
    param = f"messages[{i}]"
    role = msg.get("role")
    if role not in ROLES:
        raise _bad(f"{param}.role", f"{param}.role is {role!r}; expected one of {list(ROLES)}")
    content = text_content(msg.get("content"), f"{param}.content")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    if role == "assistant":
        calls = _tool_calls(msg["tool_calls"], f"{param}.tool_calls") if msg.get("tool_calls") else []
        out["content"] = content if content is not None or calls else ""
        if calls:
            out["tool_calls"] = calls
        return out
    if content is None:
        raise _bad(f"{param}.content", f"{param} ({role}) has no content; expected a string")
    out["content"] = content
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(msg.get(key), str):
                out[key] = msg[key]
    return out


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise _bad(f"tools[{i}]", f"tools[{i}] has type {tool.get('type')!r}; the gateway serves function "
                                      'tools only ({"type": "function", "function": {...}})')
    try:
        HermesToolParser(tools)  # checks names, schemas and unique names, as the parser will
    except ConfigError as exc:
        raise _bad("tools", f"tools: {exc}") from None
    return [{"type": "function", "function": dict(t["function"])} for t in tools]


def _same_transform(param: str, asked: float | None, run: float, off: float | None = None) -> None:
    """Refuse a sampling parameter other than the run's (``off``: the value that means disabled)."""
    if asked is None:
        return
    if off is not None and asked <= off and run <= off:
        return
    if not math.isclose(asked, run, rel_tol=1e-9, abs_tol=1e-12):
        raise _bad(param, f"{param}={asked} differs from this run's {param}={run}: the trainer scores every token "
                          f"at one sampling transform; leave {param} unset or send {run}")


def _neutral(param: str, value: Any, neutral: Any) -> None:
    if value is not None and value != neutral:
        raise _bad(param, f"{param}={value!r} changes the sampling distribution, which the trainer does not "
                          f"reproduce; leave it unset or send {neutral!r}")


def parse_request(body: dict[str, Any], *, temperature: float, top_p: float, top_k: int,
                  max_new_tokens: int) -> ChatRequest:
    """Check a Chat Completions request body against what a training run can serve.

    Args:
        body: the JSON body (``extra_body`` keys of the ``openai`` SDK land at its top level).
        temperature, top_p, top_k: the run's sampling transform (``top_k <= 0``: off); a
            request may repeat them, never change them.
        max_new_tokens: the run's completion limit; a larger ``max_tokens`` is lowered to it.

    Returns:
        The request, normalized (:class:`ChatRequest`).

    Raises:
        GatewayError: 400, with ``param`` naming the field, for a body that does not parse;
            ``n`` > 1; ``top_logprobs`` > 0; a ``response_format`` other than text;
            ``tool_choice`` ``"required"`` or a named function; ``temperature``, ``top_p``
            or ``top_k`` other than the run's; penalties or ``logit_bias``; ``max_tokens``
            < 1; an empty stop string; one of vLLM's sampling extras (``_UNSERVED``:
            ``min_tokens``, ``ignore_eos``, guided decoding, ...); ``parallel_tool_calls``
            false; no messages, a message of an unknown role, content that is not text, a
            last message from the assistant; tools that are not function tools or whose
            schema is invalid.
    """
    if not isinstance(body, dict):
        raise _bad("body", f"the request body is a {type(body).__name__}; expected a JSON object")
    try:
        req = _Body.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = _loc(err["loc"]) or "body"
        raise _bad(param, f"{param}: {err['msg']} (got {err.get('input')!r})") from None
    if req.n is not None and req.n != 1:
        raise _bad("n", f"n={req.n}: the gateway samples one choice per request; send n=1 and repeat the request")
    if req.top_logprobs:
        raise _bad("top_logprobs", f"top_logprobs={req.top_logprobs}: the gateway returns the sampled token's "
                                   "log-prob only (logprobs=true); send top_logprobs=0")
    if req.response_format is not None and req.response_format.get("type", "text") != "text":
        raise _bad("response_format", f"response_format type {req.response_format.get('type')!r}: constrained "
                                      "decoding changes the sampling distribution; only {\"type\": \"text\"} is served")
    tool_choice = req.tool_choice if req.tool_choice is not None else "auto"
    if tool_choice not in ("auto", "none"):
        raise _bad("tool_choice", f"tool_choice={tool_choice!r}: forcing a tool call constrains decoding, which the "
                                  "trainer does not reproduce; send \"auto\" or \"none\"")
    _same_transform("temperature", req.temperature, temperature)
    _same_transform("top_p", req.top_p, top_p)
    _same_transform("top_k", req.top_k, top_k, off=0)
    for param, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0),
                           ("min_p", 0.0)):
        _neutral(param, getattr(req, param), neutral)
    _neutral("logit_bias", req.logit_bias or None, None)
    limit_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise _bad(limit_param, f"{limit_param}={max_tokens}; expected at least 1")
    if not req.messages:
        raise _bad("messages", "messages is empty; expected at least one message")
    messages = [_message(m, i) for i, m in enumerate(req.messages)]
    if messages[-1]["role"] == "assistant":
        raise _bad("messages", f"the last message (messages[{len(messages) - 1}]) is the assistant's; the gateway "
                               "does not continue a prefilled assistant message: end with a user or tool message")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if any(not isinstance(x, str) or not x for x in stop):
        raise _bad("stop", f"stop={req.stop!r}: every stop string must be a non-empty string")
    for param in _UNSERVED:
        if body.get(param) not in (None, False):
            raise _bad(param, f"{param}={body[param]!r}: vLLM's sampling extras change what is sampled or "
                              "how, which the trainer does not reproduce; the gateway serves plain sampling")
    if body.get("parallel_tool_calls") is False:
        raise _bad("parallel_tool_calls", "parallel_tool_calls=false: the gateway cannot hold the model to one "
                                          "call per reply; leave it unset (or true) and run the calls it makes")
    return ChatRequest(
        messages=messages,
        tools=_tools(req.tools),
        tool_choice=tool_choice,  # type: ignore[arg-type]  # checked above
        max_tokens=None if max_tokens is None else min(max_tokens, max_new_tokens),
        stop=stop,
        stream=bool(req.stream),
        include_usage=bool((req.stream_options or {}).get("include_usage")),
        logprobs=bool(req.logprobs),
        return_token_ids=bool(req.return_token_ids),
        seed=req.seed,
        model=req.model,
    )


# --- responses ---------------------------------------------------------------------------
class Reply(Protocol):
    """What the response builders read from one sampled completion (the session's
    ``AgentReply`` has these attributes).

    Attributes:
        content: the assistant's text (``agentrl.gateway.tool_calls.parse_tool_calls``), or
            ``None`` with tool calls and no text.
        tool_calls: OpenAI ``tool_calls`` entries (``arguments`` a JSON str).
        finish_reason: ``"stop"``, ``"length"`` or ``"tool_calls"``.
        prompt_ids: the prompt's token ids, ``[P]`` ints.
        completion_ids: the sampled ids, ``[C]`` ints, the stop token included (it is not
            in ``content``).
        log_probs: each sampled id's log-prob (nats), ``[C]`` floats.
        tokens: each sampled id decoded alone, ``[C]`` strs.
    """

    content: str | None
    tool_calls: Sequence[dict[str, Any]]
    finish_reason: str
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    log_probs: Sequence[float]
    tokens: Sequence[str]


def _check(reply: Reply) -> None:
    """Raises ContractError: ``log_probs`` or ``tokens`` differ in length from
    ``completion_ids``, or ``finish_reason`` is not one of :data:`FINISH_REASONS`."""
    n = len(reply.completion_ids)
    if len(reply.log_probs) != n or len(reply.tokens) != n:
        raise ContractError(f"completion of {n} ids has {len(reply.log_probs)} log-probs and "
                            f"{len(reply.tokens)} token strings; expected {n} of each")
    if reply.finish_reason not in FINISH_REASONS:
        raise ContractError(f"finish_reason={reply.finish_reason!r}; expected one of {list(FINISH_REASONS)}")


def new_response_id() -> str:
    """A fresh response id, ``"chatcmpl-"`` and 32 hex digits."""
    return f"chatcmpl-{secrets.token_hex(16)}"


def _usage(c: Reply) -> dict[str, int]:
    p, n = len(c.prompt_ids), len(c.completion_ids)
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}


def _logprobs(c: Reply) -> dict[str, Any]:
    content = []
    for token, lp in zip(c.tokens, c.log_probs):
        lp = float(lp)
        content.append({"token": token, "logprob": lp if math.isfinite(lp) else _MIN_LOGPROB,
                        "bytes": list(token.encode("utf-8")), "top_logprobs": []})
    return {"content": content}


def completion_response(request: ChatRequest, reply: Reply, *, model: str,
                        response_id: str | None = None, created: int | None = None) -> dict[str, Any]:
    """The non-streaming answer, a ``chat.completion`` dict.

    ``choices[0].logprobs.content`` (one entry per completion id) when the request asked for
    ``logprobs``; top-level ``prompt_token_ids`` and ``choices[0].token_ids`` when it asked
    for ``return_token_ids``.

    Args:
        request: the parsed request (its ``logprobs`` and ``return_token_ids`` flags).
        reply: what was sampled (:class:`Reply`).
        model: the model name to report.
        response_id: default a fresh ``chatcmpl-`` id; created: Unix seconds, default now.

    Raises:
        ContractError: ``reply`` is inconsistent (see :class:`Reply`).
    """
    _check(reply)
    message: dict[str, Any] = {"role": "assistant",
                               "content": reply.content if reply.content is not None or reply.tool_calls else ""}
    if reply.tool_calls:
        message["tool_calls"] = [dict(call) for call in reply.tool_calls]
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reply.finish_reason,
                              "logprobs": _logprobs(reply) if request.logprobs else None}
    out: dict[str, Any] = {
        "id": response_id or new_response_id(),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [choice],
        "usage": _usage(reply),
    }
    if request.return_token_ids:
        choice["token_ids"] = list(reply.completion_ids)
        out["prompt_token_ids"] = list(reply.prompt_ids)
    return out


def stream_chunks(request: ChatRequest, reply: Reply, *, model: str,
                  response_id: str | None = None, created: int | None = None) -> list[dict[str, Any]]:
    """The streaming answer, ``chat.completion.chunk`` dicts in order, each one ``data:`` event.

    1. the role (``delta = {"role": "assistant", "content": ""}``), with top-level
       ``prompt_token_ids`` when the request asked for ``return_token_ids``;
    2. the content (``""`` when there is none), with ``logprobs`` when asked and
       ``choices[0].token_ids`` (every completion id) when asked;
    3. the tool calls, all in one chunk (``index``, ``id``, ``type``, ``function``), if any;
    4. the finish (``delta = {}``, ``finish_reason``);
    5. with ``include_usage``: ``choices = []`` and ``usage`` (the other chunks carry
       ``usage: null``, as OpenAI's do).

    Arguments and errors as for :func:`completion_response`.
    """
    _check(reply)
    rid = response_id or new_response_id()
    ts = int(time.time()) if created is None else created

    def chunk(delta: dict[str, Any], **choice_extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": ts, "model": model,
                               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
                                            **choice_extra}]}
        if request.include_usage:
            out["usage"] = None
        return out

    first = chunk({"role": "assistant", "content": ""})
    if request.return_token_ids:
        first["prompt_token_ids"] = list(reply.prompt_ids)
    extra: dict[str, Any] = {}
    if request.logprobs:
        extra["logprobs"] = _logprobs(reply)
    if request.return_token_ids:
        extra["token_ids"] = list(reply.completion_ids)
    chunks = [first, chunk({"content": reply.content or ""}, **extra)]
    if reply.tool_calls:
        calls = [{"index": i, **call} for i, call in enumerate(reply.tool_calls)]
        chunks.append(chunk({"tool_calls": calls}))
    chunks.append(chunk({}, finish_reason=reply.finish_reason))
    if request.include_usage:
        chunks.append({"id": rid, "object": "chat.completion.chunk", "created": ts, "model": model,
                       "choices": [], "usage": _usage(reply)})
    return chunks
