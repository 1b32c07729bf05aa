"""The viewer's FastAPI application: security headers, templates, error pages, static files.

``create_app(db)`` builds the app over an open ``ReadOnlyDB``; the pages are in
``agentrl.replay.viewer.routes``, what they share in ``agentrl.replay.viewer.state``.
Security:

* Jinja2 autoescaping is on for every template (text and attribute values, always quoted),
  so model output, observations and sandbox output are shown as text. Data for scripts goes
  in ``data-*`` attributes (escaped like any attribute); no inline ``<script>`` and no inline
  event handler exist in the templates.
* Every response carries a Content-Security-Policy without ``'unsafe-inline'``:
  ``script-src 'self'`` (only ``/static/viewer.js``), ``style-src 'self'``, no objects, no
  frames, no base URI, forms to this origin only.
* No part of a URL reaches the file system: static files come from the package's own
  ``static/`` folder through Starlette's ``StaticFiles`` (which refuses paths leaving it); the
  database is the one named on the command line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from agentrl.errors import AgentRLError, InfraError
from agentrl.replay.read import ReplayDB
from agentrl.replay.viewer.routes import router
from agentrl.replay.viewer.state import HERE, TokenText, Viewer

__all__ = ["CSP", "LOCAL_HOSTS", "SECURITY_HEADERS", "TokenText", "WARM_UP_WAIT_S", "create_app"]

log = logging.getLogger(__name__)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

WARM_UP_WAIT_S = 3.0
"""How long the server waits for ``Viewer.warm_up`` before it takes requests (loading
SmolLM2's tokenizer and compiling the templates takes about 0.3 s; a slower tokenizer goes on
loading in the background)."""

LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
"""Host headers the viewer always answers (its loopback names)."""


def create_app(db: ReplayDB, token_text: TokenText | None = None, *, host: str | None = None,
               allowed_hosts: Sequence[str] = ()) -> FastAPI:
    """The viewer app over ``db`` (read-only). ``token_text`` decodes token ids for the token
    view (see ``TokenText``); without it the ids are shown.

    Requests whose ``Host`` header is not a loopback name (``LOCAL_HOSTS``), ``host`` (the
    ``--host`` it serves on) or one of ``allowed_hosts`` get 400: a page of another site
    that rebinds its DNS name to 127.0.0.1 cannot read the viewer (DNS rebinding)."""
    viewer = Viewer(db, token_text)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        warm_up = viewer.warm_up()
        await asyncio.to_thread(warm_up.join, WARM_UP_WAIT_S)  # uvicorn listens after this
        yield

    app = FastAPI(title="agentrl view", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    hosts = list(LOCAL_HOSTS) + list(allowed_hosts)
    if host:
        hosts += [host, f"[{host}]"] if ":" in host and not host.startswith("[") else [host]
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)
    app.state.viewer = viewer

    @app.middleware("http")
    async def security_headers(request: Request, call_next):  # noqa: ANN001
        response = await call_next(request)
        for k, v in SECURITY_HEADERS.items():
            response.headers.setdefault(k, v)
        if request.url.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "public, max-age=3600")
        else:
            response.headers.setdefault("Cache-Control", "no-store")  # a run in progress changes
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        return viewer.render("error.html", exc.status_code, status=exc.status_code, message=str(exc.detail))

    @app.exception_handler(InfraError)
    async def infra_error(request: Request, exc: InfraError) -> HTMLResponse:
        log.warning("viewer: %s", exc)
        return viewer.render("error.html", 503, status=503, message=str(exc))

    @app.exception_handler(AgentRLError)
    async def contract_error(request: Request, exc: AgentRLError) -> HTMLResponse:
        return viewer.render("error.html", 400, status=400, message=str(exc))

    app.mount("/static", StaticFiles(directory=str(HERE / "static"), follow_symlink=False), name="static")
    app.include_router(router)
    return app
