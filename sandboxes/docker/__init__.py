"""The Docker sandbox backend: the only place that imports the ``docker`` SDK (docs/design.md).

* ``sandbox``: ``DockerSandbox``, one container per sandbox; ``exec_io``: the wrapper one
  exec runs under and its stream;
* ``images``: the base image and environment images, built without a registry;
* ``reaper``: container labels and removing containers whose owner is gone;
* ``daemon``: is the daemon up (``docker_daemon_answers`` over the raw socket, without the
  SDK; ``docker_available`` through it), and ``docker_client``.

Importing this package imports no SDK: the names below load their module on first use,
so ``from sandboxes.docker.daemon import docker_daemon_answers`` (or ``sandboxes.docker``'s
``docker_daemon_answers``) works where only the daemon check is wanted.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DockerSandbox": "sandboxes.docker.sandbox",
    "build_image": "sandboxes.docker.images",
    "image_exists": "sandboxes.docker.images",
    "image_workdir": "sandboxes.docker.images",
    "reap_containers": "sandboxes.docker.reaper",
    "docker_client": "sandboxes.docker.daemon",
    "docker_available": "sandboxes.docker.daemon",
    "docker_daemon_answers": "sandboxes.docker.daemon",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sandboxes.docker' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
