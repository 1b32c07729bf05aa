"""What a run that joins a running Ray cluster (``cluster.address`` set) takes with it and
how ``auto`` finds the cluster.

- ``user_py_modules(names)``: the user's modules of ``env.import_modules`` that the cluster's
  nodes cannot import on their own, as Ray ``runtime_env`` ``py_modules`` entries. The nodes
  of a cluster started with ``ray start`` do not see the driver's ``PYTHONPATH`` (each raylet
  has the environment of its own ``ray start``), so a module found there, or in the
  current directory, would fail to import in every actor. Ray uploads each entry to the
  cluster once and puts it on every worker's ``sys.path`` (Ray docs, "Environment
  dependencies", ``py_modules``; ``ray._private.runtime_env.py_modules``).
- ``job_runtime_env()``: the runtime environment of the Ray job this driver runs in
  (``ray job submit``), which ``ray.init`` merges with the run's own and refuses a field
  given in both.
- ``recorded_cluster_addresses()``: the GCS addresses ``ray start`` recorded on this machine:
  Ray writes ``<temp dir>/ray_current_cluster`` under the ``--temp-dir`` it was given
  (default ``/tmp/ray``, or ``$RAY_TMPDIR/ray``), and ``ray.init(address="auto")`` reads only
  the default one. The temp dirs of the Ray head processes running here (the GCS server's
  ``--log_dir``) are searched too.
"""

from __future__ import annotations

import importlib
import json
import os
import site
import sysconfig
from pathlib import Path
from typing import Any, Sequence

from agentrl.errors import ConfigError

PROJECT_PACKAGES = ("agentrl", "environments", "sandboxes", "critics")
"""This project's packages: every node has them (the README's cluster set-up: the same
``.venv`` at the same path), so they are never shipped."""


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    roots += list(site.getsitepackages()) + [site.getusersitepackages()]
    return [Path(r).resolve() for r in roots if r]


def _location(top: str, name: str) -> Path | None:
    """The directory of package ``top`` or the file of module ``top``; None for a built-in."""
    try:
        mod = importlib.import_module(top)
    except Exception as exc:
        raise ConfigError(f"env.import_modules: module {name!r} could not be imported "
                          f"({type(exc).__name__}: {exc}); it must be importable where the run starts") from exc
    paths = list(getattr(mod, "__path__", None) or [])
    if paths:
        if len(paths) > 1:
            raise ConfigError(
                f"env.import_modules: {name!r}: package {top!r} is a namespace package spread over {len(paths)} "
                f"directories ({', '.join(paths)}), which cannot be shipped to the cluster's nodes as one; install it "
                "on every node, or make it a regular package (add an __init__.py)")
        return Path(paths[0])
    file = getattr(mod, "__file__", None)
    return Path(file) if file else None


def user_py_modules(names: Sequence[str]) -> list[str]:
    """The ``py_modules`` entries that make ``names`` importable on a cluster's workers.

    A dotted name ships its top-level package. Skipped: this project's packages and anything
    under the interpreter's standard library or site-packages (installed: every node has
    the same ``.venv``).

    Args:
        names: ``env.import_modules`` (``"calc_env"``, ``"mypkg.envs"``).

    Returns:
        Local paths (a package directory, or a single-module ``.py`` file), each once, in
        the order of ``names``.

    Raises:
        ConfigError: a module cannot be imported here, or is a namespace package split over
            several directories.
    """
    roots = _installed_roots()
    out: list[str] = []
    for name in names:
        top = name.split(".")[0]
        if top in PROJECT_PACKAGES:
            continue
        loc = _location(top, name)
        if loc is None:
            continue
        resolved = loc.resolve()
        if any(resolved.is_relative_to(r) for r in roots):
            continue
        if str(loc) not in out:
            out.append(str(loc))
    return out


def job_runtime_env() -> dict[str, Any]:
    """The runtime environment ``ray job submit`` gave the job this driver runs in (``{}``
    outside such a job)."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    raw = os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR)
    if not raw:
        return {}
    try:
        return dict(json.loads(raw).get("runtime_env") or {})
    except (ValueError, AttributeError):
        return {}


def _head_temp_dirs() -> list[Path]:
    """Temp dirs of the Ray GCS servers running on this machine: ``--log_dir=<temp>/session_*/logs``."""
    out: list[Path] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"/gcs_server"):
            continue
        for arg in argv[1:]:
            if arg.startswith(b"--log_dir="):
                logs = Path(arg[len(b"--log_dir="):].decode(errors="replace"))
                if logs.name == "logs" and logs.parent.name.startswith("session_"):
                    temp = logs.parent.parent
                    if temp not in out:
                        out.append(temp)
    return out


def recorded_cluster_addresses() -> list[tuple[str, str]]:
    """``[(address, record file)]`` that ``ray start`` left on this machine: the default
    temp dir's record first, then those under the temp dirs of the Ray heads running here,
    each address once.
    """
    from ray._common.utils import get_ray_address_file

    files = [Path(get_ray_address_file(None))] + [t / "ray_current_cluster" for t in _head_temp_dirs()]
    out: list[tuple[str, str]] = []
    for f in files:
        try:
            address = f.read_text().strip()
        except OSError:
            continue
        if address and address not in [a for a, _ in out]:
            out.append((address, str(f)))
    return out


__all__ = ["PROJECT_PACKAGES", "job_runtime_env", "recorded_cluster_addresses", "user_py_modules"]
