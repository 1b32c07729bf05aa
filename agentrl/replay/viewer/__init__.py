"""``agentrl view``: a read-only web viewer of replay stores.

    db = open_db("runs/humaneval-smollm2")       # a run directory, a replay.db file or a URL
    app = create_app(db)                          # FastAPI; serve(app, "127.0.0.1", 8765)

Pages: runs, run (charts against iteration, cumulative generated tokens and wall-clock; token
accounting; stacked phase times; log-prob gap; staleness), episodes (filters, sort, keyset
pages, text search), episode (turns, sandbox commands, coloured tokens, reruns), group
(rollouts side by side, anchor-state groups) and diff. Server-rendered (Jinja2); one small
script (``static/viewer.js``) for hover read-outs. Security: see ``agentrl.replay.viewer.app``.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.errors import ConfigError
from agentrl.replay.read import ReadOnlyDB, ReplayDB
from agentrl.replay.viewer.app import CSP, TokenText, create_app

__all__ = ["CSP", "ReadOnlyDB", "TokenText", "create_app", "open_db", "resolve_db_url", "serve"]

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def resolve_db_url(target: str, run_dir_url: str | None = None) -> str:
    """The database URL of ``target``: a URL (``scheme://...``) as given; a run directory's
    ``replay.db`` (or ``run_dir_url``, the ``replay.url`` of its config, when set); a file
    path as a SQLite database.

    Raises:
        ConfigError: the path does not exist, or a run directory without a replay.db.
    """
    if "://" in target:
        return target
    path = Path(target).expanduser()
    if path.is_dir():
        if run_dir_url:
            return run_dir_url
        db = path / "replay.db"
        if not db.is_file():
            raise ConfigError(f"run directory {str(path)!r} has no replay.db; expected the directory of an "
                              "`agentrl train` run, a replay.db file, or a database URL")
        return f"sqlite:///{db.resolve()}"
    if path.is_file():
        return f"sqlite:///{path.resolve()}"
    raise ConfigError(f"{target!r} does not exist; expected a run directory, a replay.db file or a database URL "
                      "(e.g. postgresql+psycopg://user@host/db)")


def open_db(target: str, run_dir_url: str | None = None) -> ReadOnlyDB:
    """``ReadOnlyDB`` of ``resolve_db_url(target, run_dir_url)`` (see there and ``ReadOnlyDB``
    for the errors)."""
    return ReadOnlyDB(resolve_db_url(target, run_dir_url))


def serve(db: ReplayDB, host: str = "127.0.0.1", port: int = 8765,
          token_text: TokenText | None = None, log_level: str = "warning") -> None:
    """Serve the viewer with uvicorn until interrupted (blocking)."""
    import uvicorn

    uvicorn.run(create_app(db, token_text, host=host), host=host, port=port, log_level=log_level,
                server_header=False, proxy_headers=False)
