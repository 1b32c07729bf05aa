"""Fixtures shared by several integration folders."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import postgres_ctl
from tests.helpers.built_once import built_once
from tests.integration.viewer.real_runs import RealRuns, add_xss_episode, train_runs

POSTGRES_ENV = "AGENTRL_TEST_POSTGRES_URL"
REQUIRE_POSTGRES_ENV = "AGENTRL_REQUIRE_POSTGRES"


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory, tiny_model_path) -> RealRuns:
    """Two real one-iteration ShellTasks runs (same seed, same task ids) in one SQLite
    replay database, plus the run holding the XSS episode (viewer/real_runs.py): what the
    viewer's browser tests serve, and ShellTasks' one training iteration of
    cluster/test_builtin_envs_train.py (one run less than a run of its own; when that test
    asks first, the runs use the cluster tests' Ray instance instead of starting one). Under
    scripts/test.sh the two pytest processes share one build (tests/helpers/built_once.py):
    the cluster part asks early, and the viewer's tests in the other part read its runs."""
    def build(folder: Path) -> dict:
        return add_xss_episode(train_runs(folder, tiny_model_path), tiny_model_path).to_json()

    return RealRuns.from_json(built_once("real_runs", build, lambda: tmp_path_factory.mktemp("viewer_runs")))


@pytest.fixture
def dead_socket(tmp_path):
    """``unix://`` address of a socket file nobody accepts on (bound, then closed): a Docker
    daemon address that does not answer."""
    path = tmp_path / "nobody.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    return f"unix://{path}"


@pytest.fixture(scope="module")
def postgres_module_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test module (``CREATE DATABASE`` on the server at
    ``$AGENTRL_TEST_POSTGRES_URL``, which scripts/test.sh starts: tests/helpers/postgres_ctl.py),
    dropped after the module. Without the variable the PostgreSQL cases are skipped, or fail
    with ``AGENTRL_REQUIRE_POSTGRES=1`` (set by scripts/test.sh)."""
    admin_url = os.environ.get(POSTGRES_ENV)
    if not admin_url:
        _missing(f"no PostgreSQL server: ${POSTGRES_ENV} is not set (scripts/test.sh starts one: "
                 "tests/helpers/postgres_ctl.py)")
    try:
        url = postgres_ctl.create_database(admin_url, "agentrl_replay")
    except Exception as exc:  # server down, bad credentials, missing driver
        _missing(f"PostgreSQL at ${POSTGRES_ENV} is not usable: {exc}")
    try:
        yield url
    finally:
        postgres_ctl.drop_database(admin_url, url)


def _missing(what: str) -> None:
    if os.environ.get(REQUIRE_POSTGRES_ENV) == "1":
        pytest.fail(f"{REQUIRE_POSTGRES_ENV}=1 but {what}")
    pytest.skip(what)
