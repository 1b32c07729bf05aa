"""Container reaping: the labels every sandbox container carries, and removing the
containers whose owner process is gone (docs/design.md invariant 8; docs/cases.md, C10).

``sandboxes.reaper.reap_orphans`` calls ``reap_containers`` when a daemon answers; the first
``DockerSandbox`` of a process calls it too (``reap_containers_once``).
"""

from __future__ import annotations

import logging

import docker
import docker.errors

from agentrl.errors import SandboxError
from sandboxes.docker.daemon import client_is_remote, docker_client, infra_errors
from sandboxes.front import OncePerProcess
from sandboxes.labels import Owner, OwnerJudge, SandboxLabel

logger = logging.getLogger(__name__)

LABEL_RUN_ID = "agentrl.run_id"
LABEL_SANDBOX_ID = "agentrl.sandbox_id"
LABEL_OWNER_PID = "agentrl.owner_pid"
LABEL_OWNER_START = "agentrl.owner_start"
LABEL_OWNER_PIDNS = "agentrl.owner_pidns"
"""Inode of the owner's pid namespace (``sandboxes.labels.Owner.pid_ns``): the owner's
liveness is only judged from that pid namespace."""
LABEL_OWNER_BOOT = "agentrl.owner_boot"
"""``/proc/sys/kernel/random/boot_id`` of the owner's machine: the owner's liveness is only
judged on that machine (and boot)."""

_INFRA_ERRORS = infra_errors()


def boot_id() -> str:
    """This boot's ``/proc/sys/kernel/random/boot_id``, or ``"unknown"``."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def container_labels(label: SandboxLabel) -> dict[str, str]:
    """The ``agentrl.*`` labels of the container of the sandbox labelled ``label``."""
    labels = {
        LABEL_RUN_ID: label.run_id,
        LABEL_SANDBOX_ID: label.sandbox_id,
        LABEL_OWNER_PID: str(label.owner.pid),
        LABEL_OWNER_START: str(label.owner.start_ticks),
        LABEL_OWNER_BOOT: boot_id(),
    }
    if label.owner.pid_ns is not None:
        labels[LABEL_OWNER_PIDNS] = str(label.owner.pid_ns)
    return labels


def owner_of(labels: dict[str, str]) -> Owner:
    """The owner named by a container's labels; without ``agentrl.owner_pidns`` (a container
    of an earlier version) its ``pid_ns`` is ``None``; malformed: pid 0 (never alive)."""
    try:
        ns = labels.get(LABEL_OWNER_PIDNS)
        return Owner(int(labels.get(LABEL_OWNER_PID, "0")), int(labels.get(LABEL_OWNER_START, "-1")),
                     None if ns is None else int(ns))
    except ValueError:
        return Owner(0, -1)


def remove_container(client: docker.DockerClient, container_id: str) -> None:
    """Force-remove the container; gone already is fine, a daemon failure is logged."""
    try:
        client.api.remove_container(container_id, force=True)
    except docker.errors.NotFound:
        pass
    except _INFRA_ERRORS as exc:
        logger.warning("could not remove sandbox container %s: %s", container_id[:12], exc)


def reap_containers(
    run_id: str | None = None,
    *,
    include_live_owners: bool = False,
    client: docker.DockerClient | None = None,
    docker_host: str | None = None,
) -> int:
    """Force-remove sandbox containers (label ``agentrl.run_id``) whose owner is gone.

    The owner is gone when its boot id is this machine's and it no longer runs, judged only
    where it can be looked up (``sandboxes.labels.OwnerJudge``: from its own pid namespace,
    or from the initial one as root; a container without the namespace label counts as this
    namespace's). Containers of owners on other machines, or in pid namespaces this process
    cannot look into (a run in a container or under ``unshare --pid`` that shares the
    daemon), are only removed with ``include_live_owners`` (and a ``run_id``).

    Returns:
        Number of containers removed.

    Raises:
        SandboxError: the daemon does not answer.
    """
    client = client if client is not None else docker_client(host=docker_host)
    remote = client_is_remote(client)
    label_filter = f"{LABEL_RUN_ID}={run_id}" if run_id is not None else LABEL_RUN_ID
    try:
        containers = client.api.containers(all=True, filters={"label": label_filter})
    except _INFRA_ERRORS as exc:
        raise SandboxError(f"the Docker daemon does not answer: {exc}") from exc
    boot = boot_id()
    judge = OwnerJudge()
    removed = 0
    for c in containers:
        labels = c.get("Labels") or {}
        if not include_live_owners:
            if labels.get(LABEL_OWNER_BOOT) != boot:
                # Another boot of this machine (owner surely gone) when the daemon is
                # local; another machine's (unknown) when it is remote.
                if remote:
                    continue
            else:
                owner = owner_of(labels)
                gone = judge.is_gone(owner)
                if gone is None:
                    logger.debug("left sandbox container %s alone: its owner is of pid namespace %s, "
                                 "which this process cannot look into", c["Id"][:12], owner.pid_ns)
                if not gone:
                    continue
        remove_container(client, c["Id"])
        removed += 1
    if removed:
        logger.info("removed %d orphaned sandbox containers%s", removed, f" of run {run_id!r}" if run_id else "")
    return removed


reap_containers_once = OncePerProcess("reaping orphaned sandbox containers")
"""``reap_containers_once(reap_containers, client=...)``: the first sandbox of a process
removes what crashed owners left (their containers only)."""
