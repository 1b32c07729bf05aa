"""Fixtures for the replay store tests: a real database (a SQLite file, or a fresh database per
module on the PostgreSQL server at ``AGENTRL_TEST_POSTGRES_URL``) and a factory of realistic
multi-turn episodes."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest
from sqlalchemy import create_engine, inspect, text

from agentrl.replay import ReplayStore
from agentrl.replay.models import Base
from agentrl.replay.search_index import FTS_TABLE
from agentrl.types import Episode

from tests.integration.replay.episode_factory import build_episode
from tests.helpers.replay_schema import downgrade


def _drop_all(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
            if conn.dialect.name == "sqlite":
                conn.execute(text(f"DROP TABLE IF EXISTS {FTS_TABLE}"))
        Base.metadata.drop_all(engine)
    finally:
        engine.dispose()


def make_pre_alembic(url: str) -> None:
    """Turn a database at Alembic's head into what the store of ``schema_version`` 5 made:
    the revisions after the baseline are downgraded and the ``alembic_version`` table is
    dropped (a test then takes it further back to 4 or 3 by hand)."""
    import agentrl.replay.migrations as migrations

    downgrade(url, migrations.BASELINE, drop_version_table=True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A URL to a replay database without rows: a new SQLite file under ``tmp_path``, or the
    test module's PostgreSQL database (``postgres_module_url``, tests/integration/conftest.py),
    emptied after each test (``_empty``: it may already hold the schema at the head revision)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'replay.db'}"
        return
    url = request.getfixturevalue("postgres_module_url")
    yield url
    _empty(url)


def _empty(url: str) -> None:
    """Leave the module's PostgreSQL database as the next test expects it: still at the head
    revision with its schema intact, the rows deleted (``TRUNCATE``, much faster than
    rebuilding the schema); otherwise (a test changed the schema) every table dropped."""
    from agentrl.replay.migrations import HEAD, current_revision
    from agentrl.replay.models import SCHEMA_VERSION

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            at_head = (current_revision(conn) == HEAD
                       and conn.execute(text("SELECT version FROM schema_version")).scalar() == SCHEMA_VERSION
                       and len(inspect(conn).get_columns("turns")) == len(Base.metadata.tables["turns"].c) + 1)
            if at_head:
                names = ", ".join(t for t in Base.metadata.tables if t != "schema_version")
                conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    except Exception:  # noqa: BLE001 - not even readable as ours: drop it
        at_head = False
    finally:
        engine.dispose()
    if not at_head:
        _drop_all(url)


@pytest.fixture
def store(db_url: str) -> Iterator[ReplayStore]:
    s = ReplayStore(db_url)
    try:
        yield s
    finally:
        s.close()


MakeEpisode = Callable[..., Episode]


@pytest.fixture
def make_episode() -> MakeEpisode:
    """``make_episode(i, num_turns=3, events_per_turn=2, group_size=4, **episode_fields)``:
    a valid, deterministic multi-turn episode whose turns run sandbox commands
    (``episode_factory.build_episode``)."""
    return build_episode
