"""Checks of what a sandbox left behind, for the sandbox suites (tests/integration/sandboxes):
processes by label or command line (scanning ``/proc``), the run's cgroup directories, Docker
containers by label (asking the daemon), independently of the reaper's own scans; and
``require_docker`` (skip, or fail under ``AGENTRL_REQUIRE_DOCKER=1``).

Test code, imported as ``tests.helpers.sandbox_checks``. It lived in that suite's conftest.py
and the tests imported it as ``conftest``, which resolves to whichever conftest.py pytest put on
``sys.path`` last (the viewer suite's, once it had one).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandboxes.labels import RUN_ID_ENV, sandbox_root
from sandboxes.limits import cgroup_v1_bases
from sandboxes.docker.daemon import docker_daemon_answers


def require_docker() -> None:
    if docker_daemon_answers():
        return
    if os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1":
        pytest.fail("AGENTRL_REQUIRE_DOCKER=1 but no Docker daemon answers")
    pytest.skip("no Docker daemon answers (scripts/test.sh starts one)")


def live_pids() -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2:][:1] != b"Z":  # zombies no longer run
            out.append(int(entry))
    return out


def procs_with_label(run_id: str) -> list[int]:
    """Running processes whose environment carries ``AGENTRL_RUN_ID=<run_id>`` (sandboxed
    commands of both backends carry it; the host sees container processes too)."""
    needle = f"{RUN_ID_ENV}={run_id}".encode()
    found = []
    for pid in live_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def procs_with_cmdline(cmdline: str) -> list[int]:
    found = []
    for pid in live_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().replace(b"\0", b" ").strip() == cmdline.encode():
                    found.append(pid)
        except OSError:
            continue
    return found


def cgroup_run_dirs(run_id: str) -> list[Path]:
    """cgroup v1 directories of ``run_id`` (bubblewrap's memory, pids and cpu limits) that
    exist; [] where the limits are rlimits."""
    return [base / run_id for base in (cgroup_v1_bases() or {}).values() if (base / run_id).exists()]


def containers_with_label(run_id: str) -> list[str]:
    """Ids of containers (any state) labelled with ``run_id``; [] without a daemon."""
    if not docker_daemon_answers():
        return []
    import docker

    client = docker.from_env(timeout=30)
    try:
        return [c["Id"] for c in client.api.containers(all=True, filters={"label": f"agentrl.run_id={run_id}"})]
    finally:
        client.close()


def what_is_left(run_id: str) -> list[str]:
    """What of ``run_id`` still exists on this host, found independently of the reaper:
    labelled processes, containers, the run's working directories, cgroups ([] when
    nothing)."""
    left = [f"process {pid}" for pid in procs_with_label(run_id)]
    left += [f"container {cid[:12]}" for cid in containers_with_label(run_id)]
    if (sandbox_root() / run_id).exists():
        left.append(f"working directories under {sandbox_root() / run_id}")
    left += [f"cgroup {d}" for d in cgroup_run_dirs(run_id)]
    return left


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
