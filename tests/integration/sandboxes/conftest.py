"""Fixtures shared by the sandbox suites: the backends to run the contract and abuse suites
on, and checks of what is left behind (by scanning ``/proc``, the cgroup hierarchy and the
sandbox root, and by asking the daemon, independently of the reaper's own scans; the checks
themselves are in tests/helpers/sandbox_checks.py, which the suites import).

Docker cases are marked ``docker``. When no daemon answers they are skipped, unless
``AGENTRL_REQUIRE_DOCKER=1`` (set by scripts/test.sh, which starts dockerd), where that is
a failure.
"""

from __future__ import annotations

import uuid

import pytest

from sandboxes import SandboxSpec
from sandboxes.bwrap import BwrapSandbox
from sandboxes.labels import sandbox_root
from tests.helpers.sandbox_checks import (
    cgroup_run_dirs, containers_with_label, procs_with_label, require_docker, wait_until,
)

BACKENDS = ["bwrap", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    if request.param == "docker":
        require_docker()
    return request.param


@pytest.fixture
def make(backend, run_id):
    """``make(**spec_fields)`` -> an open sandbox of the parametrized backend (closed at
    the end of the test, after which nothing of the run may be left: no process, container,
    working directory or cgroup)."""
    made = []

    def factory(**fields):
        fields.setdefault("run_id", run_id)
        spec = SandboxSpec(**fields)
        if backend == "docker":
            from sandboxes.docker import DockerSandbox

            sb = DockerSandbox(spec)
        else:
            sb = BwrapSandbox(spec)
        made.append(sb)
        return sb

    yield factory
    for sb in made:
        sb.close()
    assert wait_until(lambda: procs_with_label(run_id) == [])
    assert containers_with_label(run_id) == []
    assert not (sandbox_root() / run_id).exists()  # bubblewrap's working directories
    assert cgroup_run_dirs(run_id) == []


@pytest.fixture
def sandbox(make):
    return make(memory_mb=512, pids_limit=128, default_timeout_s=30)
