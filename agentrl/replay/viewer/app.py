"""The viewer's FastAPI application: security headers, templates, error pages, static files.

``create_app(db)`` builds the app over an open ``ReadOnlyDB``; the pages are in
``agentrl.replay.viewer.routes``. Security (issue 13, point 5):

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
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrl.errors import AgentRLError, InfraError
from agentrl.replay.queries import ReadOnlyDB, model_paths
from agentrl.replay.viewer.charts import fmt

HERE = Path(__file__).resolve().parent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
TokenText = Callable[[str, Sequence[int]], "list[str] | None"]
"""``token_text(model_path, ids)``: one display string per token id, decoded with the
tokenizer of the run's ``model.path`` (given by the CLI, which may load a tokenizer; the
replay room may not); ``None`` when that tokenizer cannot be loaded (the ids are shown).
It keeps what it loads: the viewer calls ``token_text(model_path, [])`` for the newest runs'
models in a background thread when it starts (``Viewer.warm_up``), so the first token view
does not wait for a tokenizer."""

log = logging.getLogger(__name__)


def template_env() -> Environment:
    """The Jinja2 environment of the viewer: autoescape on for every template, undefined
    names are errors (a typo fails a test instead of rendering empty)."""
    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    env.filters["short"] = lambda v, n=28: v if len(v) <= n else "…" + v[-(n - 1):]  # ids share long prefixes
    env.globals["qs"] = lambda **kw: urlencode({k: v for k, v in kw.items() if v not in (None, "")})
    return env


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if f != f:
        return "–"
    return fmt(f) if digits == 3 else f"{f:.{digits}f}"


class Viewer:
    """What the routes share: the database, the templates, the token decoder."""

    def __init__(self, db: ReadOnlyDB, token_text: TokenText | None) -> None:
        self.db = db
        self.env = template_env()
        self.token_text = token_text

    def render(self, name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("db_url", self.db.url)
        return HTMLResponse(self.env.get_template(name).render(**ctx), status_code=status_code)

    def warm_up(self) -> threading.Thread:
        """Start (and return) a daemon thread that compiles the templates and loads the token
        decoders of the newest runs' models (``queries.model_paths``), so that the first
        request of each page costs what later ones do. A failure there is logged; the page
        that needs the piece then loads it itself."""
        def work() -> None:
            try:
                for name in self.env.list_templates(extensions=["html"]):
                    self.env.get_template(name)
                if self.token_text is not None:
                    for path in model_paths(self.db):
                        self.token_text(path, [])
            except Exception as exc:  # noqa: BLE001 - warming up is an optimisation only
                log.warning("viewer warm-up: %s", exc)

        thread = threading.Thread(target=work, name="viewer-warm-up", daemon=True)
        thread.start()
        return thread


WARM_UP_WAIT_S = 3.0
"""How long the server waits for ``Viewer.warm_up`` before it takes requests (loading
SmolLM2's tokenizer and compiling the templates takes about 0.3 s; a slower tokenizer goes on
loading in the background)."""

LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
"""Host headers the viewer always answers (its loopback names)."""


def create_app(db: ReadOnlyDB, token_text: TokenText | None = None, *, host: str | None = None,
               allowed_hosts: Sequence[str] = ()) -> FastAPI:
    """The viewer app over ``db`` (read-only). ``token_text`` decodes token ids for the token
    view (see ``TokenText``); without it the ids are shown.

    Requests whose ``Host`` header is not a loopback name (``LOCAL_HOSTS``), ``host`` (the
    ``--host`` it serves on) or one of ``allowed_hosts`` get 400: a page of another site
    that rebinds its DNS name to 127.0.0.1 cannot read the viewer (DNS rebinding)."""
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    from agentrl.replay.viewer.routes import router

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
