"""A replay database filled once per module (``viewer_data.fill``: SQLite, and PostgreSQL when
the suite has a server), and an HTTP client of the viewer over it (read-only)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from agentrl.replay import ReplayStore
from agentrl.replay.queries import ReadOnlyDB
from agentrl.replay.viewer import create_app

from tests.integration.replay.viewer.viewer_data import fill


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def viewer_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL of a database filled by ``fill`` (SQLite file, or a fresh PostgreSQL database)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('viewer') / 'replay.db'}"
    else:
        # a fresh database per module on the suite's server (tests/integration/replay/conftest.py:
        # skipped without one, a failure under AGENTRL_REQUIRE_POSTGRES=1)
        url = request.getfixturevalue("postgres_module_url")
    store = ReplayStore(url)
    try:
        fill(store)
    finally:
        store.close()
    return url


@pytest.fixture(scope="module")
def viewer_db(viewer_db_url: str) -> Iterator[ReadOnlyDB]:
    db = ReadOnlyDB(viewer_db_url)
    yield db
    db.close()


@pytest.fixture(scope="module")
def client(viewer_db: ReadOnlyDB) -> Iterator[TestClient]:
    with TestClient(create_app(viewer_db, allowed_hosts=["testserver"])) as c:
        yield c
