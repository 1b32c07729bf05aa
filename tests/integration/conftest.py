"""Fixtures shared by several integration folders."""

from __future__ import annotations

import socket

import pytest

from tests.integration.viewer.real_runs import RealRuns, add_xss_episode, train_runs


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory, tiny_model_path) -> RealRuns:
    """Two real one-iteration ShellTasks runs (same seed, same task ids) in one SQLite
    replay database, plus the run holding the XSS episode (viewer/real_runs.py): what the
    viewer's browser tests serve, and ShellTasks' one training iteration of
    cluster/test_builtin_envs_train.py (one run less than a run of its own; when that test
    asks first, the runs use the cluster tests' Ray instance instead of starting one)."""
    runs = train_runs(tmp_path_factory.mktemp("viewer_runs"), tiny_model_path)
    return add_xss_episode(runs, tiny_model_path)


@pytest.fixture
def dead_socket(tmp_path):
    """``unix://`` address of a socket file nobody accepts on (bound, then closed): a Docker
    daemon address that does not answer."""
    path = tmp_path / "nobody.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    return f"unix://{path}"
