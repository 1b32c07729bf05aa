"""Fixtures of the Harbor tests against real containers (test_harbor_*.py): the task folders of
tests/helpers/harbor_tasks, their images removed after each module, and a run label per test
whose containers must all be gone when it ends."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agentrl.hubs.harbor_runtime import IMAGES, image_name
from agentrl.hubs.harbor_task import TaskSet, load_task
from sandboxes.docker.daemon import docker_client
from tests.helpers.sandbox_checks import containers_with_label, require_docker, wait_until

HARBOR_TASKS = Path(__file__).resolve().parents[2] / "helpers" / "harbor_tasks"


@pytest.fixture(scope="module")
def harbor_images():
    """Docker must answer; the test tasks' images are removed after the module (and forgotten
    by the process, so the next module builds them again)."""
    require_docker()
    yield
    client = docker_client()
    try:
        for task_id in TaskSet.from_path(HARBOR_TASKS).task_ids:
            try:
                client.images.remove(image_name(load_task(HARBOR_TASKS / task_id)), force=True)
            except Exception:  # noqa: BLE001 - never built, or in use: best effort
                pass
    finally:
        client.close()
        IMAGES.clear()


@pytest.fixture
def harbor_run_id():
    """A run label of its own; every container under it is gone within 10 s of the test's end."""
    rid = f"test-harbor-{uuid.uuid4().hex[:8]}"
    yield rid
    assert wait_until(lambda: containers_with_label(rid) == [], 10.0), containers_with_label(rid)
