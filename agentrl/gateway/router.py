"""One address in front of several gateways: a reverse proxy that sends each session's calls
to the gateway that minted the session.

Every rollout process runs its own gateway (``agentrl.gateway.server``), and every session id
a gateway mints starts with that gateway's ``gateway_id`` and a dash (``"3fa2c1d0-<uuid>"``).
The router forwards each request under ``/sessions/{id}/...``, and under ``/v1/...`` with the
``X-Session-ID: <id>`` header, to the backend registered for the part of ``id`` before its
first dash: method, path, query, body and end-to-end headers (``Authorization``,
``X-Session-ID``, ``Content-Type``, ...; hop-by-hop headers dropped). The backend's answer
comes back unchanged and unbuffered: status, headers, body bytes; server-sent events of a
``stream: true`` call arrive chunk by chunk.

The router's own errors, in OpenAI's error schema (``agentrl.gateway.errors``): no session id,
or a session whose prefix is no known backend: 404 (``session_not_found``); a backend that does
not answer: 502 (``backend_unavailable``) naming its URL. Connecting to a backend times out
after ``connect_timeout_s``; reads never time out (a turn may sample for minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentrl.errors import ConfigError
from agentrl.gateway.errors import GatewayError
from agentrl.gateway.server import SESSION_HEADER, serve_in_thread

log = logging.getLogger(__name__)

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
# RFC 9110 section 7.6.1, plus what the router sets itself (host, content-length of the request)
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                         "te", "trailer", "trailers", "transfer-encoding", "upgrade"})


def _end_to_end(pairs: list[tuple[str, str]], drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """The header ``pairs`` less hop-by-hop ones (and those the ``Connection`` header names)
    and ``drop`` (lower-case names); repeated headers stay repeated, in order."""
    named = {h.strip().lower() for k, v in pairs if k.lower() == "connection" for h in v.split(",")}
    skip = _HOP_BY_HOP | named | drop
    return [(k, v) for k, v in pairs if k.lower() not in skip]


class GatewayRouter:
    """The router's HTTP server and its backends (module docstring).

    Args:
        host: the address to listen on.
        port: the port; 0 picks a free one (``port`` holds it once started).
        connect_timeout_s: seconds to wait for a backend to accept a connection before the
            call gets a 502.

    Raises:
        InfraError: the server did not start within 30 s.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, connect_timeout_s: float = 5.0) -> None:
        self.host = host
        self.connect_timeout_s = connect_timeout_s
        self._backends: dict[str, str] = {}
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: set[httpx.Response] = set()  # upstream answers being relayed
        self._closing = False
        self.app = self._make_app()
        # the backend's own date and server headers pass through; the router adds none
        config = uvicorn.Config(self.app, host=host, port=port, log_level="warning", lifespan="on",
                                access_log=False, server_header=False, date_header=False)
        self._server, self._thread = serve_in_thread(config, "agentrl-gateway-router",
                                                     f"the gateway router on {host}:{port}")
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])

    # --- backends ------------------------------------------------------------------------
    def add_backend(self, gateway_id: str, base_url: str) -> None:
        """Route sessions whose id starts with ``gateway_id + "-"`` to the gateway at
        ``base_url`` (``http://host:port``, no path); replaces an earlier URL of that id.

        Raises:
            ConfigError: ``gateway_id`` is empty or holds a dash, or ``base_url`` is not an
                ``http://`` / ``https://`` URL.
        """
        if not gateway_id or "-" in gateway_id:
            raise ConfigError(f"gateway_id={gateway_id!r}; expected the gateway's id (8 hex chars, no dash)")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url={base_url!r}; expected http://<host>:<port> of a gateway")
        with self._lock:
            self._backends[gateway_id] = base_url.rstrip("/")

    def remove_backend(self, gateway_id: str) -> None:
        """Stop routing to ``gateway_id``; its sessions then get a 404. Idempotent."""
        with self._lock:
            self._backends.pop(gateway_id, None)

    @property
    def backends(self) -> dict[str, str]:
        """A copy of ``{gateway_id: base_url}``."""
        with self._lock:
            return dict(self._backends)

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the router; agents use ``{base_url}/sessions/{id}/v1``, or
        ``{base_url}/v1`` with the ``X-Session-ID`` header."""
        return f"http://{self.host}:{self.port}"

    def shutdown(self) -> None:
        """Stop the server and close its connections to the backends; open streams are cut
        (the server does not wait for them)."""
        self._closing = True
        loop = self._loop
        if loop is not None and self._open and not loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(self._close_open(), loop).result(timeout=5)
            except Exception:  # noqa: BLE001 - the loop is ending anyway
                log.debug("closing the router's open streams failed", exc_info=True)
        self._server.should_exit = True
        self._thread.join(timeout=10)

    async def _close_open(self) -> None:
        for response in list(self._open):
            await response.aclose()

    def _backend_of(self, session_id: str | None) -> str:
        if not session_id:
            raise GatewayError(404, f"no session: call /sessions/<id>/v1/... or send the {SESSION_HEADER} header",
                               type="not_found_error", code="session_not_found")
        gateway_id = session_id.split("-", 1)[0]
        with self._lock:
            url = self._backends.get(gateway_id)
            known = sorted(self._backends)
        if url is None:
            raise GatewayError(404, f"session {session_id!r} belongs to gateway {gateway_id!r} (the part of its id "
                                    f"before the first dash), which is not one of this router's gateways {known}",
                               type="not_found_error", code="session_not_found")
        return url

    # --- the app -------------------------------------------------------------------------
    def _make_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
            timeout = httpx.Timeout(None, connect=self.connect_timeout_s)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=128)
            self._loop = asyncio.get_running_loop()
            async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
                self._client = client
                yield
            self._client = None

        app = FastAPI(title="agentrl gateway router", docs_url=None, redoc_url=None, openapi_url=None,
                      lifespan=lifespan)

        @app.exception_handler(GatewayError)
        async def gateway_error(_request: Request, exc: GatewayError) -> JSONResponse:
            return JSONResponse(exc.body(), status_code=exc.status)

        @app.api_route("/sessions/{session_id}/{rest:path}", methods=_METHODS)
        async def in_session(session_id: str, rest: str, request: Request) -> Any:
            return await self._forward(request, session_id)

        @app.api_route("/v1/{rest:path}", methods=_METHODS)
        async def by_header(rest: str, request: Request) -> Any:
            return await self._forward(request, request.headers.get(SESSION_HEADER))

        @app.api_route("/{rest:path}", methods=_METHODS)
        async def elsewhere(rest: str, request: Request) -> Any:
            raise GatewayError(404, f"no route {request.method} /{rest}: the router serves /sessions/<id>/... and "
                                    f"/v1/... with the {SESSION_HEADER} header", type="not_found_error")

        return app

    async def _forward(self, request: Request, session_id: str | None) -> Any:
        backend = self._backend_of(session_id)
        client = self._client  # set by the lifespan before the server accepts requests
        if client is None:
            raise GatewayError(503, "the gateway router is shutting down", type="server_error")
        path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
        query = request.scope.get("query_string", b"").decode("latin-1")
        url = f"{backend}{path}" + (f"?{query}" if query else "")
        headers = _end_to_end(request.headers.items(), drop=frozenset({"host", "content-length"}))
        body = await request.body()
        upstream = client.build_request(request.method, url, headers=headers, content=body)
        sent = {k.lower() for k, _ in headers}
        for name in ("accept", "accept-encoding", "user-agent"):  # httpx's defaults: only what the caller sent
            if name not in sent:
                upstream.headers.pop(name, None)
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            raise GatewayError(502, f"the gateway at {backend} (session {session_id!r}) did not answer "
                                    f"{request.method} {path}: {type(exc).__name__}: {exc}",
                               type="server_error", code="backend_unavailable") from None

        async def relay() -> AsyncIterator[bytes]:
            self._open.add(response)
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            except (httpx.HTTPError, httpx.StreamError) as exc:
                if self._closing:  # shutdown() closed it: the stream ends here
                    return
                log.warning("the gateway at %s broke off %s %s mid-answer: %s", backend, request.method, path, exc)
                raise
            finally:
                self._open.discard(response)
                await response.aclose()

        out = StreamingResponse(relay(), status_code=response.status_code)
        out.raw_headers = [(k.encode("latin-1"), v.encode("latin-1"))
                           for k, v in _end_to_end(response.headers.multi_items())]
        return out
