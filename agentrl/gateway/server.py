"""The gateway's HTTP face: OpenAI's Chat Completions API over the rollout engine of this
process, one session per episode.

Routes (every error in OpenAI's error schema, ``{"error": {"message", "type", "param",
"code"}}``):

* ``POST /sessions/{id}/v1/chat/completions``: a chat call of session ``id``; its key as
  ``Authorization: Bearer <key>`` (what the ``openai`` SDK sends for ``api_key``). ``stream``
  true answers with server-sent ``chat.completion.chunk`` events, then ``[DONE]``.
* ``POST /v1/chat/completions`` with the header ``X-Session-ID: <id>``: the same, for
  harnesses that cannot change their base URL per episode; the key still decides what the
  caller may write.
* ``GET /sessions/{id}/v1/models``, ``GET /v1/models``: the one model (the policy).
* ``POST /sessions/{id}/reward`` with ``{"reward": <number>}``: the episode's reward, with
  the session's reward key (its chat key, unless the session has a separate one).
* ``GET /sessions/{id}/lifeline``: held open while the session lives (a byte a second), so
  the forwarder of an agent command in a sandbox stops the command when its episode ends.

Unknown session: 404 (``not_found_error``); missing or wrong key: 401
(``authentication_error``); a refused parameter: 400 naming it (``agentrl.gateway.protocol``).

The server is one per process (``gateway()``), started on first use on an ephemeral port of
``AGENTRL_GATEWAY_HOST`` (default ``127.0.0.1``) in a daemon thread running uvicorn; the
rollout worker of this process serves every session's calls with its engine. The same app
also listens on a Unix socket, ``gateway.sock`` in a directory of its own (``socket_dir``,
mode 0755, with the forwarder script ``forward.py`` beside it): sandboxes get that directory
bound read-only at ``SANDBOX_GATEWAY_DIR`` (``mount()``) and reach the gateway through it,
with no network (``agentrl.gateway.agent_command``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentrl.errors import InfraError
from agentrl.gateway.errors import GatewayError
from agentrl.gateway.protocol import completion_response, parse_request, stream_chunks
from agentrl.gateway.session import AgentReply, AgentSession, SessionSettings

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-ID"
SANDBOX_GATEWAY_DIR = "/run/agentrl-gateway"
"""Where a sandbox sees the gateway's socket directory (``gateway.sock``, ``forward.py``)."""
SOCKET_NAME = "gateway.sock"
FORWARDER_NAME = "forward.py"
LIFELINE_INTERVAL_S = 0.5
_START_TIMEOUT_S = 30.0
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, with its NUL
_FORWARDER_SOURCE = os.path.join(os.path.dirname(__file__), "forwarder.py")


def _error(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


class GatewayServer:
    """The HTTP server and its sessions (module docstring).

    Args:
        host: the address to listen on.
        port: the port; 0 picks a free one (``port`` holds it once started).

    Attributes:
        gateway_id: 8 hex digits, the prefix of every session id this server mints.
        port: the TCP port.
        socket_dir: the host directory of the Unix socket and the forwarder script.

    Raises:
        InfraError: the server could not listen, or did not start within 30 s.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.gateway_id = uuid.uuid4().hex[:8]
        self._sessions: dict[str, AgentSession] = {}
        self._lock = threading.Lock()
        self.app = self._make_app()
        self.socket_dir = _socket_dir(self.gateway_id)
        tcp = None
        try:
            tcp = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
            uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            uds.bind(os.path.join(self.socket_dir, SOCKET_NAME))
            uds.listen(1024)
            # the sandbox's user is not this process's: anyone may connect (the session key
            # decides what a caller may do) and read the forwarder, nobody else may write
            os.chmod(os.path.join(self.socket_dir, SOCKET_NAME), 0o666)
            shutil.copyfile(_FORWARDER_SOURCE, os.path.join(self.socket_dir, FORWARDER_NAME))
            os.chmod(os.path.join(self.socket_dir, FORWARDER_NAME), 0o644)
            os.chmod(self.socket_dir, 0o755)
        except OSError as exc:
            if tcp is not None:
                tcp.close()
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            raise InfraError(f"the gateway could not listen on {host}:{port} and {self.socket_dir}: {exc}") from exc
        self.port = int(tcp.getsockname()[1])
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        self._server, self._thread = serve_in_thread(config, "agentrl-gateway", f"the gateway server on {host}:{port}",
                                                     sockets=[tcp, uds])

    # --- sessions ------------------------------------------------------------------------
    def open_session(self, settings: SessionSettings | None = None, session_id: str | None = None, *,
                     separate_reward_key: bool = False) -> AgentSession:
        """A new session (its key in ``session.key``, its reward key in ``session.reward_key``);
        its id starts with ``gateway_id`` and a dash, so a router in front of several gateways
        sends its calls here."""
        sid = session_id or f"{self.gateway_id}-{uuid.uuid4().hex}"
        session = AgentSession(sid, settings, separate_reward_key=separate_reward_key)
        with self._lock:
            if sid in self._sessions:
                raise GatewayError(409, f"session {sid!r} exists already", type="invalid_request_error")
            self._sessions[sid] = session
        return session

    def close_session(self, session: AgentSession) -> None:
        """Close ``session`` (its waiting calls get a 409) and forget it. Idempotent."""
        session.close()
        with self._lock:
            self._sessions.pop(session.session_id, None)

    def base_url(self, session: AgentSession | None = None, host: str | None = None) -> str:
        """The OpenAI base URL of ``session`` (``.../sessions/{id}/v1``), or the shared one
        (``.../v1``, with ``X-Session-ID``) for None; ``host`` overrides the address."""
        root = f"http://{host or self.host}:{self.port}"
        return f"{root}/sessions/{session.session_id}/v1" if session is not None else f"{root}/v1"

    def mount(self) -> tuple[str, str]:
        """``(socket_dir, SANDBOX_GATEWAY_DIR)``: the read-only mount (``SandboxSpec.ro_mounts``)
        through which a sandbox on this machine reaches this gateway."""
        return self.socket_dir, SANDBOX_GATEWAY_DIR

    @property
    def open_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def shutdown(self) -> None:
        """Close every session and stop the server."""
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            self.close_session(s)
        self._server.should_exit = True
        self._thread.join(timeout=10)
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def _session(self, request: Request, session_id: str | None, *, reward: bool = False) -> AgentSession:
        sid = session_id or request.headers.get(SESSION_HEADER)
        if not sid:
            raise GatewayError(404, f"no session: call /sessions/<id>/v1/... or send the {SESSION_HEADER} header",
                               type="not_found_error", code="session_not_found")
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
            raise GatewayError(404, f"session {sid!r} does not exist (or its episode has ended)",
                               type="not_found_error", param=None, code="session_not_found")
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not given or not _same(given, session.reward_key if reward else session.key):
            what = "reward key" if reward and session.reward_key != session.key else "API key"
            raise GatewayError(401, f"wrong or missing {what} for session {sid!r}: send it as "
                                    "'Authorization: Bearer <key>' (the openai SDK's api_key)",
                               type="authentication_error", code="invalid_api_key")
        return session

    # --- the app -------------------------------------------------------------------------
    def _make_app(self) -> FastAPI:
        app = FastAPI(title="agentrl gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(GatewayError)
        async def gateway_error(_request: Request, exc: GatewayError) -> JSONResponse:
            return _error(exc)

        @app.post("/sessions/{session_id}/v1/chat/completions")
        async def chat_in_session(session_id: str, request: Request) -> Any:
            return await self._chat(request, session_id)

        @app.post("/v1/chat/completions")
        async def chat_by_header(request: Request) -> Any:
            return await self._chat(request, None)

        @app.get("/sessions/{session_id}/v1/models")
        async def models_in_session(session_id: str, request: Request) -> Any:
            return self._models(self._session(request, session_id))

        @app.get("/v1/models")
        async def models_by_header(request: Request) -> Any:
            return self._models(self._session(request, None))

        @app.post("/sessions/{session_id}/reward")
        async def reward(session_id: str, request: Request) -> Any:
            session = self._session(request, session_id, reward=True)
            body = await _json_body(request)
            value = body.get("reward")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise GatewayError(400, f"reward={value!r}; expected a finite number", param="reward")
            session.post_reward(float(value))
            return {"ok": True}

        @app.get("/sessions/{session_id}/lifeline")
        async def lifeline(session_id: str, request: Request) -> Any:
            session = self._session(request, session_id)

            async def beats():
                while not session.closed:
                    yield b"."
                    await asyncio.sleep(LIFELINE_INTERVAL_S)

            return StreamingResponse(beats(), media_type="application/octet-stream")

        return app

    @staticmethod
    def _models(session: AgentSession) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": session.settings.model_name, "object": "model",
                                            "created": 0, "owned_by": "agentrl"}]}

    async def _chat(self, request: Request, session_id: str | None) -> Any:
        session = self._session(request, session_id)
        body = await _json_body(request)
        s = session.settings
        req = parse_request(body, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                            max_new_tokens=s.max_new_tokens)
        call = session.submit(req)
        try:
            reply: AgentReply = await asyncio.wrap_future(call.future)
        finally:
            session.forget(call)
        model = req.model or s.model_name
        if not req.stream:
            return JSONResponse(completion_response(req, reply, model=model))
        chunks = stream_chunks(req, reply, model=model)

        async def events():
            for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def _socket_dir(gateway_id: str) -> str:
    """A new directory for the Unix socket: under the temporary directory, or under
    ``/tmp`` when that path would be too long for a socket (108 bytes on Linux)."""
    prefix = f"agentrl-gateway-{gateway_id}-"
    base = tempfile.gettempdir()
    if len(os.path.join(base, prefix + "x" * 8, SOCKET_NAME).encode()) > _SOCKET_PATH_MAX:
        base = "/tmp"
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def serve_in_thread(config: uvicorn.Config, name: str, what: str,
                    sockets: list[socket.socket] | None = None) -> tuple[uvicorn.Server, threading.Thread]:
    """Run a uvicorn server of ``config`` in a daemon thread ``name`` (on ``sockets`` when
    given, else config's host and port) and wait until it serves.

    Raises:
        InfraError: it did not start within 30 s (``what`` names it).
    """
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise InfraError(f"{what} did not start within {_START_TIMEOUT_S:g} s")
        time.sleep(0.01)
    return server, thread


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except Exception as exc:
        raise GatewayError(400, f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise GatewayError(400, f"the request body is a JSON {type(body).__name__}; expected an object")
    return body


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


_server: GatewayServer | None = None
_server_lock = threading.Lock()
_router_url: str | None = None


def set_router_url(url: str | None) -> None:
    """The run's router in front of every engine's gateway (``.../v1``; None: none), which
    ``shared_base_url`` gives agents of this process."""
    global _router_url
    _router_url = url


def shared_base_url() -> str:
    """The one base URL (``.../v1``) where a harness that names its session in the
    ``X-Session-ID`` header reaches its session: the run's router when it has one, else this
    process's gateway."""
    return _router_url or gateway().base_url()


def gateway() -> GatewayServer:
    """This process's gateway server, started on first use (module docstring)."""
    global _server
    with _server_lock:
        if _server is None:
            _server = GatewayServer(host=os.environ.get("AGENTRL_GATEWAY_HOST", "127.0.0.1"))
        return _server
