"""What a run that joins a running Ray cluster (``cluster.address`` set) takes with it and
how ``auto`` finds the cluster.

- ``user_py_modules(names)``: the user's modules of ``env.import_modules``, and the local
  modules they import, that the cluster's nodes cannot import on their own, as Ray
  ``runtime_env`` ``py_modules`` entries; ``ship_user_modules(cfg, runtime_env)`` adds them
  to a join's runtime environment. The nodes of a cluster started with ``ray start`` do not
  see the driver's ``PYTHONPATH`` (each raylet has the environment of its own ``ray
  start``), so a module found there, or in the current directory, would fail to import in
  every actor. Ray uploads each entry to the cluster once and puts it on every worker's
  ``sys.path`` (Ray docs, "Environment dependencies", ``py_modules``;
  ``ray._private.runtime_env.py_modules``).
- ``job_runtime_env()``: the runtime environment of the Ray job this driver runs in
  (``ray job submit``), which ``ray.init`` merges with the run's own and refuses a field
  given in both.
- ``probe_gcs(address)``: fail fast when nothing listens at a cluster's address.
- ``recorded_cluster()`` / ``recorded_cluster_addresses()``: the GCS addresses ``ray start``
  recorded on this machine: Ray writes ``<temp dir>/ray_current_cluster`` under the ``--temp-dir`` it was given
  (default ``/tmp/ray``, or ``$RAY_TMPDIR/ray``), and ``ray.init(address="auto")`` reads only
  the default one. The temp dirs of the Ray head processes running here (the GCS server's
  ``--log_dir``) are searched too.
"""

from __future__ import annotations

import ast
import importlib
import json
import logging
import os
import site
import socket
import sys
import sysconfig
from pathlib import Path
from typing import Any, Sequence

from agentrl.config import modules_imported_with
from agentrl.errors import ConfigError

log = logging.getLogger(__name__)

_JOIN_PROBE_TIMEOUT_S = 10.0  # TCP connect to a cluster's GCS before handing the address to Ray
PROJECT_PACKAGES = ("agentrl", "environments", "sandboxes", "critics")
"""This project's packages: every node has them (docs/cluster.md's set-up: the same
``.venv`` at the same path), so they are never shipped."""


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    roots += list(site.getsitepackages()) + [site.getusersitepackages()]
    return [Path(r).resolve() for r in roots if r]


def _import(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception as exc:
        raise ConfigError(f"env.import_modules: module {name!r} could not be imported "
                          f"({type(exc).__name__}: {exc}); it must be importable where the run starts") from exc


def _imported_with(name: str) -> list[str]:
    """``name`` and the modules its import brought in: what ``Config`` validation recorded when
    it imported ``name`` (``agentrl.config.modules_imported_with``), else what importing it
    here adds to ``sys.modules``; for a module imported earlier by something else, the
    modules its source's ``import`` statements name (``_named_imports``), followed through
    the modules that are not installed."""
    recorded = modules_imported_with(name)
    if recorded is not None:
        return [name, *recorded]
    if name not in sys.modules:
        before = set(sys.modules)
        _import(name)
        return [name, *(m for m in sys.modules if m not in before)]
    roots = _installed_roots()
    seen, todo = [name], [name]
    while todo:
        for ref in _named_imports(todo.pop()):
            if ref not in seen:
                seen.append(ref)
                if _local_paths(ref, roots):
                    todo.append(ref)
    return seen


def _named_imports(module: str) -> list[str]:
    """The imported modules of ``sys.modules`` that ``import`` statements in the source of
    ``module`` name (anywhere in it, functions included; relative ones resolved)."""
    mod = sys.modules.get(module)
    file = getattr(mod, "__file__", None)
    if not file or not file.endswith(".py"):
        return []
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"), filename=file)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []
    package = getattr(mod, "__package__", None) or ""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return [n for n in dict.fromkeys(names) if n and n in sys.modules]


def _local_paths(module: str, roots: list[Path]) -> list[Path]:
    """Where the top-level package of ``module`` (its directory) or the module itself (its
    file) lies, unless that is this project's package, a built-in, or under the standard
    library or site-packages (``roots``): ``[]`` then."""
    top = module.split(".")[0]
    mod = sys.modules.get(top)
    if top in PROJECT_PACKAGES or top in ("__main__", "__mp_main__") or mod is None:
        return []
    paths = [Path(p) for p in (getattr(mod, "__path__", None) or [])]
    if not paths:
        file = getattr(mod, "__file__", None)
        paths = [Path(file)] if file else []
    return [p for p in paths if not any(p.resolve().is_relative_to(r) for r in roots)]


def user_py_modules(names: Sequence[str]) -> list[str]:
    """The ``py_modules`` entries that make ``names`` importable on a cluster's workers: each
    module of ``names`` and every module its import brought in (``import calc_helpers`` in
    ``calc_env.py``, a package beside it) that the nodes cannot import on their own.

    A dotted name ships its top-level package. Skipped: this project's packages and anything
    under the interpreter's standard library or site-packages (installed: every node has
    the same ``.venv``).

    Args:
        names: ``env.import_modules`` (``"calc_env"``, ``"mypkg.envs"``).

    Returns:
        Local paths (a package directory, or a single-module ``.py`` file), each once, in
        the order of ``names``, each name's own modules first.

    Raises:
        ConfigError: a module cannot be imported here, or it or a module it imports is a
            namespace package split over several directories.
    """
    roots = _installed_roots()
    out: list[str] = []
    for name in names:
        if name.split(".")[0] in PROJECT_PACKAGES:
            continue
        for module in _imported_with(name):
            paths = _local_paths(module, roots)
            if len(paths) > 1:
                via = "" if module == name else f" imports {module!r}:"
                raise ConfigError(
                    f"env.import_modules: {name!r}:{via} package {module.split('.')[0]!r} is a namespace package "
                    f"spread over {len(paths)} directories ({', '.join(map(str, paths))}), which cannot be shipped "
                    "to the cluster's nodes as one; install it on every node, or make it a regular package (add an "
                    "__init__.py)")
            if paths and str(paths[0]) not in out:
                out.append(str(paths[0]))
    return out


def ship_user_modules(cfg: Any, runtime_env: dict[str, Any]) -> None:
    """Add the user's modules of ``env.import_modules`` to a joined cluster's ``runtime_env``
    as ``py_modules`` (``user_py_modules``): the nodes of a ``ray
    start`` cluster do not see this driver's ``PYTHONPATH``. Inside a ``ray job submit`` job,
    modules in the job's ``working_dir`` (this process's current directory) travel with it
    already; when the job's runtime environment has ``py_modules`` (Ray refuses the field
    twice), the job's list is used as it is and must hold them."""
    modules = user_py_modules(cfg.env.import_modules)
    job_env = job_runtime_env()
    if job_env.get("working_dir"):  # the job runs in (a copy of) its working dir, which every worker gets
        cwd = os.path.realpath(os.getcwd())
        modules = [m for m in modules if not os.path.realpath(m).startswith(cwd + os.sep)]
    if not modules:
        return
    if "py_modules" in job_env:
        log.warning("the Ray job's runtime_env has py_modules: not adding %s (env.import_modules) to it; the job's "
                    "list must make them importable on every node", ", ".join(modules))
        return
    runtime_env["py_modules"] = modules
    log.info("shipping %s (env.import_modules) to the cluster's workers as runtime_env py_modules", ", ".join(modules))


def job_runtime_env() -> dict[str, Any]:
    """The runtime environment ``ray job submit`` gave the job this driver runs in (``{}``
    outside such a job)."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR  # heavy: ray

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
    from ray._common.utils import get_ray_address_file  # heavy: ray

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


def recorded_cluster() -> str:
    """``auto`` without ``RAY_ADDRESS``: the cluster a ``ray start`` on this machine recorded
    (``<temp dir>/ray_current_cluster``: ``/tmp/ray`` or ``$RAY_TMPDIR/ray`` by default, else
    the ``--temp-dir`` it was given, found through the Ray heads running here;
    ``recorded_cluster_addresses``). Ray alone would read only the
    default record, and join *any* Ray instance it finds running here (another user's,
    another run's) when that record is missing or stale, so a record is required and named.
    With several records, the one whose GCS answers is taken; several that answer are
    ambiguous.

    As Ray does for a cluster it finds recorded on this machine, token authentication is
    turned on when a token is there (``ray start`` clusters use it by default since Ray 2.59).

    Raises:
        ConnectionError: no record, or several live ones.
    """
    from ray._common.utils import get_ray_address_file  # heavy: ray

    records = recorded_cluster_addresses()
    if not records:
        raise ConnectionError(
            f"RAY_ADDRESS is not set and no `ray start` on this machine left a record "
            f"({get_ray_address_file(None)}, or under the --temp-dir of a Ray head running here); "
            "'auto' needs one of them")
    if len(records) > 1:
        alive = [(a, f) for a, f in records if _answers(a)]
        if len(alive) > 1:
            raise ConnectionError(
                "several Ray clusters recorded on this machine answer: "
                + "; ".join(f"{a} ({f})" for a, f in alive)
                + "; 'auto' cannot choose: set cluster.address (or RAY_ADDRESS) to one of them")
        records = alive or records
    recorded = records[0][0]
    try:
        from ray._private.authentication.authentication_token_setup import (  # heavy: ray
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return recorded
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    return recorded


def _answers(address: str) -> bool:
    try:
        probe_gcs(address)
    except (ConnectionError, ValueError):
        return False
    return True


def probe_gcs(address: str) -> None:
    """Fail fast when nothing listens at the GCS address ``address`` (``host:port``, or ``auto``
    with ``RAY_ADDRESS`` set) stands for: Ray itself retries a dead address for many minutes
    (measured: 13.7 min for ``127.0.0.1:1``). Resolved as Ray resolves it (a loopback host
    becomes the node's IP).

    Raises:
        ConnectionError: the TCP connect failed.
        ValueError: ``address`` is not ``host:port``.
    """
    from ray._private.services import canonicalize_bootstrap_address  # heavy: ray

    resolved = canonicalize_bootstrap_address(address)
    if resolved is None:  # only for "local"/None, which never get here
        return
    host, _, port = resolved.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_JOIN_PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConnectionError(f"nothing answers at the Ray GCS address {resolved} ({exc})") from exc


__all__ = ["PROJECT_PACKAGES", "job_runtime_env", "probe_gcs", "recorded_cluster", "recorded_cluster_addresses",
           "ship_user_modules", "user_py_modules"]
