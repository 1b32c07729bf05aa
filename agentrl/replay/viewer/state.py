"""What the viewer's routes share: ``Viewer`` (the database, the Jinja2 templates, the token
decoder) and the template environment. ``agentrl.replay.viewer.app`` builds the application
around one ``Viewer``; ``agentrl.replay.viewer.routes`` reads it from ``app.state.viewer``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from agentrl.replay.read import ReplayDB, model_paths
from agentrl.replay.viewer.charts import fmt

HERE = Path(__file__).resolve().parent
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

    def __init__(self, db: ReplayDB, token_text: TokenText | None) -> None:
        self.db = db
        self.env = template_env()
        self.token_text = token_text

    def render(self, name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("db_url", self.db.url)
        return HTMLResponse(self.env.get_template(name).render(**ctx), status_code=status_code)

    def warm_up(self) -> threading.Thread:
        """Start (and return) a daemon thread that compiles the templates and loads the token
        decoders of the newest runs' models (``read.model_paths``), so that the first
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
