"""Replay databases at an older schema, for the tests that read or upgrade them: Alembic's
own downgrade, run on the project's migrations."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

import agentrl.replay.migrations as migrations


def downgrade(url: str, revision: str, *, drop_version_table: bool = False) -> None:
    """Take the replay database at ``url`` down to Alembic ``revision`` (e.g. ``"0008"``);
    with ``drop_version_table`` also drop ``alembic_version`` (a database from before
    Alembic)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
            if drop_version_table:
                conn.execute(text("DROP TABLE alembic_version"))
    finally:
        engine.dispose()
